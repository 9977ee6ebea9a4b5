# Where a paused step's time goes: perf_counter wrappers around the proposer's and the engine's parts, calibrated
# `--tree auto` at T=1, batch 1 (paused most steps), 8 MT-bench first turns. Usage: paused_parts.py
import sys, time, collections, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s15" / "scripts"))  # timers.py
from common import mt_bench_requests
from timers import acc, cnt, wrap
from steps import time_decode_forwards
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.spec.speculative import DraftOptions
torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=1.0)
p = build_calibrated_proposer(t, DraftOptions(tree="auto"))
wrap(p, "propose", "propose"); wrap(p, "commit", "commit"); wrap(p, "_record_paused", "record"); wrap(p, "_catch_up", "catch_up")
wrap(p.dispatcher, "pick", "pick"); wrap(p.dispatcher, "observe", "observe")
import eaglespec.spec.tree as TR; wrap(TR.DraftTree, "root_only", "root_only")
e = Engine(t, p, max_batch_size=1)
wrap(e, "_step", "step"); wrap(e, "_verify", "verify")
time_decode_forwards(t.model)
with torch.inference_mode():
    e.generate(reqs[:1]); acc.clear(); cnt.clear()
    for r in reqs: e.generate([r])
for k in acc: print(f"{k:10s} {cnt[k]:5d} calls {acc[k]/cnt[k]*1e6:8.1f} us/call")
