# What the paused state costs at T=1, batch 1: vanilla vs calibrated auto (paused ~100% at T=1) vs the same with
# probes off (probe_every = max_probe_every = 10**9), alternating, 8 MT-bench first turns outside the matrix.
import sys, collections, statistics, time, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.spec.speculative import DraftOptions
torch.set_num_threads(2)
t = load_target()
T = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=T)
def auto(probes=True):
    p = build_calibrated_proposer(t, DraftOptions())
    if not probes:
        d = p.dispatcher; d.probe_every = d.max_probe_every = d._probe_wait = 10**9
    return p
engs = {"vanilla": Engine(t, None, max_batch_size=1), "auto": Engine(t, auto(), max_batch_size=1),
        "auto-noprobe": Engine(t, auto(False), max_batch_size=1)}
res = collections.defaultdict(list)
with torch.inference_mode():
    for e in engs.values(): e.generate(reqs[:1])
    for rep in range(4):
        for k, e in (list(engs.items()) if rep % 2 == 0 else list(engs.items())[::-1]):
            t0 = time.perf_counter(); o = e.generate(reqs); dt = time.perf_counter() - t0
            res[k].append(sum(len(x.token_ids) for x in o) / dt)
            if k != "vanilla":
                c = collections.Counter()
                for x in o:
                    for a, b in (x.stats.tree_rounds or {}).items(): c[a] += b
                if rep == 0: print(k, dict(c))
v = res["vanilla"]
for k, r in res.items():
    print(f"{k:14s} {statistics.median(r):.1f} tok/s; / vanilla per rep " + " ".join(f"{a / b:.3f}" for a, b in zip(r, v)))
