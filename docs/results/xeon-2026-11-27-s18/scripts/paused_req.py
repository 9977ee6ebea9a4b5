# whole requests: vanilla vs tree "none" (paused, head kept ready), T from argv: time in _prefill, in _step,
# in _retire and the rest, summed over requests, alternating per request in one process (3 reps).
# Usage: paused_req.py 1.0 (the temperature)
import sys, time, collections, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests, proposer
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
torch.set_num_threads(2)
t = load_target()
T = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
reqs = mt_bench_requests(t.tokenizer, 12, first=3, temperature=T)
engs = {"van": Engine(t, None, max_batch_size=1), "none": Engine(t, proposer(t, "none"), max_batch_size=1)}
acc = collections.defaultdict(float)
for name, e in engs.items():
    for meth in ("_prefill", "_step", "_retire"):
        f = getattr(e, meth)
        def w(*a, f=f, key=(name, meth), **k):
            t0 = time.perf_counter(); r = f(*a, **k); acc[key] += time.perf_counter() - t0; return r
        setattr(e, meth, w)
with torch.inference_mode():
    for e in engs.values(): e.generate(reqs[:1])
    acc.clear()
    for rep in range(3):
        for r in reqs:
            for name in (("van", "none") if rep % 2 == 0 else ("none", "van")):
                a = time.perf_counter(); engs[name].generate([r]); acc[(name, "wall")] += time.perf_counter() - a
for name in engs:
    parts = {m: acc[(name, m)] for m in ("_prefill", "_step", "_retire")}
    print(name, {k: round(v, 3) for k, v in parts.items()}, "rest", round(acc[(name, "wall")] - sum(parts.values()), 3),
          "wall", round(acc[(name, "wall")], 3))
