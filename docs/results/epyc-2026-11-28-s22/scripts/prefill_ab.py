# Prefill of a long prompt (Alpaca training texts joined, ~L tokens) at batch B: vanilla against `--tree auto`
# (head attached), alternating, 2 new tokens each; median prefill_s and wall.
import json, statistics, sys, time, torch
from eaglespec.config import GenerationConfig
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions
allocator.tune(); torch.set_num_threads(2)
path, L, B = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print("cpu:", cpu_kernels.cpuinfo("model name"), "prompt", L, "batch", B)
t = load_target()
text = " ".join(d["instruction"] + " " + d.get("output", "") for d in json.load(open(path))[:400])
ids = t.tokenizer.encode(text)
reqs = [Request(ids[i * 50:i * 50 + L], GenerationConfig(2, ignore_eos=True)) for i in range(B)]
engs = {"vanilla": Engine(t, None, max_batch_size=B), "auto": Engine(t, build_calibrated_proposer(t, DraftOptions(tree="auto")), max_batch_size=B)}
res = {k: ([], []) for k in engs}
with torch.inference_mode():
    for e in engs.values(): e.generate(reqs)
    for rep in range(6):
        for k in (list(engs) if rep % 2 == 0 else list(engs)[::-1]):
            a = time.perf_counter(); out = engs[k].generate(reqs); w = time.perf_counter() - a
            res[k][0].append(max(o.stats.prefill_s for o in out)); res[k][1].append(w)
for k, (p, w) in res.items():
    print(f"{k:8s} prefill {statistics.median(p) * 1e3:8.1f} ms  wall {statistics.median(w) * 1e3:8.1f} ms")
