"""Calibration: the target's and the draft's costs on THIS machine, measured once and cached.

What a speculative step costs depends on the CPU (a 2-token float32 forward costs 1.07x a 1-token one on one
Xeon, 1.66x on one EPYC), the precision, the thread count and the batch size, so no table tuned elsewhere can
say which tree pays. ``calibrate`` measures, with warm-up:
  * verify(b, n): a target forward of n tokens per row at batch b over a fixed prefix, and over two longer
    ones in the same rounds: its cost per context token (every verified token attends to the whole context);
  * overhead(b): the engine's per-step work beyond the forward (verification, sampling, host read): the
    median plain engine step, each step timed on its own, less verify(b, 1); every step pays it;
  * draft(b, shape): what each candidate tree shape costs per step beyond its forward and the overhead, by
    running the engine with that shape on a fixed prompt (the real head, the real tree code) in turns with a
    plain engine: the median ratio of their steps times the priced plain step, less the tree's priced forward;
  * paused(b): what a paused step (the head kept ready) costs beyond a plain one.
The result (a ``costmodel.CostTable``) is cached as JSON under the cache directory, keyed by a fingerprint
of the machine (CPU model, cores, threads, torch version), the model, its precision and the head, and reused
until one of them changes. ``eaglespec calibrate`` runs it explicitly and prints the table.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from eaglespec.runtime.model import synchronize
from eaglespec.spec.costmodel import CostTable

log = logging.getLogger(__name__)

__all__ = ["CALIBRATION_VERSION", "adaptive_dispatcher", "build_calibrated_proposer", "calibrate", "calibration_for",
           "calibration_key", "cost_table_text", "load_or_calibrate"]

# 2: differential draft costs, engine overhead per step; 3: int4 models rank logits in int4; 4: engine overhead
# from the fastest of 3 runs; 5: overhead from the median decode step, a tree's cost at least its median step
# less forward and overhead, cheap forwards timed up to 7 times, the paused step's cost; 6: a longer chain's
# drafting never reads cheaper than a shorter chain's; 7: the paused step over at most 132 steps (a buffer of
# 256 pairs: the catch-up is paid when drafting resumes, not while paused); 8: eager norms in one kernel call
# (every eager cost moved); 9: a tree's drafting is the median of 3 readings taken in rounds over the trees;
# 10: verify costs per context token; the paused step counts only the catch-ups its run made; 11: a 1-token
# forward never priced above the median plain engine step (``cap_by_plain_steps``)
# 12: overhead and drafting measured again with sampling requests (T=1: children drawn at the request's temperature)
# 13: a tree's step priced by its ratio to plain steps timed right after it (on the same prompt)
# 14: nothing measured differently; chains (verification, drafting, commit) and paused steps (their record) cost
# less in the engine, so tables of version 13 price them too high
# 15: the same again (a batch-1 chain's commit and every forward's attention plan and rotary lookup are cheaper);
# a verify point above a larger forward's at all measured again; a tree's step floor from its steps and a plain
# engine's stepped in turns (the ratio of two runs' steps read the forwards' stalls as drafting); the overhead at
# most the plain steps less their own forwards
# 16: nothing measured differently; the commands raise glibc malloc's thresholds (runtime/allocator.py) and sampled
# steps draw and verify chains faster (eaglespec::sample_rows, verify's chain shortcut): steps of every kind cost
# less, sampled ones and batch 4 most
# 17: the paused step from a paused and a plain engine stepped in turns (the median of their step differences);
# sampled chains verify and draw their children in one kernel call each (verify_chain_sampled, draft_draw)
# 18: the forwards of a batch size (every n and prefix) timed in the same rounds; a tree's step priced at the median
# ratio of its steps to a plain engine's stepped in turns, times the priced plain step (no longer at least the head's
# own seconds beyond its priced forward)
# 19: nothing measured differently; a paused step's record, dispatch and timing cost less (batch-4 rows of unequal
# lags no longer write their slots each step: the proposer's median 186-191 -> 72-78 us on a 2-core EPYC) and every
# plain step's one-node tree shares its constant fields
# 20: nothing measured differently; every packed forward's layers run in one kernel call over raw rows
# (eaglespec::layer_steps): forwards 1.07-1.25x cheaper on a 2-core EPYC, so tables of version 19 price them too high
CALIBRATION_VERSION = 20
SAMPLED_T = 1.0  # the temperature the sampled costs are measured at (the cost of sampling hardly depends on it)
VERIFY_TOKENS = (1, 2, 4, 8, 16, 32)
BATCHES = (1, 2, 4, 8)
PREFIX = 128
LONG_PREFIXES = (320, 512)  # the context slope: a least-squares line through PREFIX and these
PAUSED_STEPS = 128  # a paused stretch as long as a typical request's generation
DRAFT_PROMPT = 16  # tokens of the fixed prompt the trees' steps are timed on (measure_draft)
TREE_BATCHES = (4,)  # batch sizes the trees' steps are timed at besides the smallest and the largest (measure_draft)


def _fingerprint() -> str:
    from eaglespec.runtime.quant import machine_fingerprint

    return machine_fingerprint()


def calibration_key(model_name: str, precision: str, head_id: str, batches: Sequence[int],
                    candidates: Mapping[str, object]) -> str:
    ident = json.dumps([CALIBRATION_VERSION, _fingerprint(), model_name, precision, head_id, list(batches),
                        sorted(candidates)], sort_keys=True)
    return hashlib.sha256(ident.encode()).hexdigest()[:20]


def _time_rounds(fns: Mapping, warmup: int = 1, rounds: int = 3, max_rounds: int = 7,
                 budget_s: float = 0.25) -> dict:
    """The fastest of each of ``fns``' timed calls (key -> seconds), the calls made in rounds: each round
    calls every function once, in order, so that a burst of load on a shared machine slows one reading of
    each, not all the readings of some. At least ``rounds`` rounds, more (up to ``max_rounds``) while they
    have taken under ``budget_s`` per function. Until calibration version 18 each forward was timed alone,
    up to 7 times in a row: on the drifting 2-core EPYC a burst over one forward's readings priced
    verify(1, 2) at 1.19x verify(1, 1) where they are 1.07-1.09x apart, and the chain of 1's step at 1.43
    plain steps where the engine ran it at 1.28-1.32."""
    fns = dict(fns)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    best = dict.fromkeys(fns, float("inf"))
    spent, n = 0.0, 0
    while fns and (n < rounds or (n < max_rounds and spent < budget_s * len(fns))):
        for key, fn in fns.items():
            t = time.perf_counter()
            fn()
            dt = time.perf_counter() - t
            best[key], spent = min(best[key], dt), spent + dt
        n += 1
    return best


def _room(model, tokens: Sequence[int]) -> int:
    """The longest prefix the model's context holds ahead of a forward of ``max(tokens)`` tokens."""
    return int(getattr(model.args, "max_position_embeddings", 0) or 0) - max(tokens) - 1


