# Two (three) identical vanilla engines in one process, alternating: does an engine instance alone change speed?
import sys, collections, statistics, time, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
torch.set_num_threads(2)
t = load_target()
T = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=T)
engs = {k: Engine(t, None, max_batch_size=1) for k in ("A", "B", "C")}
res = collections.defaultdict(list)
with torch.inference_mode():
    for e in engs.values(): e.generate(reqs[:1])
    for rep in range(4):
        for k, e in (list(engs.items()) if rep % 2 == 0 else list(engs.items())[::-1]):
            t0 = time.perf_counter(); o = e.generate(reqs); dt = time.perf_counter() - t0
            res[k].append(sum(len(x.token_ids) for x in o) / dt)
for k, r in res.items():
    print(f"{k} {statistics.median(r):.1f} tok/s; / A per rep " + " ".join(f"{a / b:.3f}" for a, b in zip(r, res['A'])))
