# A/B in one process, alternating per request: vanilla against the calibrated `--tree auto` proposer at T=1
# (paused in most steps), 10 MT-bench first turns outside the matrix, twice. Usage: paused_ab.py
# A/B in one process: vanilla engine vs an auto proposer (T=1: paused most steps), alternating per request
import sys, time, collections, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.spec.speculative import DraftOptions
torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 10, first=3, temperature=1.0)
p = build_calibrated_proposer(t, DraftOptions(tree="auto"))
ev, ep = Engine(t, None, max_batch_size=1), Engine(t, p, max_batch_size=1)
T = collections.defaultdict(float); N = collections.Counter(); labels = collections.Counter()
with torch.inference_mode():
    ev.generate(reqs[:1]); ep.generate(reqs[:1])
    for rep in range(2):
        for r in reqs:
            for name, e in (("vanilla", ev), ("auto", ep)):
                c = e.generate([r])[0]
                T[name] += c.stats.wall_s - c.stats.prefill_s; N[name] += c.stats.new_tokens
                if name == "auto": labels.update(c.stats.tree_rounds)
for k in T: print(k, f"{N[k]/T[k]:.1f} tok/s")
print("auto/vanilla", (N["auto"]/T["auto"])/(N["vanilla"]/T["vanilla"]), labels)