@torch.inference_mode()
def measure_forwards(model, batches: Sequence[int] | None = None, tokens: Sequence[int] | None = None,
                     prefixes: Sequence[int] | None = None, retries: int = 3) -> dict[int, dict[tuple[int, int], float]]:
    """prefix -> (b, n) -> seconds of a target forward of n tokens per row (logits at all of them) at batch b
    over ``prefix`` cached tokens: the quickest of 3-7 readings after a warm-up (``_time_rounds``), the
    forwards of one batch size, at every n and prefix, timed in the same rounds. Points of one prefix that
    cost more than a larger forward of it at all (``CostTable.stalled`` with factor 1: the machine stalled)
    are measured again, up to ``retries`` rounds. (Until calibration version 15 only those 1.2x above it
    were: on the 2-core Xeon a stall read verify(1, 2) between 1.0 and 1.2x verify(1, 4), 5.07 ms where a
    quiet reading is ~4.2, so it was kept capped at 5.07, the chain of 1 looked 0.8 ms a step dearer than it
    is, and `--tree auto` paused a whole run where the chain of 1 ran 1.04x.)"""
    batches, tokens = batches or BATCHES, tokens or VERIFY_TOKENS
    prefixes = list(prefixes or (PREFIX,))
    out: dict[int, dict[tuple[int, int], float]] = {p: {} for p in prefixes}
    forwards = {}  # (prefix, b, n) -> the forward to time
    dev = model.device
    for b in batches:
        rows = torch.arange(b, device=dev)
        for prefix in prefixes:
            cache = model.new_cache(b, prefix + max(tokens) + 1)
            toks = torch.randint(0, model.args.vocab_size, (b, prefix), device=dev)
            model(toks, torch.arange(prefix, device=dev).expand(b, -1), cache, rows=rows, prefill=True)
            cache.advance(rows, torch.full((b,), prefix, device=dev))
            for n in tokens:
                t = torch.randint(0, model.args.vocab_size, (b, n), device=dev)
                pos = (prefix + torch.arange(n, device=dev)).expand(b, -1)
                mask = torch.tril(torch.ones(n, n, dtype=torch.bool, device=dev)).expand(b, n, n) if n > 1 else None

                def forward(t=t, pos=pos, cache=cache, rows=rows, mask=mask):
                    model(t, pos, cache, rows=rows, block_mask=mask, logits_at="all")
                    synchronize(dev)  # a timed call ends when its kernels have run

                forwards[(prefix, b, n)] = forward
        timed = _time_rounds({k: f for k, f in forwards.items() if k[1] == b})
        for (prefix, _, n), s in timed.items():
            out[prefix][(b, n)] = s
    for _ in range(retries):
        stalled = [(p, b, n) for p, table in out.items() for b, n in CostTable(table, {}).stalled(factor=1.0)]
        if not stalled:
            break
        log.info("calibration: measuring %d stalled point(s) again: %s", len(stalled), stalled)
        for k, s in _time_rounds({k: forwards[k] for k in stalled}, warmup=0).items():
            out[k[0]][k[1:]] = min(out[k[0]][k[1:]], s)
    return out


def measure_verify(model, batches: Sequence[int] | None = None, tokens: Sequence[int] | None = None,
                   prefix: int | None = None, retries: int = 3) -> dict[tuple[int, int], float]:
    """(b, n) -> seconds of a target forward of n tokens per row at batch b over ``prefix`` cached tokens
    (``measure_forwards`` at one prefix)."""
    prefix = prefix or PREFIX
    return measure_forwards(model, batches, tokens, (prefix,), retries)[prefix]


def context_slopes(at: Mapping[int, Mapping[tuple[int, int], float]]) -> dict[tuple[int, int], float]:
    """Seconds per context token of each forward: the slope of the least-squares line through its cost at
    each prefix (``at``: prefix -> (b, n) -> seconds, as ``measure_forwards`` returns); {} with fewer than
    two prefixes."""
    xs = sorted(at)
    if len(xs) < 2:
        return {}
    mx = sum(xs) / len(xs)
    out = {}
    for key in at[xs[0]]:
        ys = [at[x][key] for x in xs]
        my = sum(ys) / len(ys)
        out[key] = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return out


