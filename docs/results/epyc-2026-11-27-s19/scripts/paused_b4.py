# Batch B: vanilla vs tree "none" (paused throughout, head kept ready) on the same requests, alternating per
# group of B, in one process; wall time per engine and a cProfile of the "none" engine's steps (largest
# cumulative functions). Usage: paused_b4.py B REPS [T]
import cProfile, pstats, sys, time, collections, torch
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import mt_bench_requests, proposer
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
torch.set_num_threads(2)
B, REPS = int(sys.argv[1]), int(sys.argv[2]); T = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 12, first=3, temperature=T)
engs = {"van": Engine(t, None, max_batch_size=B), "none": Engine(t, proposer(t, "none"), max_batch_size=B)}
wall = collections.defaultdict(float)
groups = [reqs[i:i + B] for i in range(0, len(reqs), B)]
with torch.inference_mode():
    for e in engs.values(): e.generate(groups[0])
    for rep in range(REPS):
        for g in groups:
            for name in (("van", "none") if rep % 2 == 0 else ("none", "van")):
                a = time.perf_counter(); engs[name].generate(g); wall[name] += time.perf_counter() - a
    print({k: round(v, 3) for k, v in wall.items()}, "none/van", round(wall["none"] / wall["van"], 4))
    for name in ("van", "none"):
        pr = cProfile.Profile(); pr.enable()
        for g in groups: engs[name].generate(g)
        pr.disable()
        print("==", name); pstats.Stats(pr).sort_stats("tottime").print_stats(18)
