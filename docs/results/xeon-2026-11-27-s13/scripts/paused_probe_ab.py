# What the paused state costs at T=1, batch 1: vanilla vs calibrated auto (paused ~100% at T=1) vs the same with
# probes off (probe_every = max_probe_every = 10**9), alternating, 8 MT-bench first turns outside the matrix.
# Each arm is an Engine of its own: read with engine_placebo.py's spread in mind. Usage: paused_probe_ab.py T
import sys, collections, torch
from engine_placebo import alternate, mt_bench_requests, report
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


def rounds_seen(k, rep, outs):  # the trees of the first round
    if k != "vanilla" and rep == 0:
        c = collections.Counter()
        for x in outs:
            c.update(x.stats.tree_rounds or {})
        print(k, dict(c))


engs = {"vanilla": Engine(t, None, max_batch_size=1), "auto": Engine(t, auto(), max_batch_size=1),
        "auto-noprobe": Engine(t, auto(False), max_batch_size=1)}
with torch.inference_mode():
    for e in engs.values(): e.generate(reqs[:1])
    report(alternate(engs, reqs, 4, rounds_seen), "vanilla")