def measure_verify_and_context(model, batches: Sequence[int] | None = None, tokens: Sequence[int] | None = None,
                               prefix: int | None = None, longer: Sequence[int] | None = None
                               ) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
    """(verify(b, n) over ``prefix`` cached tokens, its seconds per context token): the forwards timed over
    ``prefix`` and each of ``longer`` prefixes in the same rounds (``measure_forwards``), the slope of the
    least-squares line through the points. Prefixes the model's context cannot hold are left out; with none
    left, no slopes ({}). Until calibration version 18 each prefix's forwards were timed a minute apart from
    the others': on the drifting 2-core EPYC the slopes read 0 at every batch size (capped by noisy larger
    ones) where interleaved readings give 0.2 ms per 100 tokens at batch 1 and 0.6 at batch 4."""
    tokens, prefix = tokens or VERIFY_TOKENS, prefix or PREFIX
    longer = [p for p in (longer or LONG_PREFIXES) if prefix < p <= _room(model, tokens)]
    at = measure_forwards(model, batches, tokens, (prefix, *longer))
    return at[prefix], context_slopes(at)


# Steps of the short and the long run whose difference is timed: what a run pays once (the prompt, the draft
# cache's first encoding, allocation) cancels out, which a per-step mean over a few steps does not (with 4
# steps it counted the draft of a 2-node chain at 3.5 ms a step on a 2-core EPYC, where the benchmark measured
# 1.2 ms, and kept the dispatcher from a chain that paid).
SHORT_STEPS, LONG_STEPS = 4, 20


def _requests(prompt: list[int], steps: int, batch: int, temperature: float) -> list:
    """``batch`` requests of ``prompt`` decoding exactly ``steps`` tokens each, seeded 0..batch-1."""
    from eaglespec.config import GenerationConfig, SamplingParams
    from eaglespec.engine.generate import Request

    return [Request(prompt, GenerationConfig(steps, SamplingParams(temperature=temperature, seed=i), ignore_eos=True))
            for i in range(batch)]


def _step_times(target, proposer, batch: int, steps: int, prompt: list[int],
                temperature: float = 0.0, forwards: list[float] | None = None) -> tuple[list[float], object]:
    """(wall seconds of each decode step of one engine run of ``steps`` new tokens per row, the first
    request's stats): the prefill and the first two steps left out (they pay the run's one-off costs).
    ``temperature`` > 0: the requests sample (seeded), and so do their drafts under the default rule.
    ``forwards``: a list that gets the seconds of each of those steps' target forward (the engine runs one a
    step), in the same order."""
    from eaglespec.engine.generate import Engine

    engine = Engine(target, proposer, max_batch_size=batch)
    reqs = _requests(prompt, steps, batch, temperature)
    done: list = []
    model, timed = target.model, []
    if forwards is not None:  # the instance attribute shadows the class's forward for this run only
        def forward(*args, _inner=model.forward, **kwargs):
            t = time.perf_counter()
            out = _inner(*args, **kwargs)
            synchronize(model.device)
            timed.append(time.perf_counter() - t)
            return out

        shadowed = model.__dict__.get("forward")
        model.forward = forward
    times, last = [], time.perf_counter()
    try:
        for _ in engine.stream(reqs, on_finish=done.append):
            synchronize(model.device)
            now = time.perf_counter()
            times.append(now - last)
            last = now
    finally:
        if forwards is not None:
            if shadowed is None:
                del model.forward
            else:
                model.forward = shadowed
    if forwards is not None:
        if len(timed) != len(times):
            raise RuntimeError(f"calibration: {len(timed)} target forwards in {len(times)} engine steps")
        forwards.extend(timed[3:])
    first = min(done, key=lambda c: c.index)
    return times[3:], first.stats


def _paired_steps(target, proposer, batch: int, steps: int, prompt: list[int],
                  temperature: float = 0.0) -> tuple[list[float], list[float], object]:
    """(wall seconds of each decode step of an engine drafting with ``proposer``, of a plain engine's, the
    drafting engine's first request's stats): the two decode the same requests (as ``_step_times``) stepped in
    turns, one step each, so that step i of one and step i of the other run a few milliseconds apart; their
    prefills and first two steps left out."""
    from eaglespec.engine.generate import Engine

    reqs = _requests(prompt, steps, batch, temperature)
    engines = []
    for drafter in (proposer, None):
        engine = Engine(target, drafter, max_batch_size=batch)
        engine.max_len = len(prompt) + steps + engine.slack  # the cache `stream` would size for these requests
        for i, r in enumerate(reqs):
            engine.submit(i, r)
        engines.append(engine)
    done: list = []
    times: tuple[list[float], list[float]] = ([], [])
    while not all(e.idle for e in engines):
        for engine, out in zip(engines, times):
            if not engine.idle:
                t = time.perf_counter()
                engine.step(on_finish=done.append if engine is engines[0] else None)
                synchronize(target.model.device)
                out.append(time.perf_counter() - t)
    first = min(done, key=lambda c: c.index)
    return times[0][3:], times[1][3:], first.stats


