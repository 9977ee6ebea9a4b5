# cProfile of vanilla and of tree "none" (paused throughout, the head kept ready) over 6 MT-bench first turns at
# temperature argv[1], batch 1: the functions whose cumulative time grows most in the paused engine. Usage: paused_prof.py 1.0
import sys, cProfile, pstats, io, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests, proposer
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 6, first=3, temperature=float(sys.argv[1]))
res = {}
for name, p in (("van", None), ("none", proposer(t, "none"))):
    e = Engine(t, p, max_batch_size=1)
    with torch.inference_mode():
        e.generate(reqs[:1])
        pr = cProfile.Profile(); pr.enable(); e.generate(reqs); pr.disable()
    st = pstats.Stats(pr)
    res[name] = {f"{k[0].split('/')[-1]}:{k[1]}({k[2]})": (v[0], v[2]) for k, v in st.stats.items()}
keys = set(res["van"]) | set(res["none"])
diff = sorted(keys, key=lambda k: -(res["none"].get(k, (0, 0))[1] - res["van"].get(k, (0, 0))[1]))
for k in diff[:25]:
    a, b = res["van"].get(k, (0, 0)), res["none"].get(k, (0, 0))
    print(f"{k:70s} van {a[0]:6d} {a[1]*1e3:8.2f} ms   none {b[0]:6d} {b[1]*1e3:8.2f} ms")
