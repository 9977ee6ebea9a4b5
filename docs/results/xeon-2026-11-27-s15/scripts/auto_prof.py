# cProfile of the proposer side (proposer, dispatcher, cost model, engine) over 8 MT-bench turns. Usage: auto_prof.py KIND|auto [T]
import sys, time, cProfile, pstats, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.spec.speculative import DraftOptions, build_proposer
torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
kind = sys.argv[1]
p = build_calibrated_proposer(t, DraftOptions(tree="auto")) if kind == "auto" else build_proposer(t, DraftOptions(tree=kind))
e = Engine(t, p, max_batch_size=1)
with torch.inference_mode():
    e.generate(reqs[:1])
    pr = cProfile.Profile(); pr.enable()
    for r in reqs: o = e.generate([r])
    pr.disable()
st = pstats.Stats(pr); st.sort_stats("cumulative").print_stats("proposer|dispatch|costmodel|generate.py", 30)
