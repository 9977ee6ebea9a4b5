"""In-process A/B runs of decoding arms (engines that differ in one thing) over the same requests, for the
comparison scripts under docs/results/: a shared machine drifts by several percent within minutes, so arms are
compared in one process, group by group, their order rotating per group so that no arm always runs first.

Protocol (``rotate_arms``): ``passes`` passes over the requests in groups of ``batch``; in pass p, group g, the arms
run starting at arm (7 p + g) mod len(arms); the first group of the first pass is a warm-up (its outputs kept,
its times not). Per arm: wall seconds around each ``generate`` (prompts included), decode seconds (the longest
row's draft + verify seconds of each group), tokens, the rounds per tree, and every request's token ids.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.generate import Request

__all__ = ["ArmTotals", "first_turn_requests", "rotate_arms"]


@dataclass
class ArmTotals:
    wall_s: float = 0.0
    decode_s: float = 0.0
    tokens: int = 0
    rounds: collections.Counter = field(default_factory=collections.Counter)
    outputs: dict[int, list[int]] = field(default_factory=dict)  # request index -> token ids


def first_turn_requests(tokenizer, path: str, per_category: int, temperature: float,
                        max_new_tokens: int = 128) -> list[Request]:
    """The comparison scripts' requests: the first turn of the first ``per_category`` questions of each category of
    the dataset file ``path``, through the tokenizer's chat template; request i samples with seed i at
    ``temperature`` and decodes exactly ``max_new_tokens`` tokens (EOS ignored), so every arm decodes as many."""
    if per_category < 1:
        raise ValueError(f"per_category must be >= 1, got {per_category}")
    questions = load_questions(path, per_category=per_category)
    config = lambda i: GenerationConfig(max_new_tokens, SamplingParams(temperature=temperature, seed=i),  # noqa: E731
                                        ignore_eos=True)
    return [Request(encode_messages(tokenizer, [{"role": "user", "content": q.turns[0]}]), config(i))
            for i, q in enumerate(questions)]


def rotate_arms(arms: Mapping[str, object], requests: Sequence, batch: int, passes: int,
                before: Callable[[str], None] | None = None,
                after: Callable[[str], None] | None = None) -> dict[str, ArmTotals]:
    """Run every arm (name -> engine with ``generate(requests)``) over ``requests`` by the module's protocol;
    ``before(name)`` / ``after(name)`` run around each arm's group (e.g. to swap an implementation in, or check
    what the engine allocated)."""
    if batch < 1 or passes < 1 or not arms:
        raise ValueError(f"rotate_arms needs batch >= 1, passes >= 1 and an arm, got batch {batch}, passes {passes}, "
                         f"{len(arms)} arms")
    names = list(arms)
    totals = {name: ArmTotals() for name in names}
    for p in range(passes):
        for gi, g in enumerate(range(0, len(requests), batch)):
            group = requests[g:g + batch]
            k = (p * 7 + gi) % len(names)
            for name in names[k:] + names[:k]:
                if before is not None:
                    before(name)
                t0 = time.perf_counter()
                done = arms[name].generate(group)
                dt = time.perf_counter() - t0
                if after is not None:
                    after(name)
                t = totals[name]
                for i, c in enumerate(done):
                    t.outputs[g + i] = c.token_ids
                if p == 0 and gi == 0:
                    continue  # warm-up
                t.wall_s += dt
                t.decode_s += max(c.stats.draft_s + c.stats.verify_s for c in done)
                t.tokens += sum(len(c.token_ids) for c in done)
                for c in done:
                    t.rounds.update(c.stats.tree_rounds or {})
    return totals
