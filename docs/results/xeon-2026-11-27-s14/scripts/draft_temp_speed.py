# T=1, batch 1: vanilla, a chain of 1 with top-1 children (dtemp 0), a chain of 1 and `--tree auto` under the default
# (children drawn at the request's temperature); every engine on each request back to back, the order rotating.
# Usage: draft_temp_speed.py ROUNDS
import sys, time, statistics, collections, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
from eaglespec.spec.speculative import DraftOptions, build_proposer
torch.set_num_threads(2)
t = load_target()
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=1.0)
from eaglespec.engine.calibrate import build_calibrated_proposer
engs = {"vanilla": Engine(t, None, max_batch_size=1),
        "chain1-topk": Engine(t, build_proposer(t, DraftOptions(tree="chain", depth=1, draft_temperature=0.0)), max_batch_size=1),
        "chain1-request": Engine(t, build_proposer(t, DraftOptions(tree="chain", depth=1)), max_batch_size=1),
        "auto-request": Engine(t, build_calibrated_proposer(t, DraftOptions(tree="auto")), max_batch_size=1)}
res = collections.defaultdict(list); parts = collections.defaultdict(lambda: [0.0, 0.0, 0, 0])
names = list(engs)
with torch.inference_mode():
    for e in engs.values(): e.generate(reqs[:2])
    for rep in range(reps):
        for i, r in enumerate(reqs):
            j = rep * len(reqs) + i
            for k in names[j % len(names):] + names[:j % len(names)]:
                t0 = time.perf_counter(); o = engs[k].generate([r]); dt = time.perf_counter() - t0
                res[k].append(len(o[0].token_ids) / dt)
                st = o[0].stats; p = parts[k]; p[0] += st.draft_s; p[1] += st.verify_s; p[2] += st.target_forwards; p[3] += len(o[0].token_ids)
for k in names:
    p = parts[k]
    r = [b / a for a, b in zip(res["vanilla"], res[k])]
    print(f"{k:15s} {statistics.median(res[k]):.1f} tok/s  /vanilla median {statistics.median(r):.3f} mean {statistics.mean(r):.3f}  tok/step {p[3]/p[2]:.3f} draft {1e3*p[0]/p[2]:.2f} ms/step verify {1e3*p[1]/p[2]:.2f} ms/step")
