# cProfile of decoding 4 MT-bench first turns (outside the matrix) with one proposer kind. Usage: spec_prof.py KIND [SORT] [ROWS]
import sys, time, cProfile, pstats, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests, proposer
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 4, first=3, temperature=0.0)
e = Engine(t, proposer(t, sys.argv[1] if len(sys.argv) > 1 else "chain1"), max_batch_size=1)
with torch.inference_mode():
    e.generate(reqs[:1])
    t0 = time.perf_counter()
    for r in reqs: o = e.generate([r])
    print("wall", time.perf_counter() - t0)
    pr = cProfile.Profile(); pr.enable()
    for r in reqs: o = e.generate([r])
    pr.disable()
st = pstats.Stats(pr); st.sort_stats(sys.argv[2] if len(sys.argv) > 2 else "tottime").print_stats(int(sys.argv[3]) if len(sys.argv) > 3 else 45)
