# Batch B at temperature T, two decoding kinds on the same requests (12 MT-bench first turns, 128 tokens),
# alternating per group of B in one process: wall time per kind and a cProfile of each (paused_b4_t0.txt,
# paused_b1_t1.txt: "van,none"; auto_vs_none_b1_t1.txt: "none,auto"). Kinds: van (vanilla), none (tree none:
# paused throughout, the head kept ready), auto (the calibrated dispatcher).
# Usage: paused_b4.py B REPS [T [KIND_A,KIND_B]]   (default T=0, van,none)
import cProfile, pstats, sys, time, collections, torch
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import mt_bench_requests, proposer
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions
torch.set_num_threads(2)
B, REPS = int(sys.argv[1]), int(sys.argv[2]); T = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
a, b = (sys.argv[4] if len(sys.argv) > 4 else "van,none").split(",")
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 12, first=3, temperature=T)
make = {"van": lambda: None, "none": lambda: proposer(t, "none"),
        "auto": lambda: build_calibrated_proposer(t, DraftOptions(tree="auto"))}
engs = {k: Engine(t, make[k](), max_batch_size=B) for k in (a, b)}
wall = collections.defaultdict(float)
groups = [reqs[i:i + B] for i in range(0, len(reqs), B)]
with torch.inference_mode():
    for e in engs.values(): e.generate(groups[0])
    for rep in range(REPS):
        for g in groups:
            for name in ((a, b) if rep % 2 == 0 else (b, a)):
                t0 = time.perf_counter(); engs[name].generate(g); wall[name] += time.perf_counter() - t0
    print({k: round(v, 3) for k, v in wall.items()}, f"{b}/{a}", round(wall[b] / wall[a], 4))
    for name in (a, b):
        pr = cProfile.Profile(); pr.enable()
        for g in groups: engs[name].generate(g)
        pr.disable()
        print("==", name); pstats.Stats(pr).sort_stats("tottime").print_stats(18)