def _interpolate(out: dict, batches: Sequence[int], measured: Sequence[int], key=lambda b: b) -> None:
    """Fill ``out[key(b)]`` for the batch sizes between the smallest and largest measured, linearly between the
    nearest measured on each side."""
    for b in batches:
        if b not in measured:
            lo = max(m for m in measured if m < b)
            hi = min(m for m in measured if m > b)
            t = (b - lo) / (hi - lo)
            out[key(b)] = (1 - t) * out[key(lo)] + t * out[key(hi)]


@torch.inference_mode()
def measure_draft(target, make_proposer, candidates: Mapping[str, object], batches: Sequence[int] | None = None,
                  costs: CostTable | None = None, reps: int = 3, temperature: float = 0.0) -> dict[tuple[int, str], float]:
    """Seconds per step that each candidate (label -> tree strategy) costs beyond its target forward and the
    engine's per-step overhead, at each batch size, from engine runs with that tree on a fixed prompt (after a
    warm-up run).

    With ``costs`` (the forwards and the overhead measured already), the way calibration runs it: an engine
    drafting with the tree and a plain engine decode the same requests stepped in turns (``_paired_steps``:
    step i of each a few milliseconds apart, so that they share the machine's stalls), and the tree's step is
    priced at the median ratio of their i-th steps times the plain step ``costs`` prices, ``verify(b, 1)``
    (with the overhead); the cost is that less ``verify(b, nodes)``: whatever its forwards read alone, the
    tree's step costs what the engine measured it to cost against a plain one. It can be negative (the
    forwards' priced difference above what the engine pays for it). A ratio, not a difference: the machine's
    pace drifts by a quarter within minutes on a shared VM (plain steps 3.9 then 4.8-5.5 ms on the 2-core EPYC
    of session 22), which scales a difference of steps but not their ratio. Without ``costs``: the draft
    seconds of a long run less a short one's, per extra target forward (the head's own time only).

    History. Until calibration version 13 the floor was the tree's median step less ``verify_cost(b, nodes)``:
    absolute times of runs minutes apart from the forwards', which on a drifting VM priced the chain of 1's
    step at 1.19-1.26 plain steps where the benchmark's records showed ~1.33 (2-core Xeon, 2026-11-27).
    Versions 13-14 took the ratio of the median steps of a tree run and of a plain run right after it: but
    other tenants slow the memory-bound forwards for a tenth of a second or more at a time, and a stall over a
    tree's run read the chain of 1's drafting at 0.8-2.0 ms in six readings of one minute
    (``docs/results/xeon-2026-11-27-s17/``). Versions 15-17 priced the tree at the larger of the paired
    difference and the head's own seconds (a short run's less a long run's): where a stall priced verify(1, 2)
    high, the second won and carried the stall into the step (on the 2-core EPYC of session 21 the chain of 1's
    step at 1.43 plain steps where the engine ran it at 1.28-1.32, the chain of 2's at 1.63 against 1.46-1.56).

    The steps are timed at the smallest and the largest of ``batches`` and at those of ``TREE_BATCHES``; the
    other batch sizes get a cost interpolated between (of the ratio, with ``costs``).

    Each cost is the median of ``reps`` readings taken in rounds over all the trees, so that a burst of load
    (a shared VM's steps slow from 9 to 14 ms for a second or two, then recover) spoils one reading of a tree,
    not all of them: with one reading, one calibration read the chain of 1 at 5.1 ms of drafting (1.6-1.9
    in quiet readings) and another at 16 ms, and `--tree auto` then paused where the chain of 1 ran at 1.13x."""
    batches = batches or BATCHES
    readings: dict[tuple[int, str], list[float]] = {}
    # A short prompt: every reading prefills it twice or three times, at the largest batch too, and the costs
    # read here are differences of steps at one context (64 tokens until version 15: a whole calibration took
    # 164-167 s on the 2-core Xeon in five runs, 120 s with 16)
    prompt = list(range(5, 5 + min(PREFIX, DRAFT_PROMPT)))
    # the ends and the batch sizes users run most; the others interpolated between (a step's ratio to a plain one,
    # with ``costs``: since version 18, as the seconds of drafting interpolated carried a stalled verify(b, nodes)
    # into the step: the chain of 1 at batch 4 priced at 1.93 plain steps where paired steps read 1.54-1.57)
    measured = sorted({batches[0], batches[-1], *(b for b in batches if b in TREE_BATCHES)})
    trees = {label: tree for label, tree in candidates.items() if tree.drafts}  # a plain step drafts nothing
    for rep in range(reps):
        for label, tree in trees.items():
            for b in measured:
                if rep == 0 and b == measured[0]:  # warm-up, once per tree
                    _step_times(target, make_proposer(tree), 1, SHORT_STEPS, prompt, temperature)
                if costs is not None:  # the tree's steps and a plain engine's in turns (see the docstring)
                    times, plain, _ = _paired_steps(target, make_proposer(tree), b, LONG_STEPS, prompt, temperature)
                    cost = statistics.median(t / p for t, p in zip(times, plain))  # the ratio, priced below
                else:
                    _, short = _step_times(target, make_proposer(tree), b, SHORT_STEPS, prompt, temperature)
                    _, long = _step_times(target, make_proposer(tree), b, LONG_STEPS, prompt, temperature)
                    forwards = long.target_forwards - short.target_forwards
                    cost = (long.draft_s - short.draft_s) / forwards if forwards > 0 else \
                        long.draft_s / max(long.target_forwards, 1)
                readings.setdefault((b, label), []).append(cost)
    out = {key: statistics.median(values) for key, values in readings.items()}
    for label in trees:
        _interpolate(out, batches, measured, key=lambda b, label=label: (b, label))
    if costs is not None:  # ratios to plain steps -> seconds beyond the tree's priced forward
        context = len(prompt) + LONG_STEPS // 2
        out = {(b, label): r * costs.verify_cost(b, 1, context) - costs.verify_cost(b, trees[label].num_nodes, context)
               for (b, label), r in out.items()}
    _chains_cost_at_least_shorter_chains(out, candidates)
    return out


