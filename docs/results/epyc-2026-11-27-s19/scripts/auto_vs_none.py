# Batch B at temperature T: tree "none" (paused throughout) vs --tree auto (calibrated), alternating per group of B, in
# one process; wall per engine and a cProfile (cumulative) of each. Usage: auto_vs_none.py B REPS [T]
import cProfile, pstats, sys, time, collections, torch
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import mt_bench_requests, proposer
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
torch.set_num_threads(2)
B, REPS = int(sys.argv[1]), int(sys.argv[2]); T = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 12, first=3, temperature=T)
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.spec.speculative import DraftOptions
engs = {"none": Engine(t, proposer(t, "none"), max_batch_size=B), "auto": Engine(t, build_calibrated_proposer(t, DraftOptions(tree="auto")), max_batch_size=B)}
wall = collections.defaultdict(float)
groups = [reqs[i:i + B] for i in range(0, len(reqs), B)]
with torch.inference_mode():
    for e in engs.values(): e.generate(groups[0])
    for rep in range(REPS):
        for g in groups:
            for name in (("none", "auto") if rep % 2 == 0 else ("auto", "none")):
                a = time.perf_counter(); engs[name].generate(g); wall[name] += time.perf_counter() - a
    print({k: round(v, 3) for k, v in wall.items()}, "auto/none", round(wall["auto"] / wall["none"], 4))
    for name in ("none", "auto"):
        pr = cProfile.Profile(); pr.enable()
        for g in groups: engs[name].generate(g)
        pr.disable()
        print("==", name); pstats.Stats(pr).sort_stats("cumtime").print_stats(45)
