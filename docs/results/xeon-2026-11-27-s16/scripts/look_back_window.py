# A look-back probe without the catch-up, tried and NOT kept (docs/DISPATCH.md, "Look-back probes"): the head
# over each row's latest 49 recorded pairs on a scratch cache (window(), below) against the proposer's own
# look-back, which catches the draft cache up over the prompt and every recorded pair first. The shipped head held
# paused over MT-bench first turns (outside the matrix's), greedy, batch 1; after 16, 48 and 112 steps of each
# request both score the latest 32 pairs (the window first: it leaves the state as it was).
# Usage: look_back_window.py [N_PROMPTS]
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests
from eaglespec.engine.generate import Engine
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
from eaglespec.spec.proposer import LOOK_BACK
from eaglespec.spec.strategies import NoDraft, TreeDispatcher

WARM = 16  # pairs before the scored ones, as the window's only context


def window(p, rows, ids):
    """The windowed look-back: hits and tries per row to p.dispatcher.observe_look_back."""
    p._flush_lag_run()
    B, T = rows.numel(), p._lag_bound
    W = min(T, LOOK_BACK + 1 + WARM)
    n = p._lag_n[rows]
    j = (n - W).clamp(min=0)[:, None] + torch.arange(W)[None, :]
    here = j < n[:, None]
    j = torch.minimum(j, (n - 1).clamp(min=0)[:, None])
    feats, toks = p._lag_feat[rows[:, None], j], p._lag_tok[rows[:, None], j]
    positions = (p.cache.lengths[rows] + p._prompt_n[rows])[:, None] + j
    o = p.head(p.head.fuse(feats, prefill=True), toks, positions, p.head.new_cache(B, W), prefill=True)
    guess = p.head.to_target_ids(p.head.logits(o[:, :-1]).argmax(dim=-1))
    scored = here[:, 1:] & (j[:, :-1] >= (n - 1 - LOOK_BACK)[:, None])
    p.dispatcher.observe_look_back(ids, ((guess == toks[:, 1:]) & scored).sum(dim=1).tolist(),
                                   scored.sum(dim=1).tolist())


torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, int(sys.argv[1]) if len(sys.argv) > 1 else 8, first=5, temperature=0.0)
p = build_proposer(t, DraftOptions(tree="none"))
p.dispatcher = TreeDispatcher({1: NoDraft()})
counts = {}


class Seen:
    def __init__(self, key):
        self.key = key

    def observe_look_back(self, rows, hits, tries):
        h, n = counts.get(self.key, (0, 0))
        counts[self.key] = (h + sum(hits), n + sum(tries))


with torch.inference_mode():
    for r in reqs:
        e = Engine(t, p, max_batch_size=1)
        e.submit(0, r)
        steps = 0
        while not e.idle:
            e.step()
            steps += 1
            if steps in (17, 49, 113) and e.active:
                rows, ids = torch.tensor([0]), [0]
                real = p.dispatcher
                p.dispatcher = Seen(("window", steps - 1))
                window(p, rows, ids)
                p.dispatcher = Seen(("catch-up", steps - 1))
                p._catch_up(rows, ids, look_back=True)
                p.dispatcher = real
for k in sorted(counts):
    h, n = counts[k]
    print(f"{k[0]:9s} after {k[1]:3d} steps: {h:4d} / {n:4d} = {h / max(n, 1):.3f}")