def _chains_cost_at_least_shorter_chains(draft: dict[tuple[int, str], float], candidates: Mapping[str, object]) -> None:
    """A chain of k + 1 runs a chain of k's draft steps and one more, so it never costs less: raise any reading
    below a shorter chain's (in place). Single readings scatter by ~0.5 ms on a 2-core EPYC: one calibration
    read a chain of 2 at 2.55 ms and a chain of 1 at 2.86, and `--tree auto` then drafted chains of 2 in 30-36%
    of the batch-1 rounds where the chain of 1 measured faster (1.06x vs 1.02x, MT-bench)."""
    from eaglespec.spec.strategies import Chain

    chains = sorted((tree.depth, label) for label, tree in candidates.items() if isinstance(tree, Chain))
    for b in sorted({b for b, _ in draft}):
        floor = -float("inf")  # a tree's cost beyond its priced forward can be negative (measure_draft)
        for _, label in chains:
            if (b, label) in draft:
                draft[(b, label)] = floor = max(draft[(b, label)], floor)


@torch.inference_mode()
def measure_overhead(target, verify: Mapping[tuple[int, int], float], batches: Sequence[int] | None = None,
                     reps: int = 3, steps: Mapping[int, float] | None = None,
                     beyond: Mapping[int, float] | None = None) -> dict[int, float]:
    """The engine's per-step seconds beyond a 1-token target forward at each batch size: the median wall time
    of a plain (no drafting) engine decode step (``steps``, else ``measure_plain_steps``), less verify(b, 1),
    and at most the median plain step less its own forward (``beyond``, measured with the steps when they are
    not given). The first alone counts the forwards' stalls: verify(b, 1) is the quickest of its readings, the
    steps' forwards are not (since calibration version 15: a stalled calibration on the 2-core Xeon read 0.81 ms
    at batch 1 where the engine spends ~0.30 beyond its forward, which priced every tree step closer to a plain
    one than it is); the second alone would price a plain step above its measured wall time where verify(b, 1)
    read high (``cap_by_plain_steps``).

    Until 2026-11-26 it came from whole-run wall times: first the difference of a short and a long run (two
    noisy numbers: 5 ms a step at batch 1 and 0.4 at batch 2 in one calibration), then a run's wall time
    less its prefill (which still counted the KV cache's allocation: 5.1 ms). The median step here reads
    ~2 ms at batch 1 (15.4 ms a step against a 13.2 ms forward on a 2-core EPYC). Too large a constant on
    every step makes each tree's cost look closer to a plain step's than it is: with 5 ms the chain of 1
    looked like it paid from 1.26 tokens a step where it needed ~1.35."""
    batches = batches or BATCHES
    if steps is None:
        beyond = {}
        steps = measure_plain_steps(target, batches, reps, beyond=beyond)
    beyond = beyond or {}
    return {b: max(0.0, min(steps[b] - verify[(b, 1)], beyond.get(b, float("inf")))) for b in batches}


@torch.inference_mode()
def measure_plain_steps(target, batches: Sequence[int] | None = None, reps: int = 3,
                        temperature: float = 0.0, beyond: dict[int, float] | None = None) -> dict[int, float]:
    """The median wall time of a plain (no drafting) engine decode step at each batch size, each step timed on
    its own over ``reps`` runs after a warm-up run (of requests sampling at ``temperature``). ``beyond``: a dict
    that gets each batch size's median step less its own target forward."""
    batches = batches or BATCHES
    prompt = list(range(5, 5 + PREFIX))
    _step_times(target, None, 1, SHORT_STEPS, prompt, temperature)  # warm-up
    out = {}
    for b in batches:
        walls, own = [], []
        for _ in range(reps):
            forwards: list[float] = []
            times, _ = _step_times(target, None, b, LONG_STEPS, prompt, temperature,
                                   forwards=forwards if beyond is not None else None)
            walls += times
            own += [t - f for t, f in zip(times, forwards)]
        out[b] = statistics.median(walls)
        if beyond is not None:
            beyond[b] = statistics.median(own)
    return out


def cap_by_plain_steps(verify: dict[tuple[int, int], float], steps: Mapping[int, float]) -> list[int]:
    """A plain engine step runs one 1-token forward and more, so verify(b, 1) cannot cost more than the median
    plain step: lower it there (in place) and return the batch sizes lowered. The compiled calibration on a
    2-core Xeon read the 1-token forward at 5.65 ms where the engine's plain steps took ~4.9 (the benchmark's
    4.85): the overhead was clamped to 0, the plain step priced 17% high, and ``--tree auto`` predicted 1.09x
    for a chain of 1 that ran 0.97x."""
    lowered = [b for b, step in sorted(steps.items()) if (b, 1) in verify and verify[(b, 1)] > step]
    for b in lowered:
        verify[(b, 1)] = steps[b]
    return lowered


