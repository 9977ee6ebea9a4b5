# T=1 requests: chain drafts proposed greedily (top-1) vs sampled from the draft at the request's temperature:
# depth-wise acceptance and tokens per step, 8 MT-bench first turns outside the matrix, batch 1.
import sys, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
from eaglespec.spec.speculative import DraftOptions, build_proposer
torch.set_num_threads(2)
t = load_target()
T = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=T)
with torch.inference_mode():
    for depth in (1, 3):
        for dt in (0.0, T):
            e = Engine(t, build_proposer(t, DraftOptions(tree="chain", depth=depth, draft_temperature=dt, seed=0)), max_batch_size=1)
            o = e.generate(reqs)
            steps = sum(x.stats.target_forwards for x in o); toks = sum(len(x.token_ids) for x in o)
            acc = [sum(x.stats.accepted_per_position[i] if i < len(x.stats.accepted_per_position) else 0 for x in o) for i in range(depth)]
            print(f"chain{depth} draft_T={dt}: tokens/step {toks/steps:.3f} accepted at depth {[round(a/steps,3) for a in acc]}", flush=True)
