"""The cost model of a speculative step: which tree pays, from measured costs and live acceptance.

A step with tree shape s at batch size b costs ``draft(s, b) + verify(nodes(s), b)`` seconds and yields
``E[tokens | s]`` tokens per row (the accepted draft tokens plus the bonus token). Its throughput relative to
plain decoding is

    speedup(s, b, L) = E[tokens | s] * verify(1, b, L) / (draft(s, b) + verify(nodes(s), b, L))

where L is the batch's mean context (tokens already in each row's cache): every verified token attends to
the whole context, so an extra token in the tree costs more in a long conversation than in a short one (on a
2-core Xeon, a 2-token forward cost 0.8 ms more than a 1-token one at a 128-token context and 1.0-1.4 ms at
256-512; a 4-token one 2.2 and 3.5 ms; at batch 4 a 1-token forward itself grew from 12.2 to 17.9 ms).

and the dispatcher runs the shape with the highest predicted speedup, ``none`` (speedup 1 by definition)
when nothing beats it. The costs come from a calibration on this machine (``calibrate.py``); the expected
tokens from acceptance measured online:

  * chains: ``E[tokens | chain d] = 1 + sum_{k=1..d} prod_{i<=k} a_i`` with a_i the conditional acceptance at
    depth i (accepted at depth i given accepted at i - 1; EAGLE-2 paper, section 3 for why acceptance is
    position dependent). One tracker per depth, exponentially decayed, updated from every verified chain.
  * trees (static / dynamic): their own decayed mean of tokens per step, once measured; before that the
    chain prediction of the same depth, so an unmeasured tree is worth trying exactly when its chain is.

The calibrated costs are checked against what the engine pays (``StepCostFeedback``): each step's wall time
is divided by the price the model put on it, per shape, batch size and band of context, and a shape whose steps
keep costing 10% or more beyond their price, relative to plain steps timed the same way, has its price scaled
by that factor. A calibration read in a quiet minute, or on a machine that drifted since, otherwise steers every
request: on a 2-core EPYC one priced a batch-4 chain of 1 at 1.52 plain steps where the engine paid ~1.66, and
`--tree auto` drafted at a predicted 1.02-1.08x and ran 0.93-0.97x (session 20). The check only ever makes a
tree dearer (``StepCostFeedback`` says why).

Pure functions and small trackers; the dispatcher that uses them lives with the tree strategies.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from eaglespec.spec.strategies import NoDraft

PLAIN = NoDraft().label
"""The label of a plain step (no drafting): speedup 1 by definition."""

__all__ = ["AcceptanceTracker", "CostTable", "Choice", "RequestSpread", "StepCostFeedback", "chain_expected_tokens",
           "choose", "predicted_speedup", "score"]


def chain_expected_tokens(accept: Sequence[float], depth: int) -> float:
    """1 + sum_k prod_{i<=k} a_i over the first ``depth`` conditional acceptances (missing depths count 0)."""
    total, run = 1.0, 1.0
    for i in range(depth):
        run *= accept[i] if i < len(accept) else 0.0
        total += run
    return total


@dataclass
class CostTable:
    """Measured seconds: ``verify[(b, n)]`` a target forward of n tokens per row at batch b, ``draft[(b, s)]``
    the drafting of shape label s at batch b (0 for ``none``), ``overhead[b]`` the engine's own work per step
    at batch b beyond the target forward (verification, sampling, the host read, bookkeeping), paid by every
    step whatever its tree: it is added to every ``verify_cost``, so that the plain step and a speculative
    step carry it alike (without it, a tree's relative cost is overstated: a 2-node chain measured 1.16x a
    plain step in the engine, 1.20x as bare forwards). Missing entries are interpolated along n.

    ``context[(b, n)]`` is the extra seconds of that forward per context token beyond ``prefix`` (the context
    at which ``verify`` was measured): ``verify_cost(b, n, L) = verify(b, n) + context(b, n) * (L - prefix)``,
    both interpolated along n; without it (or without L) the cost is the one at ``prefix``.

    The model uses the verify costs through ``envelope``: a forward of more rows or more tokens cannot cost
    less, and on a shared machine a stall only ever adds time, so each verify(b, n) is capped by the
    measurements at every b' >= b and n' >= n. One stalled measurement of verify(b, 1) would otherwise make
    every tree look profitable at that batch size (seen: 4.8 s instead of 65 ms on a loaded 2-core CPU).
    The cap is a last resort (it leaves verify(b, 1) at verify(b, 2), which still flatters drafting):
    calibration measures again the points ``stalled`` finds before it keeps a table."""

    verify: dict[tuple[int, int], float]
    draft: dict[tuple[int, str], float]
    fingerprint: str = ""
    overhead: dict[int, float] = field(default_factory=dict)
    paused: dict[int, float] = field(default_factory=dict)
    """Seconds a paused step (``none`` under a head) costs beyond a plain step at batch b: recording the step's
    pair and, amortized, the draft cache's catch-up over the recorded pairs. Keeping the head ready is not
    free: 2-5% a step on a 2-core EPYC, more than a chain that breaks even costs."""
    context: dict[tuple[int, int], float] = field(default_factory=dict)
    prefix: int = 0
    sampled_overhead: dict[int, float] = field(default_factory=dict)
    """``overhead`` measured with requests that sample (T=1): their steps also scale, filter and draw from the
    target's distribution (and a tree's verification runs the sampled rule over every candidate), 0.3-0.5 ms a
    plain step more than a greedy one at batch 1 on a 2-core Xeon. Empty: tables from before they were kept."""
    sampled_draft: dict[tuple[int, str], float] = field(default_factory=dict)
    """``draft`` measured with sampled requests, whose children are drawn from the head's distribution (the
    default ``--draft-temperature request``) and verified by the sampled rule."""
    envelope: dict[tuple[int, int], float] = field(init=False, repr=False, compare=False)
    context_envelope: dict[tuple[int, int], float] = field(init=False, repr=False, compare=False)
    _context_batches: frozenset[int] = field(init=False, repr=False, compare=False)
    _batches: list[int] = field(init=False, repr=False, compare=False)
    # (batch, n) -> (verify cost at the prefix incl. overhead, per-token context slope or None), and batch ->
    # the measured batch size that prices it: filled on first use. The dispatcher asks these every step (the
    # cost feedback prices each step); recomputed each time they cost ~20 us a paused step in Python.
    _verify_memo: dict[tuple[int, int], tuple[float, float | None]] = field(init=False, repr=False, compare=False)
    _batch_memo: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.envelope = _envelope(self.verify)
        # per-token slopes are differences of noisy forwards: capped the same way (a larger forward's slope
        # bounds a smaller one's) and never negative
        self.context_envelope = {k: max(0.0, s) for k, s in _envelope(self.context).items()}
        self._context_batches = frozenset(b for b, _ in self.context_envelope)
        self._batches = sorted({k[0] for k in self.verify})
        self._verify_memo, self._batch_memo = {}, {}

    def verify_cost(self, batch: int, n: int, context: float | None = None) -> float:
        memo = self._verify_memo.get((batch, n))
        if memo is None:
            b = self._batch(batch)
            slope = _along_n(self.context_envelope, b, n) if b in self._context_batches else None
            memo = self._verify_memo[(batch, n)] = (_along_n(self.envelope, b, n) + self.overhead.get(b, 0.0), slope)
        cost, slope = memo
        if context is not None and slope is not None:
            cost += slope * (context - self.prefix)
        return max(cost, 0.0)

    def implausible(self, factor: float = 5.0, slack: float = 0.005, paused_share: float = 0.08,
                    paused_floor: float = 0.0005) -> list[str]:
        """Signs that the machine was busy while this table was measured, which the verify envelope cannot
        repair: the engine's own bookkeeping costing ``factor`` 1-token forwards, or one chain drafting
        ``factor`` times slower per level than another at the same batch size (a level costs about the same
        at every depth); either also ``slack`` seconds beyond the other, so that tiny models, whose forwards
        cost less than the Python around them, are not flagged. A table taken on a busy 2-core machine once
        held 1 s of overhead a step at batch 2 and a chain of 2 at 13x a chain of 1's per-level cost; cached,
        it would have steered every later run. Also a paused step at the smallest batch size costing more than
        ``paused_share`` of a 1-token forward (and ``paused_floor`` seconds): it only records a pair, which
        measured 0-2% at batch 1 on the 2-core EPYC, and one calibration taken on a noisy machine read 1.1 ms
        (11%) there, which made the model predict a loss for every choice including pausing. (Larger batches
        record a pair per row: 4-13% at batch 8 in quiet calibrations, so they are not judged.)"""
        def off(hi: float, lo: float) -> bool:
            return hi > factor * lo and hi - lo > slack

        out = [f"engine overhead {o * 1e3:.1f} ms a step at batch {b} against a 1-token forward's "
               f"{self.envelope[(b, 1)] * 1e3:.1f} ms"
               for b, o in sorted(self.overhead.items()) if (b, 1) in self.envelope and off(o, self.envelope[(b, 1)])]
        b0 = min(self.paused, default=None)  # the smallest batch only: bookkeeping grows with the rows
        if b0 is not None and (b0, 1) in self.envelope and self.paused[b0] > paused_share * self.envelope[(b0, 1)] \
                and self.paused[b0] > paused_floor:
            out.append(f"paused step {self.paused[b0] * 1e3:.2f} ms at batch {b0} against a 1-token forward's "
                       f"{self.envelope[(b0, 1)] * 1e3:.1f} ms")
        for b in sorted({b for b, _ in self.draft}):
            per_level = {label: s / int(label[5:]) for (b2, label), s in self.draft.items()
                         if b2 == b and label.startswith("chain") and label[5:].isdigit() and s > 0}
            if len(per_level) > 1 and off(max(per_level.values()), min(per_level.values())):
                hi, lo = max(per_level, key=per_level.get), min(per_level, key=per_level.get)
                out.append(f"at batch {b} {hi} drafts {per_level[hi] * 1e3:.2f} ms a level against {lo}'s "
                           f"{per_level[lo] * 1e3:.2f}")
        return out

    def stalled(self, factor: float = 1.2) -> list[tuple[int, int]]:
        """Verify measurements more than ``factor`` times a larger forward's: stalls to measure again."""
        return sorted(k for k, s in self.verify.items() if s > factor * self.envelope[k])

    def for_sampled(self, nodes: Mapping[str, int] | None = None) -> CostTable:
        """The table that prices a batch holding sampled requests: the sampled overhead and drafting where they
        were measured, the greedy ones elsewhere (the forwards are the same).

        ``nodes`` (label -> nodes the tree verifies): each sampled drafting cost is raised where it would price
        the tree's sampled step at fewer sampled plain steps than its greedy step costs greedy plain steps (at
        the calibration's prefix). A sampled step does all a greedy one does, and draws the children from the
        head's distribution and verifies every node by the sampled rule, where a plain step draws one token: on
        the 2-core EPYC (session 37, `docs/results/epyc-2026-11-29-s37/`) the paired readings put the chain of 1
        at 1.30-1.36 plain steps sampled against 1.27-1.31 greedy on four prompts, the chain of 2 at 1.52-1.55
        against 1.41-1.47, and the bench's fixed chain of 1 ran 1.34-1.45 vanilla steps at T=1 against 1.26-1.38
        at T=0 in all twelve cells of four runs; but one calibration read the sampled chain of 1 at 1.27 against
        its greedy 1.35, and `--tree auto` then predicted 1.09x for HumanEval at batch 1, T=1 and ran 0.96x."""
        if not self.sampled_overhead and not self.sampled_draft:
            return self
        sampled = replace(self, overhead={**self.overhead, **self.sampled_overhead},
                          draft={**self.draft, **self.sampled_draft}, sampled_overhead={}, sampled_draft={})
        for (b, label), greedy in self.draft.items():
            n = (nodes or {}).get(label)
            if n is not None and (b, label) in self.sampled_draft:
                ratio = (greedy + self.verify_cost(b, n)) / self.verify_cost(b, 1)
                floor = ratio * sampled.verify_cost(b, 1) - sampled.verify_cost(b, n)
                sampled.draft[(b, label)] = max(sampled.draft[(b, label)], floor)
        return sampled

    def paused_cost(self, batch: int) -> float:
        return self.paused.get(self._batch(batch), 0.0)

    def draft_cost(self, batch: int, label: str) -> float | None:
        return self.draft.get((self._batch(batch), label))

    def _batch(self, batch: int) -> int:
        """The nearest measured batch size at or below ``batch`` (or the smallest)."""
        b = self._batch_memo.get(batch)
        if b is None:
            bs = self._batches
            b = self._batch_memo[batch] = max((x for x in bs if x <= batch), default=bs[0])
        return b