@torch.inference_mode()
def measure_paused(target, make_proposer, batches: Sequence[int] | None = None, reps: int = 3) -> dict[int, float]:
    """Seconds a paused step costs beyond a plain step at each batch size: an engine with the head held paused
    (``none`` every step: each step records its pair, the draft cache catches up when the buffer fills) and a
    plain engine decoding the same requests (twice the buffer's steps, at most ``PAUSED_STEPS``: a request
    paused for longer than the buffer pays a catch-up, a shorter one none), stepped in turns
    (``_paired_steps``); the median of the step-by-step differences plus the catch-up steps' excess over the
    median paused step, spread over all steps; the median over ``reps`` such runs (the smallest of 2 read
    0.0-0.24 ms at batch 1 in four calibrations of one quiet 2-core EPYC: a minimum of noisy differences is
    biased low). Until session 21 the two engines ran one after the other and their median steps were
    subtracted: on the drifting 2-core EPYC of sessions 19-21 that read 0.36 and 0.47 ms at batch 1 (8-10% of a
    plain step) where paused and plain requests alternated in one process differed by ~0.09 ms (1.4%), and the
    dispatcher, pricing a pause at 0.92x, drafted chains predicted at 0.94-0.98x of plain decoding."""
    from eaglespec.spec.strategies import NoDraft

    batches = batches or BATCHES
    prompt = list(range(5, 5 + min(PREFIX, 64)))
    out: dict[int, float] = {}
    measured = sorted({batches[0], batches[-1]})
    for b in measured:
        diffs = []
        for _ in range(reps):
            proposer = make_proposer(NoDraft())
            steps = min(2 * max(int(getattr(proposer, "max_lag", 0)), 16), PAUSED_STEPS) + 4
            paused, plain, _ = _paired_steps(target, proposer, b, steps, prompt)
            step_diff = statistics.median(p - q for p, q in zip(paused, plain))
            diffs.append(max(0.0, step_diff) + _catch_up_excess(paused, proposer))
        out[b] = statistics.median(diffs)
    _interpolate(out, batches, measured)
    return out


