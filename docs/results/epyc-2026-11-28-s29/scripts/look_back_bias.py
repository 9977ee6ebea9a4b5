# The look-back over a window (eaglespec.spec.proposer.LOOK_BACK_WINDOW latest waiting pairs, committing nothing)
# against the look-back that first catches the draft cache up over the prompt and every recorded pair (before
# session 29): the head held paused (no drafting) over first turns, greedy, batch 1; after 16, 48 and 112 steps of
# each request a look-back scores the latest 32 pairs. Two passes over each request (plain decoding: the same
# tokens), one per kind, so that the window's later look-backs see no context a committing one left behind.
#   python look_back_bias.py QUESTIONS.jsonl PER_CATEGORY [TEMPERATURE]
# (stepping and probing as session 16's look_back_window.py does, so that the two compare)
import sys
from types import SimpleNamespace

import torch
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
from eaglespec.spec.strategies import NoDraft, TreeDispatcher

allocator.tune(); torch.set_num_threads(2)
path, per_cat = sys.argv[1], int(sys.argv[2])
temp = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
t = load_target(None)
qs = load_questions(path, per_category=per_cat)
reqs = [Request(encode_messages(t.tokenizer, [{"role": "user", "content": q.turns[0]}]),
                GenerationConfig(128, SamplingParams(temperature=temp, seed=i), ignore_eos=True)) for i, q in enumerate(qs)]
counts = {}  # (kind, step) -> (summed chances, tries)


def recorder(key):
    """A stand-in dispatcher that adds up what one look-back observed."""
    def seen(rows, hits, tries):
        h, n = counts.get(key, (0.0, 0))
        counts[key] = (h + sum(hits), n + sum(tries))
    return SimpleNamespace(observe_look_back=seen, observe_catch_up=lambda pairs, seconds: None)


with torch.inference_mode():
    for r in reqs:
        for kind in ("window", "catch-up"):
            p = build_proposer(t, DraftOptions(tree="none"))
            p.dispatcher = TreeDispatcher({1: NoDraft()})
            e = Engine(t, p, max_batch_size=1)
            e.submit(0, r)
            steps = 0
            while not e.idle:
                e.step()
                steps += 1
                if steps in (17, 49, 113) and e.active:
                    rows, ids, real = torch.tensor([0]), [0], p.dispatcher
                    p.dispatcher = recorder((kind, steps - 1))
                    (p._look_back_window if kind == "window" else
                     lambda rows, ids: p._catch_up(rows, ids, look_back=True))(rows, ids)
                    p.dispatcher = real
print(f"{len(reqs)} prompts of {min(len(r.prompt_ids) for r in reqs)}-{max(len(r.prompt_ids) for r in reqs)} tokens, T={temp}")
for k in sorted(counts):
    h, n = counts[k]
    print(f"{k[0]:9s} after {k[1]:3d} steps: {h:7.1f} / {n:4d} = {h / max(n, 1):.3f}")
