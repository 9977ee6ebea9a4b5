"""In-process A/B runs of decoding arms (engines that differ in one thing) over the same requests, for the
comparison scripts under docs/results/: a shared machine drifts by several percent within minutes, so arms are
compared in one process, group by group, their order rotating per group so that no arm always runs first.

Protocol (``rotate_arms``): ``passes`` passes over the requests in groups of ``batch``; in pass p, group g, the arms
run starting at arm (7 p + g) mod len(arms); the first group of the first pass is a warm-up (its outputs kept,
its times not). Per arm: wall seconds around each ``generate`` (prompts included), decode seconds (the longest
row's draft + verify seconds of each group), tokens, the rounds per tree, and every request's token ids.
"""

from __future__ import annotations

import ast
import collections
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.spec.speculative import DraftOptions, build_proposer

__all__ = ["ArmTotals", "arm_engine", "first_turn_requests", "rotate_arms"]


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


def arm_engine(target, spec: str, batch: int) -> Engine:
    """The comparison scripts' arms by name, each an engine of its own over ``target`` for batches of ``batch``:
    ``vanilla`` (no drafting), ``chain<D>`` (a fixed chain of D tokens), ``auto`` (the acceptance-aware dispatcher
    over this machine's calibration, as ``--tree auto`` builds it) or ``auto:ATTR=VALUE,...`` (the same with
    dispatcher attributes set after construction, each VALUE a Python literal, e.g.
    ``auto:margin=1.05,spread_probes=False``; ATTR.ATTR reaches into one of its attributes, e.g.
    ``auto:feedback.peers=False``). Anything else is refused by name: an unknown arm, an attribute the
    dispatcher does not have, a value that is not a literal."""
    kind, _, settings = spec.partition(":")
    chain = re.fullmatch(r"chain([1-9][0-9]*)", kind)
    if kind not in ("vanilla", "auto") and not chain or settings and kind != "auto":
        raise ValueError(f"unknown arm {spec!r}: expected vanilla, chain<D> or auto[:ATTR=VALUE,...]")
    if kind == "vanilla":
        return Engine(target, None, max_batch_size=batch)
    if chain:
        return Engine(target, build_proposer(target, DraftOptions(tree="chain", depth=int(chain[1]))),
                      max_batch_size=batch)
    proposer = build_calibrated_proposer(target, DraftOptions())
    for item in filter(None, settings.split(",")):
        name, eq, text = item.partition("=")
        *path, attr = name.split(".")
        owner = proposer.dispatcher
        for part in path:
            owner = getattr(owner, part, None)
        if not eq or owner is None or not hasattr(owner, attr):
            raise ValueError(f"arm {spec!r}: {item!r} is not ATTR=VALUE for an attribute of "
                             f"{type(proposer.dispatcher).__name__} (or of one of its attributes: ATTR.ATTR)")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError) as e:
            raise ValueError(f"arm {spec!r}: the value of {name} ({text!r}) is not a Python literal") from e
        setattr(owner, attr, value)
    return Engine(target, proposer, max_batch_size=batch)


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