def _catch_up_excess(paused: Sequence[float], proposer) -> float:
    """The catch-ups' excess over the median paused step, spread over all steps: the run catches up once per
    ``max_lag`` recorded pairs, so that many of its slowest steps count (those above 1.5x the median), and no
    others. Until 2026-11-26 every step above 1.5x the median counted, and in runs too short to catch up at all
    (the default buffer of 256 pairs) that counted only the machine's stalls: 0.44 ms at batch 1 on a 2-core
    Xeon where the paused and the plain median steps differed by -0.1 to -0.25 ms (0.05-0.17 at batch 4).
    (In the benchmark a paused request also pays its probes' catch-ups, which this run, held at ``none``, does
    not make: 2-3% with drafting probes on a 2-core Xeon, less since probes look back and are skipped where
    they cannot matter: docs/DISPATCH.md, "Measured".)"""
    lag = int(getattr(proposer, "max_lag", 0))
    if not paused or lag <= 0:
        return 0.0
    mid = statistics.median(paused)
    slowest = sorted(paused, reverse=True)[: len(paused) // lag]
    return sum(t - mid for t in slowest if t > 1.5 * mid) / len(paused)


def calibrate(target, make_proposer, candidates: Mapping[str, object], batches: Sequence[int] | None = None,
              head_id: str = "", precision: str = "float32") -> CostTable:
    t0 = time.perf_counter()
    phases: dict[str, float] = {}  # seconds each part took (logged: where a calibration's time goes)
    last = t0

    def done(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - last
        last = now

    verify, context = measure_verify_and_context(target.model, batches)
    done("forwards")
    beyond: dict[int, float] = {}
    steps = measure_plain_steps(target, batches, beyond=beyond)
    lowered = cap_by_plain_steps(verify, steps)
    if lowered:
        log.info("calibration: the 1-token forward read slower than a whole plain step at batch %s: priced at the "
                 "step", ", ".join(map(str, lowered)))
    envelope = CostTable(verify, {}).envelope
    overhead = measure_overhead(target, envelope, batches, steps=steps, beyond=beyond)
    done("plain steps")
    draft = measure_draft(target, make_proposer, candidates, batches,
                          CostTable(verify, {}, overhead=overhead, context=context, prefix=PREFIX))
    done("trees")
    paused = measure_paused(target, make_proposer, batches)
    done("paused steps")
    # Requests that sample pay more per step, plain or not: their own overhead and drafting (SAMPLED_T).
    sampled_beyond: dict[int, float] = {}
    sampled_steps = measure_plain_steps(target, batches, temperature=SAMPLED_T, beyond=sampled_beyond)
    sampled_overhead = measure_overhead(target, envelope, batches, steps=sampled_steps, beyond=sampled_beyond)
    done("plain steps")
    sampled_draft = measure_draft(target, make_proposer, candidates, batches,
                                  CostTable(verify, {}, overhead=sampled_overhead, context=context, prefix=PREFIX),
                                  temperature=SAMPLED_T)
    done("trees")
    log.info("calibrated %d verify and %d draft costs in %.1f s (%s)", len(verify), len(draft) + len(sampled_draft),
             time.perf_counter() - t0, ", ".join(f"{name} {secs:.1f} s" for name, secs in phases.items()))
    return CostTable(verify, draft, _fingerprint(), overhead, paused, context, PREFIX, sampled_overhead, sampled_draft)


def _to_json(t: CostTable) -> dict:
    return {"fingerprint": t.fingerprint, "verify": [[b, n, s] for (b, n), s in sorted(t.verify.items())],
            "draft": [[b, lab, s] for (b, lab), s in sorted(t.draft.items())],
            "overhead": [[b, s] for b, s in sorted(t.overhead.items())],
            "paused": [[b, s] for b, s in sorted(t.paused.items())],
            "context": [[b, n, s] for (b, n), s in sorted(t.context.items())], "prefix": t.prefix,
            "sampled_overhead": [[b, s] for b, s in sorted(t.sampled_overhead.items())],
            "sampled_draft": [[b, lab, s] for (b, lab), s in sorted(t.sampled_draft.items())]}


def _from_json(d: dict) -> CostTable:
    return CostTable({(b, n): s for b, n, s in d["verify"]}, {(b, lab): s for b, lab, s in d["draft"]},
                     d.get("fingerprint", ""), {b: s for b, s in d["overhead"]}, {b: s for b, s in d.get("paused", [])},
                     {(b, n): s for b, n, s in d.get("context", [])}, int(d.get("prefix", 0)),
                     {b: s for b, s in d.get("sampled_overhead", [])},
                     {(b, lab): s for b, lab, s in d.get("sampled_draft", [])})


def _runtime_label(model) -> str:
    """The precision (and int4 kernel, and a float16 KV cache), whether decode/verify forwards run compiled, and the
    GPU they run on (they cost differently; the machine fingerprint names the CPU only)."""
    precision = getattr(model, "precision", "?")
    if getattr(model, "int4_kernel", None) == "w4a8":
        precision += "/w4a8"  # torch's int4 kernel keeps the plain label (tables cached before w4a8 existed)
    if getattr(model, "kv_dtype", None) == torch.float16 and getattr(model, "dtype", None) != torch.float16:
        precision += "/kv16"  # a float16 cache under float32 activations (runtime.loading.resolve_kv_dtype)
    label = f"{precision}+compiled" if getattr(model, "step_graph", None) is not None else precision
    device = getattr(model, "device", None)
    if isinstance(device, torch.device) and device.type == "cuda":
        label += f"@{torch.cuda.get_device_name(device)}"
    return label


def load_or_calibrate(target, make_proposer, candidates: Mapping[str, object], cache_dir: str | os.PathLike[str],
                      head_id: str = "", precision: str = "float32", batches: Sequence[int] | None = None,
                      recalibrate: bool = False) -> tuple[CostTable, bool]:
    """(table, measured_now): the cached table for this machine/model/precision/head, else a new one (batches:
    default ``BATCHES``). A new table that looks taken under load (``CostTable.implausible``) is measured once
    more at once (a bench that calibrated inside a burst of load once ran `--tree auto` at 1.00x where the
    chain of 1 ran 1.13x); if the second looks so too, it is used for this run and not cached."""
    batches = tuple(batches or BATCHES)
    key = calibration_key(target.name, precision, head_id, batches, candidates)
    path = Path(cache_dir) / "calibration" / f"{key}.json"
    if path.is_file() and not recalibrate:
        try:
            return _from_json(json.loads(path.read_text())), False
        except (ValueError, KeyError, TypeError) as e:
            log.warning("%s: unreadable calibration (%s); measuring again", path, e)
    table = calibrate(target, make_proposer, candidates, batches, head_id, precision)
    doubts = table.implausible()
    if doubts:  # load comes in bursts: measure once more at once rather than steer this run by a stalled table
        log.warning("calibration looks stalled by other load (%s); measuring once more", "; ".join(doubts))
        table = calibrate(target, make_proposer, candidates, batches, head_id, precision)
        doubts = table.implausible()
    if doubts:  # used for this run, not kept: the next run measures again (on a quieter machine, one hopes)
        log.warning("calibration looks stalled by other load again (%s); using it for this run without caching it: "
                    "the next run measures again (`eaglespec calibrate --force` once the machine is quiet)",
                    "; ".join(doubts))
        return table, True
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(_to_json(table), indent=1))
    os.replace(tmp, path)
    log.info("calibrated speculation costs for %s on this machine (cached in %s)", target.name, path)
    return table, True


def build_calibrated_proposer(target, opts, dtype=None):
    """``spec.speculative.build_proposer`` whose ``--tree auto`` is the acceptance-aware dispatcher over this
    machine's calibration (``opts.calibrate``; else the static table). The one entry point of the CLI,
    the server and the benchmark."""
    from eaglespec.spec.speculative import build_proposer

    return build_proposer(target, opts, dtype, dispatcher_factory=adaptive_dispatcher)


def calibration_candidates(opts) -> list:
    """The dispatcher's candidate trees for these draft options (a fixed draft temperature > 0 needs chain/static
    trees: a dynamic tree's rerank breaks the sampled-children rule; with each request's own temperature, the
    default, a dynamic tree drafts top-k children for sampled requests too)."""
    from eaglespec.spec.dispatch import DEFAULT_CANDIDATES

    return [c for c in DEFAULT_CANDIDATES if not opts.draft_temperature or c.samples_children]


def head_precision(head) -> str:
    """How the head's weights run ("int4/w4a8" or "int8" once packed next to a packed target, else its dtype): part of the
    calibration key, since a float32 head drafts 2-3x slower than the same head in int8."""
    from eaglespec.runtime.quant import PackedLinear

    packed = sorted({m.fmt + ("/w4a8" if m.kernel == "w4a8" else "") for m in head.modules()
                     if isinstance(m, PackedLinear)})
    return "+".join(packed) if packed else str(getattr(head, "dtype", "?")).removeprefix("torch.")


def head_fingerprint(head_dir: Path) -> str:
    """Names, sizes and modification times of the head's files: another head (or retrained one) is another
    calibration."""
    files = sorted(Path(head_dir).glob("*.json")) + sorted(Path(head_dir).glob("*.safetensors"))
    return hashlib.sha256("".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
                          .encode()).hexdigest()[:16]


def calibration_for(target, head, head_dir: Path, opts, recalibrate: bool = False) -> tuple[CostTable, bool]:
    """(this machine's cost table for the target and head, measured_now): cached, measured when missing or
    when ``recalibrate`` (``eaglespec calibrate --force``)."""
    from eaglespec.runtime.loading import cache_root
    from eaglespec.spec.proposer import EagleProposer

    def make(tree):
        return EagleProposer(head, tree, alignment=opts.alignment)

    cands = calibration_candidates(opts)
    return load_or_calibrate(target, make, {c.label: c for c in cands}, cache_root(),
                             head_id=f"{head_fingerprint(head_dir)}:{head_precision(head)}",
                             precision=_runtime_label(target.model), recalibrate=recalibrate)


def adaptive_dispatcher(target, head, head_dir: Path, opts):
    """The acceptance-aware dispatcher over the default candidates, with this machine's cached calibration
    (measured now if there is none: tens of seconds on a 2-core CPU)."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs, _ = calibration_for(target, head, head_dir, opts)
    return AdaptiveDispatcher(costs, calibration_candidates(opts), cost_feedback=opts.cost_feedback)


def _tree_rows(costs: CostTable, batches: Sequence[int], candidates: Sequence) -> list[str]:
    """Per batch size and candidate tree: ms beyond its forward ("draft"), verifying (+ overhead) and step, and the
    break-even."""
    lines = ["batch | tree                 | nodes |  draft | verify |   step | break-even"]
    for b in batches:
        v1 = costs.verify_cost(b, 1)
        for c in candidates:
            draft = costs.draft_cost(b, c.label)
            if draft is None:
                continue
            verify = costs.verify_cost(b, c.num_nodes)
            lines.append(f"{b:5d} | {c.label:<20s} | {c.num_nodes:5d} | {1e3 * draft:6.2f} | {1e3 * verify:6.2f} | "
                         f"{1e3 * (draft + verify):6.2f} | {(draft + verify) / v1:6.2f}")
    return lines


def cost_table_text(costs: CostTable, candidates: Sequence) -> str:
    """The table `eaglespec calibrate` prints: verify(b, n) per batch size, then per candidate tree its draft
    and step cost and the tokens per step it needs to beat plain decoding (step / verify(b, 1))."""
    batches = sorted({b for b, _ in costs.verify})
    ns = sorted({n for _, n in costs.verify})
    lines = [f"machine: {costs.fingerprint}", "",
             "verify(b, n): ms of one target forward of n tokens per row at batch b (* = capped by a larger "
             "forward's measurement: a stall)",
             "batch | " + " | ".join(f"n={n:<5d}" for n in ns)]

    def cell(b: int, n: int) -> str:
        if (b, n) not in costs.verify:
            return "      -"
        used = costs.envelope[(b, n)]
        return f"{1e3 * used:6.2f}" + ("*" if used < costs.verify[(b, n)] else " ")

    for b in batches:
        lines.append(f"{b:5d} | " + " | ".join(cell(b, n) for n in ns))
    if costs.context:
        lines += ["", f"context: ms more per 100 tokens of context beyond the {costs.prefix} above (each verified "
                  "token attends to all of them)", "batch | " + " | ".join(f"n={n:<5d}" for n in ns)]
        for b in batches:
            lines.append(f"{b:5d} | " + " | ".join(
                f"{1e5 * costs.context_envelope[(b, n)]:6.2f} " if (b, n) in costs.context_envelope else "      -"
                for n in ns))
    if costs.overhead:
        lines += ["", "engine overhead per step (ms, added to every step below): " +
                  ", ".join(f"batch {b} {1e3 * s:.2f}" for b, s in sorted(costs.overhead.items()))]
    if costs.paused:
        lines += ["paused step (none with the head kept ready: pair bookkeeping, draft-cache catch-up), ms beyond a "
                  "plain step: " + ", ".join(f"batch {b} {1e3 * s:.2f}" for b, s in sorted(costs.paused.items()))]
    lines += ["", "per tree: ms beyond its forward (drafting, verifying and committing the tree: its step as measured against "
              "plain steps, less the forward's price; negative where the forward alone read dear), of verifying its "
              "nodes (+ overhead), of the whole step; break-even = tokens per step (accepted + bonus) it needs to beat "
              "plain decoding"] + _tree_rows(costs, batches, candidates)
    if costs.sampled_overhead or costs.sampled_draft:
        sampled = costs.for_sampled({c.label: c.num_nodes for c in candidates})  # as the dispatcher prices them
        lines += ["", "sampled requests (T > 0; children drawn at the request's temperature): engine overhead per step "
                  "(ms) " + ", ".join(f"batch {b} {1e3 * s:.2f}" for b, s in sorted(costs.sampled_overhead.items())),
                  "per tree, as above (no cheaper against a sampled plain step than greedy against a greedy one)"] \
            + _tree_rows(sampled, batches, candidates)
    return "\n".join(lines)
