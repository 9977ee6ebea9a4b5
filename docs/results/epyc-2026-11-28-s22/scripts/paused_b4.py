# Batch B, T: vanilla, `--tree auto` and a head held paused (tree none every step) alternating per group in one
# process on Alpaca prompts: wall (less prefill) per round over vanilla's; auto's rounds by tree.
import collections, json, sys, time, torch
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions
from eaglespec.spec.proposer import EagleProposer
from eaglespec.spec.strategies import NoDraft
allocator.tune(); torch.set_num_threads(2)
path, B, N, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
print("cpu:", cpu_kernels.cpuinfo("model name"), "batch", B, "T", T)
t = load_target()
data = json.load(open(path))[N:2 * N]  # not the prompts of real_ratio.py
reqs = [Request(encode_messages(t.tokenizer, [{"role": "user", "content": (d["instruction"] + "\n" + d.get("input", "")).strip()}]),
                GenerationConfig(128, SamplingParams(temperature=T, seed=i), ignore_eos=True)) for i, d in enumerate(data)]
groups = [reqs[i:i + B] for i in range(0, len(reqs), B)]
auto = build_calibrated_proposer(t, DraftOptions(tree="auto"))
engs = {"vanilla": Engine(t, None, max_batch_size=B), "auto": Engine(t, auto, max_batch_size=B),
        "paused": Engine(t, EagleProposer(auto.head, NoDraft()), max_batch_size=B)}
acc = {k: [0.0, 0] for k in engs}
rounds = collections.Counter()
with torch.inference_mode():
    for e in engs.values(): e.generate(groups[0])
    for i, g in enumerate(groups):
        names = list(engs)
        names = names[i % 3:] + names[:i % 3]
        for k in names:
            a = time.perf_counter(); out = engs[k].generate(g); w = time.perf_counter() - a
            acc[k][0] += w - max(o.stats.prefill_s for o in out); acc[k][1] += max(o.stats.target_forwards for o in out)
            if k == "auto":
                for o in out: rounds.update(o.stats.tree_rounds)
per = {k: v[0] / v[1] for k, v in acc.items()}
print(" ".join(f"{k} {per[k] * 1e3:.2f} ms ({per[k] / per['vanilla']:.3f})" for k in engs), dict(rounds))