def _envelope(table: Mapping[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    """Each (b, n) capped by the measurements at every b' >= b and n' >= n."""
    return {(b, n): min(s for (b2, n2), s in table.items() if b2 >= b and n2 >= n) for b, n in table}


def _along_n(table: Mapping[tuple[int, int], float], b: int, n: int) -> float:
    """table[(b, n)], linearly interpolated between the measured n (beyond them: the nearest, scaled by n)."""
    ns = sorted(k[1] for k in table if k[0] == b)
    if n in ns:
        return table[(b, n)]
    lo = max((x for x in ns if x < n), default=ns[0])
    hi = min((x for x in ns if x > n), default=ns[-1])
    if lo == hi:  # outside the measured range: scale the nearest linearly in n
        return table[(b, lo)] * n / lo
    t = (n - lo) / (hi - lo)
    return (1 - t) * table[(b, lo)] + t * table[(b, hi)]


@dataclass
class AcceptanceTracker:
    """Exponentially decayed acceptance: per-depth conditional rates (chains) and tokens per step per shape.

    ``prior`` are the rates assumed before any measurement (e.g. the head's offline-measured acceptance);
    ``weight`` is how many steps' worth of evidence the prior carries.

    Defaults: ``decay`` 0.97 (about the last 65 verifications count) and ``weight`` 8. A short memory is a
    trap near break-even: with 0.9 (about 19 verifications) and a prior worth 2 steps, a few early misses of
    a head accepted 35-45% of the time at depth 1 stopped drafting, and the rare probes of a paused batch
    could not bring it back (simulated on the int4 costs: 0.92-0.95x the best fixed chain; with these
    defaults and probe runs of 4 steps 0.98-0.99x), while a collapse from 0.45 to 0.05 is still seen within
    ~15 verifications."""

    decay: float = 0.97
    prior: tuple[float, ...] = (0.5, 0.4, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3)
    weight: float = 8.0
    hits: list[float] = field(default_factory=list)
    tries: list[float] = field(default_factory=list)
    shape_tokens: dict[str, tuple[float, float]] = field(default_factory=dict)  # label -> (sum, weight)

    def __post_init__(self) -> None:
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        if not self.hits:
            self.hits = [p * self.weight for p in self.prior]
            self.tries = [self.weight] * len(self.prior)

    def rates(self) -> list[float]:
        return [h / t if t > 0 else 0.0 for h, t in zip(self.hits, self.tries)]

    def update_chain(self, drafted_depth: int, accepted: int, keep_untried: bool = False) -> None:
        """One verified path: ``accepted`` of ``drafted_depth`` chain tokens were accepted (the first miss
        is a failed try at depth accepted + 1; deeper depths were not tried). ``keep_untried``: only the depths
        tried age (a memory of each depth over its own latest tries, as the dispatcher's pools keep); else
        every depth ages (what this request or batch showed lately)."""
        tried = min(drafted_depth, accepted + 1)
        self._reach(tried)
        for i in range(tried if keep_untried else len(self.hits)):
            self.hits[i] *= self.decay
            self.tries[i] *= self.decay
        for i in range(tried):
            self.tries[i] += 1.0
            if i < accepted:
                self.hits[i] += 1.0

    def update_first(self, hits: float, tries: float, keep_untried: bool = False) -> None:
        """``tries`` verifications of depth 1 alone (a look-back probe), ``hits`` of them accepted: every depth
        (``keep_untried``: depth 1 alone) decays as after ``tries`` verifications, and depth 1 gains the weight
        those verifications would have kept, (1 - decay^tries) / (1 - decay), at their hit rate (their order is
        not known)."""
        if not 0 <= hits <= tries:
            raise ValueError(f"hits must be in [0, tries], got {hits} of {tries}")
        if tries == 0:
            return
        self._reach(1)
        f = self.decay ** tries
        w = tries if self.decay == 1.0 else (1.0 - f) / (1.0 - self.decay)
        n = 1 if keep_untried else len(self.hits)
        self.hits[:n] = [h * f for h in self.hits[:n]]
        self.tries[:n] = [t * f for t in self.tries[:n]]
        self.hits[0] += w * hits / tries
        self.tries[0] += w

    def set_depth(self, depth: int, rate: float, weight: float) -> None:
        """Depth ``depth`` (1-based) holds ``weight`` verifications' worth of evidence at ``rate``."""
        self._reach(depth)
        self.hits[depth - 1], self.tries[depth - 1] = rate * weight, weight

    def _reach(self, depths: int) -> None:
        """Grow the per-depth lists to at least ``depths`` entries (no evidence at the new ones)."""
        while len(self.hits) < depths:
            self.hits.append(0.0)
            self.tries.append(0.0)

    def update_shape(self, label: str, tokens: float) -> None:
        s, w = self.shape_tokens.get(label, (0.0, 0.0))
        self.shape_tokens[label] = (s * self.decay + tokens, w * self.decay + 1.0)

    def expected_tokens(self, label: str, chain_depth: int) -> float:
        """Measured tokens per step of ``label`` when it has been run, else the chain prediction."""
        if label in self.shape_tokens:
            s, w = self.shape_tokens[label]
            return s / w
        return chain_expected_tokens(self.rates(), chain_depth)


@dataclass
class RequestSpread:
    """How a head's depth-1 acceptance varies from request to request (empirical Bayes).

    Each request that ended with at least ``min_tries`` of its own depth-1 evidence (its decayed hits and tries:
    drafted chains and look-backs, none of the pool's prior) adds its counts; the latest ``keep`` are summarized
    as a Beta distribution of the requests' true rates by moments: mean m = the requests' mean rate, variance v =
    the variance of their rates less the part each one's own sampling noise explains (rate (1 - rate) / tries),
    at least ``sd_floor`` squared (a few requests that happen to agree must not make the next one certain),
    strength k = m (1 - m) / v - 1 pseudo-tries (at least 1). ``posterior(hits, tries)`` is a request's rate
    given that prior and its own counts: mean (k m + hits) / (k + tries), variance mean (1 - mean) /
    (k + tries + 1); None until ``min_requests`` requests were counted.

    Why: whether a paused request should pay a probe's catch-up depends on what the probe could find, and one
    request's own 16-32 look-back pairs cannot tell a 0.33 from a 0.40 (sd ~0.08-0.1) where break-even is ~0.39;
    the requests before it can (``dispatch.AdaptiveDispatcher._probe_worth``)."""

    keep: int = 32
    min_requests: int = 4
    min_tries: float = 8.0
    sd_floor: float = 0.05
    seen: collections.deque = field(default_factory=collections.deque)  # (hits, tries) per request, oldest first

    def __post_init__(self) -> None:
        if self.keep < self.min_requests or self.min_requests < 2 or not self.min_tries > 0 \
                or not 0.0 < self.sd_floor < 0.5:
            raise ValueError(f"RequestSpread needs keep >= min_requests >= 2, min_tries > 0 and sd_floor in (0, 0.5), "
                             f"got keep {self.keep}, min_requests {self.min_requests}, min_tries {self.min_tries}, "
                             f"sd_floor {self.sd_floor}")

    def add(self, hits: float, tries: float) -> bool:
        """A request's own depth-1 evidence as it ends; False (not counted) below ``min_tries``."""
        if not 0.0 <= hits <= tries or not math.isfinite(tries):
            raise ValueError(f"a request's depth-1 evidence must be 0 <= hits <= tries, got {hits} of {tries}")
        if tries < self.min_tries:
            return False
        self.seen.append((hits, tries))
        while len(self.seen) > self.keep:
            self.seen.popleft()
        return True

    def prior(self) -> tuple[float, float] | None:
        """(mean rate m, strength k in pseudo-tries) of the requests' rates; None below ``min_requests``."""
        n = len(self.seen)
        if n < self.min_requests:
            return None
        rates = [h / t for h, t in self.seen]
        m = sum(rates) / n
        var = sum((r - m) ** 2 for r in rates) / (n - 1)
        noise = sum(r * (1.0 - r) / t for r, (_, t) in zip(rates, self.seen)) / n
        v = max(var - noise, self.sd_floor ** 2)
        return m, max(m * (1.0 - m) / v - 1.0, 1.0)

    def posterior(self, hits: float, tries: float) -> tuple[float, float] | None:
        """(mean, sd) of a request's depth-1 rate given its own ``hits`` of ``tries``; None below
        ``min_requests``."""
        p = self.prior()
        if p is None:
            return None
        m, k = p
        mean = (k * m + hits) / (k + tries)
        return mean, math.sqrt(mean * (1.0 - mean) / (k + tries + 1.0))


@dataclass(frozen=True)
class Choice:
    """A tree shape and what the cost model predicts for one step of it at one batch size."""

    label: str
    predicted_speedup: float
    """E[tokens] * verify(b, 1) / step_s: tokens/s over plain decoding's, both from the calibrated costs."""
    expected_tokens: float
    """Tokens committed per row and step (accepted draft tokens + the bonus token); 1 for ``none``."""
    step_s: float
    """Predicted seconds of the step: (draft(b, s) + verify(b, nodes(s))) * factor; verify(b, 1) + paused(b) for
    ``none``."""
    factor: float = 1.0
    """The step-cost feedback's correction of the calibrated price (``StepCostFeedback.factor``; 1 for ``none``
    and where nothing was measured yet): ``step_s / factor`` is the calibrated price."""

    @property
    def vanilla_s(self) -> float:
        """The calibrated seconds of a plain decoding step at the same batch size, verify(b, 1)."""
        return self.predicted_speedup * self.step_s / self.expected_tokens


def predicted_speedup(costs: CostTable, batch: int, label: str, nodes: int, expected_tokens: float,
                      context: float | None = None) -> float | None:
    """E[tokens] * verify(b, 1, L) / (draft + verify(b, nodes, L)); None when the shape's draft cost is
    unmeasured. ``none`` (a paused step, the head kept ready): verify(b, 1, L) / (verify(b, 1, L) + paused(b)),
    1 without a measured paused cost. ``context``: the batch's mean context L (None: the calibrated prefix)."""
    v1 = costs.verify_cost(batch, 1, context)
    if label == PLAIN:
        return v1 / (v1 + costs.paused_cost(batch))
    draft = costs.draft_cost(batch, label)
    if draft is None:
        return None
    return expected_tokens * v1 / (draft + costs.verify_cost(batch, nodes, context))


def score(costs: CostTable, batch: int, label: str, nodes: int, depth: int, tracker: AcceptanceTracker,
          context: float | None = None, factor: float = 1.0) -> Choice | None:
    """The prediction for one shape (``none``: speedup 1); None when its draft cost is unmeasured. ``factor``
    scales the shape's calibrated step price (``StepCostFeedback.factor``; ignored for ``none``)."""
    if label == PLAIN:
        return Choice(PLAIN, predicted_speedup(costs, batch, PLAIN, 1, 1.0, context), 1.0,
                      costs.verify_cost(batch, 1, context) + costs.paused_cost(batch))
    if not factor > 0:
        raise ValueError(f"a step-cost factor must be > 0, got {factor}")
    e = tracker.expected_tokens(label, depth)
    s = predicted_speedup(costs, batch, label, nodes, e, context)
    if s is None:
        return None
    return Choice(label, s / factor, e,
                  (costs.draft_cost(batch, label) + costs.verify_cost(batch, nodes, context)) * factor, factor)


def choose(costs: CostTable, batch: int, candidates: Mapping[str, tuple[int, int]], tracker: AcceptanceTracker,
           margin: float = 1.0, context: float | None = None, factors: Mapping[str, float] | None = None,
           drafting: bool = False, keep_margin: float | None = None) -> Choice:
    """The candidate (label -> (nodes, depth)) with the best predicted speedup at mean context ``context``;
    ``none`` unless something beats 1 by ``margin`` (e.g. 1.02 to ignore gains within noise). ``factors``:
    per label, the step-cost feedback's correction of its price (missing: 1).

    ``drafting``: the batch drafts now, so its best tree is kept while it predicts ``keep_margin`` times the
    plain step's speedup (None: no hysteresis, ``margin`` both ways): with ``keep_margin`` below 1, pausing
    needs a predicted loss as starting needs a predicted gain. A request near break-even otherwise pauses at every
    dip of its decayed acceptance, and a paused request sees little evidence (``dispatch.py``)."""
    factors = factors or {}
    plain = best = score(costs, batch, PLAIN, 1, 0, tracker, context)
    drafted = None  # the best drafting candidate
    for label, (nodes, depth) in candidates.items():
        c = None if label == PLAIN else score(costs, batch, label, nodes, depth, tracker, context,
                                              factors.get(label, 1.0))
        if c is None:
            continue
        if drafted is None or c.predicted_speedup > drafted.predicted_speedup:
            drafted = c
        if c.predicted_speedup > best.predicted_speedup * (margin if best.label == PLAIN else 1.0):
            best = c
    if best is plain and drafting and keep_margin is not None and drafted is not None \
            and drafted.predicted_speedup >= plain.predicted_speedup * keep_margin:
        best = drafted
    return best


@dataclass
class StepCostFeedback:
    """What the engine paid for its steps against what the calibration priced them at, per batch size, shape and
    band of context.

    Each timed step adds the ratio measured / priced seconds (clipped to [1 / ``clip``, ``clip``]: one stalled step must
    not reprice a shape) to an exponentially decayed mean for its (batch size, label, context band of ``band`` tokens).
    A drafting shape's ``factor`` at a context is its mean ratio over the plain (``none``) steps' mean ratio in the same
    band at the same batch size (the part of its price the calibration got wrong relative to plain decoding, whatever
    made the whole machine faster or slower than at calibration time; plain steps as ``plain`` says), applied only from
    ``tolerance`` up: the check only ever makes a tree dearer, and only by more than its own comparison can resolve.
    Drafting and plain steps are timed in different stretches of a run (other requests, minutes), not paired as the
    calibration pairs them, and the calibration's price per context token errs too: on Spec-Bench at batch 1 plain steps
    ran at ~0.98 of their price over short contexts and ~0.82-0.85 over the long summarization prompts, where the chains
    were rarely drafted; one mean over all contexts then raised the price of chains that were priced right (by 1.10-1.16
    at the end of that run), hence the bands and the tolerance (`docs/DISPATCH.md`, "Prices, online"). A tree found
    cheaper than priced keeps its price: what its timed steps leave out is a cost of drafting too (the steps that caught
    the draft cache up must not be observed, as the caller does: a request's first drafting step encodes its whole
    prompt through the head, the first after a pause every pair recorded meanwhile). A shape needs ``min_weight`` steps'
    worth of evidence in the band before it is corrected (the reading below that misled the dispatcher rested on 10),
    plain steps ``plain_weight`` before they are the reference.

    A shape's evidence ages: every step timed at a batch size scales the weight of every shape's reading at that batch
    size by ``age``. A shape the correction paused is not timed again, and its reading would otherwise hold for the rest
    of the run, compared with plain steps timed ever later: on MT-bench at batch 1 (2-core EPYC, session 35, ``m5/`` in
    `docs/results/epyc-2026-11-29-s35/`) the first request read the chain of 1 at 1.31 of its price over 10 steps while
    plain steps ran at 1.18, a machine slower than at calibration throughout; as plain steps came back to 1.05 over the
    next minutes, the chain's frozen reading set f = 1.11-1.22 and kept it paused in 76% of the rounds, at 1.03x vanilla
    against the chain of 1's own 1.14x. A reading corrects from the step its weight reaches ``min_weight`` until aging
    takes it below ``release`` times that (the gap keeps a tree that is dearer than priced from being drafted again at
    the next timed step); then the tree is chosen on its price again, and timed anew where it is chosen.

    Where plain steps were never timed in a band, they count at the larger of their price and their ratio in the
    nearest band where they were: a machine running every step slower than priced then does not make the trees
    of an unmeasured band dearer (the same run read the chain of 1 at 1.08 of its price over 256-511 tokens,
    where no plain step was timed, against plain's 1.12 below), and plain steps that ran cheap at other
    contexts (the long prompts' 0.82-0.85) still do not lower the reference.

    Plain steps' readings do not age: most timed steps of a batch that drafts are drafting ones (and one paused
    step in four is timed), so aged, the plain reference would mostly be missing, and the price would stand in
    for it on a machine running every step 15% slower than priced (the first run of this rule read plain steps
    at 1.14-1.16 of their price at batch 1, and chains of 1 at 1.12-1.16 were corrected against 1.0).

    With ``peers`` (since session 37) a shape is also compared with every other shape whose reading corrects in
    the same band at the same batch size: its factor is its ratio over the lowest of those and the plain reference.
    The calibration reads a deeper chain's step at prices ~12% apart in calibrations minutes apart (the chain of 2
    at 1.45-1.47 plain steps in some phases of the 2-core EPYC VM, 1.61-1.68 in others; the chain of 1 steadier),
    and where it caught the low end the plain steps alone did not show it: on 40 AlpacaEval first turns at batch 1
    (session 36, ``alpaca_eval_t0.txt`` in `docs/results/epyc-2026-11-29-s36/`) the chain of 1 read 1.036 of its
    price over 71 steps' worth, the chain of 2 1.204 over 69 and plain steps 1.160 over 17: against plain the chain
    of 2 was within tolerance (1.04) and drafted in 56% of the rounds, against the chain of 1 it is 1.16 dearer than
    priced. Still only dearer: a shape read cheap lowers the others' reference, never its own price.

    Defaults: ``decay`` 0.99 (about the last 100 steps of a shape count), ``clip`` 2, ``min_weight`` 24 (8
    before session 36), ``plain_weight`` 8, ``tolerance`` 1.05 (1.10 before session 35: see
    ``docs/DISPATCH.md``), ``band`` 256 tokens, ``age`` 0.998 and ``release`` 0.5 (a correction that has just
    reached ``min_weight`` and is not renewed holds for ~350 timed steps at its batch size, ~1400 paused ones, a
    dozen 128-token requests at batch 1), ``peers`` on."""

    decay: float = 0.99
    clip: float = 2.0
    min_weight: float = 24.0
    plain_weight: float = 8.0
    tolerance: float = 1.05
    band: int = 256
    age: float = 0.998
    release: float = 0.5
    peers: bool = True
    ratios: dict[tuple[int, str, int], tuple[float, float, int, bool]] = field(default_factory=dict)
    """(batch, label, band index) -> (decayed sum of ratios, decayed weight, the batch size's ``clock`` when they
    were last updated: a shape's are worth ``age`` ** (steps timed since) of that, whether the weight had reached
    ``min_weight`` since it was last below ``release`` times it); band -1: context unknown."""
    clock: dict[int, int] = field(default_factory=dict)
    """batch size -> steps timed at it so far."""
    drafted: int = 0
    """Drafting steps observed so far: new evidence for the choice (plain steps alone move it only slowly)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.decay <= 1.0 or not self.clip >= 1.0 or self.min_weight < 0 or self.plain_weight < 0 \
                or not self.tolerance >= 1.0 or self.band < 1 or not 0.0 < self.age <= 1.0 \
                or not 0.0 <= self.release <= 1.0:
            raise ValueError(f"StepCostFeedback needs 0 < decay <= 1, clip >= 1, min_weight >= 0, plain_weight >= 0, "
                             f"tolerance >= 1, band >= 1, 0 < age <= 1 and 0 <= release <= 1, got decay {self.decay}, "
                             f"clip {self.clip}, min_weight {self.min_weight}, plain_weight {self.plain_weight}, "
                             f"tolerance {self.tolerance}, band {self.band}, age {self.age}, release {self.release}")

    def _band(self, context: float | None) -> int:
        return -1 if context is None else int(max(context, 0.0) // self.band)

    def _aged(self, key: tuple[int, str, int]) -> tuple[float, float, bool]:
        """The key's (sum, weight) as of its batch size's clock now, and whether its reading corrects."""
        s, w, t, held = self.ratios.get(key, (0.0, 0.0, 0, False))
        if key[1] == PLAIN:
            return s, w, w > 0 and w >= self.plain_weight
        a = self.age ** (self.clock.get(key[0], 0) - t)
        s, w = s * a, w * a
        return s, w, w > 0 and (w >= self.min_weight or held and w >= self.release * self.min_weight)

    def observe(self, batch: int, label: str, measured_s: float, priced_s: float,
                context: float | None = None) -> None:
        """One step of ``label`` at ``batch`` and mean context ``context`` took ``measured_s`` seconds; the
        calibration priced it ``priced_s``."""
        if not (measured_s > 0 and priced_s > 0 and math.isfinite(measured_s) and math.isfinite(priced_s)):
            raise ValueError(f"step times must be finite and > 0, got {measured_s} measured, {priced_s} priced")
        r = min(max(measured_s / priced_s, 1.0 / self.clip), self.clip)
        key = (batch, label, self._band(context))
        self.clock[batch] = now = self.clock.get(batch, 0) + 1
        s, w, held = self._aged(key)
        w = w * self.decay + 1.0
        self.ratios[key] = (s * self.decay + r, w, now, held or w >= self.min_weight)
        if label != PLAIN:
            self.drafted += 1

    def ratio(self, batch: int, label: str, context: float | None = None) -> float | None:
        """The decayed mean of measured / priced seconds in the context's band while it corrects (a shape's aged
        weight reached ``min_weight`` and has not fallen below ``release`` times that since; plain steps' weight
        is at least ``plain_weight``), else None."""
        return self._ratio((batch, label, self._band(context)))

    def _ratio(self, key: tuple[int, str, int]) -> float | None:
        s, w, held = self._aged(key)
        return s / w if held else None

    def plain(self, batch: int, context: float | None = None) -> float:
        """What a plain step costs against its price in the context's band: its ``ratio`` there; where that is
        unknown, the larger of 1 (its price) and its ratio in the nearest band where it is known."""
        k = self._band(context)
        r = self._ratio((batch, PLAIN, k))
        if r is not None:
            return r
        near = [(abs(k2 - k), k2) for b, label, k2 in self.ratios
                if b == batch and label == PLAIN and k2 >= 0 and k >= 0]
        for _, k2 in sorted(near):
            r = self._ratio((batch, PLAIN, k2))
            if r is not None:
                return max(1.0, r)
        return 1.0

    def factor(self, batch: int, label: str, context: float | None = None) -> float:
        """How much more a ``label`` step costs than priced at this context, relative to a plain step
        (``plain``) or, with ``peers``, to whichever other shape's correcting ``ratio`` in the band is lower, where
        that is at least ``tolerance``; else 1 (also for ``none`` and where the shape's ``ratio`` in the band is
        None)."""
        held = self._held(batch, context)
        return self._factor(label, held, self.plain(batch, context)) if label in held else 1.0

    def _held(self, batch: int, context: float | None) -> dict[str, float]:
        """label -> its ``ratio`` in the context's band at this batch size, for the drafting shapes whose reading
        there corrects."""
        k = self._band(context)
        out = {}
        for key in self.ratios:
            if key[0] == batch and key[2] == k and key[1] != PLAIN:
                r = self._ratio(key)
                if r is not None:
                    out[key[1]] = r
        return out

    def _factor(self, label: str, held: Mapping[str, float], plain: float) -> float:
        """``factor`` from the band's correcting ratios ``held`` (``_held``) and the plain reference ``plain``."""
        r = held.get(label)
        if r is None:
            return 1.0
        ref = plain
        if self.peers:  # its own ratio among them changes nothing: a shape at the lowest gets f = 1 either way
            ref = min(ref, *held.values())
        f = r / ref
        return f if f >= self.tolerance else 1.0

    def factors(self, batch: int, context: float | None = None) -> dict[str, float]:
        """label -> its ``factor`` at this context, for every shape timed at this batch size (in any band); the
        band's readings and the plain reference are looked up once for all of them."""
        labels = {label for b, label, _ in self.ratios if b == batch and label != PLAIN}
        held = self._held(batch, context) if labels else {}
        plain = self.plain(batch, context) if held else 1.0  # only a shape in ``held`` reads it
        return {label: self._factor(label, held, plain) for label in labels}

    def snapshot(self) -> list[dict]:
        """One entry per (batch size, tree, band) timed: ``batch``, ``tree`` (the label; ``none`` = plain steps),
        ``context`` ([first, last + 1) tokens of the band; None where unknown), the decayed mean ``ratio``, its
        ``weight`` in steps and the ``factor`` it sets in that band (bench records, the server's metrics). Fields,
        not a joined key: tree labels contain colons ("dynamic5x4:16")."""
        out = []
        for (b, label, k) in sorted(self.ratios):
            s, w, _ = self._aged((b, label, k))
            if w > 0:
                ctx = None if k < 0 else k * self.band
                out.append({"batch": b, "tree": label, "context": None if k < 0 else [ctx, ctx + self.band],
                            "ratio": round(s / w, 4), "weight": round(w, 2),
                            "factor": round(self.factor(b, label, ctx), 4)})
        return out
