# Batch B, temperature T: the torch profiler's op totals over whole generate() calls of vanilla and of `--tree auto`
# (paused at batch 4), same Alpaca prompts, after a warm-up: where a paused round's extra time goes.
import json, sys, time, torch
from torch.profiler import profile, ProfilerActivity
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions
allocator.tune(); torch.set_num_threads(2)
path, B, T = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
t = load_target()
data = json.load(open(path))[40:40 + 2 * B]
reqs = [Request(encode_messages(t.tokenizer, [{"role": "user", "content": d["instruction"]}]),
                GenerationConfig(128, SamplingParams(temperature=T, seed=i), ignore_eos=True)) for i, d in enumerate(data)]
engs = {"vanilla": Engine(t, None, max_batch_size=B), "auto": Engine(t, build_calibrated_proposer(t, DraftOptions(tree="auto")), max_batch_size=B)}
tables = {}
with torch.inference_mode():
    for k, e in engs.items():
        e.generate(reqs[:B])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            a = time.perf_counter(); out = e.generate(reqs[B:]); w = time.perf_counter() - a
        rounds = {}
        for o in out:
            for x, n in o.stats.tree_rounds.items(): rounds[x] = rounds.get(x, 0) + n
        print(k, f"wall {w:.3f} s, prefill {max(o.stats.prefill_s for o in out):.3f}", rounds)
        tables[k] = {ev.key: (ev.self_cpu_time_total, ev.count) for ev in prof.key_averages()}
keys = set(tables["vanilla"]) | set(tables["auto"])
diff = sorted(keys, key=lambda k: -(tables["auto"].get(k, (0, 0))[0] - tables["vanilla"].get(k, (0, 0))[0]))
print("op: auto - vanilla self ms (calls auto / vanilla)")
for k in diff[:15]:
    a, v = tables["auto"].get(k, (0, 0)), tables["vanilla"].get(k, (0, 0))
    print(f"  {k[:60]:60s} {(a[0] - v[0]) / 1e3:8.2f} ms  ({a[1]} / {v[1]})")
print("total self ms auto %.1f vanilla %.1f" % (sum(x[0] for x in tables["auto"].values()) / 1e3, sum(x[0] for x in tables["vanilla"].values()) / 1e3))
