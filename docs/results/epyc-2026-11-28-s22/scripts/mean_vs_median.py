# Chain of 1 vs plain at batch B, T=0: paired steps (150-token prompt, 128 steps): ratio of medians, median of
# ratios, ratio of means; and whole generate() calls alternating (wall less prefill per forward).
import statistics, sys, time, torch
from eaglespec.config import GenerationConfig
from eaglespec.engine import calibrate as C
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
from eaglespec.spec.strategies import Chain
from eaglespec.spec.proposer import EagleProposer
allocator.tune(); torch.set_num_threads(2)
B = int(sys.argv[1]) if len(sys.argv) > 1 else 1
print("cpu:", cpu_kernels.cpuinfo("model name"), "batch", B)
t = load_target()
head = build_proposer(t, DraftOptions(tree="chain", depth=1)).head
prompt = list(range(5, 155))
with torch.inference_mode():
    for rep in range(3):
        tr, pl, _ = C._paired_steps(t, EagleProposer(head, Chain(1)), B, 128, prompt)
        print(f"paired: median ratio {statistics.median(a / b for a, b in zip(tr, pl)):.3f}  ratio of medians "
              f"{statistics.median(tr) / statistics.median(pl):.3f}  ratio of means {statistics.mean(tr) / statistics.mean(pl):.3f}"
              f"  max tree {max(tr)*1e3:.1f} plain {max(pl)*1e3:.1f} ms")
    engs = {"plain": Engine(t, None, max_batch_size=B), "chain1": Engine(t, EagleProposer(head, Chain(1)), max_batch_size=B)}
    reqs = [Request(prompt, GenerationConfig(128, ignore_eos=True)) for _ in range(B)]
    for e in engs.values(): e.generate(reqs)
    wall = {k: [] for k in engs}
    for rep in range(4):
        for k, e in (list(engs.items()) if rep % 2 == 0 else list(engs.items())[::-1]):
            a = time.perf_counter(); out = e.generate(reqs); w = time.perf_counter() - a
            s = out[0].stats
            wall[k].append((w - s.prefill_s) / s.target_forwards)
    print("generate: per forward plain %.2f ms chain1 %.2f ms ratio %.3f" % (1e3 * statistics.mean(wall["plain"]), 1e3 * statistics.mean(wall["chain1"]), statistics.mean(wall["chain1"]) / statistics.mean(wall["plain"])))
