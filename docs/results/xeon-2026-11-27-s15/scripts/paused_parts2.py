# time the paused proposer's pieces with perf_counter wrappers (calibrated auto at T=1 b1: paused most steps)
import sys, time, collections, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.spec.speculative import DraftOptions
import eaglespec.spec.proposer as P
torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=1.0)
p = build_calibrated_proposer(t, DraftOptions(tree="auto"))
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from timers import acc, cnt, wrap
wrap(p, "propose", "propose"); wrap(p, "commit", "commit"); wrap(p, "_record_paused", "record")
wrap(p.dispatcher, "pick", "pick"); wrap(p.dispatcher, "observe", "observe")
e = Engine(t, p, max_batch_size=1)
with torch.inference_mode():
    e.generate(reqs[:1]); acc.clear(); cnt.clear()
    for r in reqs: e.generate([r])
for k in acc: print(f"{k:8s} {cnt[k]:5d} calls {acc[k]/cnt[k]*1e6:8.1f} us/call")
