# vanilla, a head held paused (tree none: records pairs, never drafts) and calibrated --tree auto on one target,
# every engine on each request back to back (the order rotating): tokens/s, per-request ratios and per-step phase
# times (draft+commit, forward+verify) from the engine's own stats. Usage: paused_parts.py T ROUNDS
import sys, time, statistics, collections, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
from eaglespec.spec.speculative import DraftOptions, build_proposer
torch.set_num_threads(2)
T = float(sys.argv[1]); reps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=T)
from eaglespec.engine.calibrate import build_calibrated_proposer
engs = {"vanilla": Engine(t, None, max_batch_size=1), "auto": Engine(t, build_calibrated_proposer(t, DraftOptions(tree="auto")), max_batch_size=1),
        "paused": Engine(t, build_proposer(t, DraftOptions(tree="none")), max_batch_size=1)}
res = collections.defaultdict(list); parts = collections.defaultdict(lambda: [0.0, 0.0, 0])
with torch.inference_mode():
    for e in engs.values(): e.generate(reqs[:2])
    names = list(engs)
    for rep in range(reps):
        for i, r in enumerate(reqs):  # every engine on each request back to back, the order rotating
            j = rep * len(reqs) + i
            for k in names[j % len(names):] + names[:j % len(names)]:
                e = engs[k]
                t0 = time.perf_counter(); o = e.generate([r]); dt = time.perf_counter() - t0
                res[k].append(len(o[0].token_ids) / dt)
                st = o[0].stats; p = parts[k]; p[0] += st.draft_s; p[1] += st.verify_s; p[2] += st.target_forwards
for k in engs:
    p = parts[k]
    print(f"{k:8s} {statistics.median(res[k]):.1f} tok/s  draft+commit {1e3*p[0]/p[2]:.3f} ms/step  fwd+verify {1e3*p[1]/p[2]:.3f} ms/step")
for n in ("paused", "auto"):
    r = [b / a for a, b in zip(res["vanilla"], res[n])]
    print(n, "/vanilla per request: median %.3f mean %.3f" % (statistics.median(r), statistics.mean(r)))
