"""The acceptance-aware dispatcher: picks the tree (or no drafting) per step from measured costs and live,
per-request acceptance (``costmodel.py`` has the formulas).

* Each cache row (request) has its own ``AcceptanceTracker``, started from the dispatcher's pooled one (what
  earlier requests showed about this head; depth 1 from the spread of the requests before it once enough ended,
  ``SPREAD_PRIOR_MAX``) and updated after every verification of that row. Greedy and
  sampled requests pool apart: a sampled request accepts less (its draft must match a random draw, not the
  argmax), so a server mixing both would otherwise start its sampled requests from greedy acceptance.
* Every ``repick_every`` steps the batch's tree is re-chosen: candidates are scored with the rows' mean
  per-depth acceptance (a batch shares one tree) against the calibrated costs at this batch size and the
  rows' mean context (a verified token costs more in a longer context). A request alone in its batch starts
  drafting on a predicted gain of ``margin`` and, once drafting, pauses only on a predicted loss
  (``KEEP_MARGIN``); a batch of several uses ``batched_margin`` both ways; a batch holding a sampled request
  asks more (``SAMPLED_MARGIN``, ``SAMPLED_KEEP_MARGIN``).
* A batch that stopped drafting (choice ``none``) probes after ``probe_every`` steps, and chooses again from
  what the probe saw, so acceptance that recovers is seen again; each probe after which drafting still does
  not pay doubles the wait (up to ``max_probe_every``); a request alone in the batch starts the waits over (it
  starts from the pooled acceptance of the requests before it, which may have paused for reasons of their
  own), and gets one look-back even where the pooled acceptance says no recovery could pay (a skipped probe
  observes nothing, so a pool dragged low would stay low). Once enough requests have ended, a request alone looks
  back only where the spread of their acceptance (``costmodel.RequestSpread``) says the look-back could save
  more than its catch-up costs (``_probe_worth``), except every ``EXPLORE_EVERY``-th, which keeps the spread
  current. A probe LOOKS BACK when the proposer can
  (``pick(..., look_back=True)``: lazily recorded paused pairs): the step stays plain, the proposer catches its
  draft cache up over the recorded pairs and scores,
  at each of the latest of them, the chance that the root child a chain of 1 would have drafted there was
  accepted, from the token the target drew next (``observe_look_back``): depth-1 acceptance at up to 32
  positions for the price of a catch-up, which resuming drafting needs anyway. (Greedy drafts: the hit of
  the head's top-1 guess g, whose chance p(g) is also what a sampled target accepts it with. Drafts drawn at
  a temperature from q: min(1, q(x) / p(x)) of the target's token x ~ p, whose mean is sum min(p, q), the
  acceptance of a sampled one-token draft: ``sampling.one_token_acceptance``.) Otherwise (a proposer that
  records no pairs) the probe drafts the cheapest candidate for ``probe_steps`` steps in a row: drafting at a
  chain that loses, 1.4-1.6x a plain step each, which with the catch-up cost 2-3% of a paused run at T=1 on a
  2-core Xeon (2026-11-26), before sampled requests looked back too.
  (The proposer records the pairs of paused steps and catches its draft cache up in one forward when
  drafting resumes or a probe looks back: ``proposer.py``.)
* Prices are checked as the engine runs (``observe_step``, on unless ``cost_feedback=False``): each plain or
  drafting step's wall time against the price the choice put on it (``costmodel.StepCostFeedback``), so that a
  shape that keeps costing more than calibrated relative to plain steps is priced at what it costs from then
  on. The choice then depends on the machine's timings as well as on acceptance: a seeded sampled run can draw
  other tokens when its steps were timed differently (greedy output is the target's either way); without the
  feedback a seeded run repeats its choices exactly.
* ``last`` holds the latest choice (a ``costmodel.Choice``: label, predicted speedup, expected tokens, step
  seconds); ``step`` the prediction for the tree the latest ``pick`` returned (a probe's own, while paused).
  The proposer hands ``step`` to the engine, whose per-sequence stats count the trees and add up the
  predictions (``--json``, bench records and report, the server's metrics).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence

from eaglespec.spec.costmodel import (PLAIN, AcceptanceTracker, Choice, CostTable, RequestSpread, StepCostFeedback,
                                      choose, score)
from eaglespec.spec.strategies import Chain, DynamicTree, NoDraft, TreeStrategy

__all__ = ["AdaptiveDispatcher", "DEFAULT_CANDIDATES"]


CONTEXT_BUCKET = 64  # tokens of context growth after which a paused batch's choice is made again
PROBE_COST_STEPS = 1.0  # what a probe costs, in plain steps, until a catch-up was timed: its catch-up encodes
# the prompt and every pair recorded while paused (~35 us a pair and row, 100-200 pairs into a 128-token request,
# against a ~4 ms plain step at batch 1 on the 2-core Xeon); a probe is skipped where a resume could not win that
# back (``pick``). Once a catch-up was timed (``observe_catch_up``), a probe is priced at the pairs its catch-up
# would encode (the proposer's ``catch_up`` count) at the timed seconds a pair: at batch 4 on a 2-core EPYC a
# first probe's catch-up (four prompts and their pairs, 1206 pairs) took 47-73 ms, 4-6 plain steps (session 25).
CATCH_UP_DECAY = 0.75  # weight of the earlier catch-ups' seconds and pairs at each new timing

BATCHED_MARGIN = 1.10
"""The predicted speedup a tree needs to be drafted in a batch of several requests (alone: ``margin``, 1.02). The
calibration's batch-4 prices have erred by 5-15% either way against what the engine paid (predicted / measured
0.94-1.15 over the EPYC and Xeon matrices of sessions 17-20), against 1-9% at batch 1: on the EPYC in session 20
calibration version 16 priced a batch-4 chain of 1 at 1.52 plain steps where the engine ran ~1.66, and
`--tree auto` drafted at a predicted 1.02-1.08x and ran 0.93-0.97x in two runs, where it had paused at ~1.00x
before. Requiring a gain larger than the model's error there gives up batched gains below ~10% (the chain of 1
won more than that in one batch-4 cell of those matrices, HumanEval at 1.12x, and 0.99x in the next run)."""

BATCHED_PROBE_OPTIMISM = 1.2
"""``probe_optimism`` for a batch of several requests (alone: 1.5): a probe is made only where drafting would pay
at this many times the rows' mean acceptance. A batch's mean moves less than one request's, and with
``BATCHED_MARGIN`` a recovery must be large to resume drafting: in session 21's matrix on the 2-core EPYC
(`docs/results/epyc-2026-11-28-s21/m1/`) `--tree auto` at batch 4 drafted 21 chain-of-1 rounds of ~8900 at T=0
while its probes' catch-ups (every row's prompt and recorded pairs) cost 0.7-1.8% of the wall time over vanilla's
in the paused cells, which ran 0.951-1.005x."""

KEEP_MARGIN = 0.98
"""A request alone in its batch that drafts keeps its best tree while the tree is predicted at this many times a
plain step's speedup (``costmodel.choose``): pausing needs a predicted 2% loss, as drafting needs a 2% gain
(``margin``). Without it a request near break-even paused at every dip of its decayed acceptance (about the
last 33 verifications' worth: a rate read +-0.08 around a true 0.4), and once paused it saw only the
look-backs of its doubling probe waits. At T=1 on a 2-core EPYC the chain of 1 breaks even near depth-1
acceptance 0.36, the requests accepted 0.37-0.42 on average, and `--tree auto` paused in 53-63% of its batch-1
rounds on MT-bench and HumanEval and ran 1.00-1.02x where the chain of 1, drafted throughout, ran 1.03-1.15x
(session 25's matrices). A batch of several requests keeps ``batched_margin`` both ways: the calibration's
batch-4 prices err by more than this band."""

SAMPLED_MARGIN = 1.06
SAMPLED_KEEP_MARGIN = 1.0
"""A batch holding a sampled request (T > 0) starts drafting on a predicted gain of ``SAMPLED_MARGIN`` (where the
other margins ask less) and pauses on a predicted loss (below ``SAMPLED_KEEP_MARGIN`` times a plain step's
speedup, where ``KEEP_MARGIN`` allows 2% more). A sampled request accepts less than a greedy one, its chains win
little where they win, and the model's predictions for it erred upwards by more than the usual margins. In session
35's two matrix runs on the 2-core EPYC (`docs/results/epyc-2026-11-29-s35/predicted_by_request.txt`), at batch 1,
T=1, with the 1.02 / 0.98 margins: the chain of 1 read 0.95-0.99x vanilla in all six cells; `--tree auto` drafted
for 93 of 140 requests and ran 0.967-0.983x; its drafting requests' predicted / measured speedup averaged 1.060
(1.021 at T=0); those predicted below 1.05x ran 0.947-0.969x on average (70 requests), those predicted at 1.05x or
more 1.019x (23, at most 1.18x), and those that never drafted 0.985x."""

DEEPEN_BELOW = 1.0
DEEPEN_STEPS = 8
"""A request alone in its batch that drafts a chain of d drafts the next longer candidate chain for
``DEEPEN_STEPS`` steps once its acceptance at depth d + 1 rests on less than ``DEEPEN_BELOW`` verifications'
worth of evidence, if that chain would pay at ``probe_optimism`` times the estimate there (``_deeper``). A depth
no chain reaches is never tried again, and every verification ages its evidence without changing its rate: a
few early misses kept it low for good. In session 25's first matrix (MT-bench, batch 1, greedy) `--tree auto`
drafted the chain of 1 in 1775 rounds and the chain of 2 in 11, and ran 1.12x where the chain of 2 ran 1.16x
with 0.46 of its second tokens accepted (it wins above ~0.31 there). Refilled by a run (about 4 tries at depth
2 when half the first tokens are accepted), the evidence ages below 1 again after ~45 verifications: a run every
~50 steps while the longer chain stays plausible, none once its acceptance is known to be too low even for an
optimist."""

EXPLORE_FLOOR: tuple[float, ...] = AcceptanceTracker().prior
"""The per-depth acceptance a request alone in its batch is hoped to reach at least when it explores (its one
look-back, whatever the pool says): the default prior of a head nothing is known about. The look-back is skipped
only where its catch-up outweighs what even ``probe_optimism`` times these rates could win over the tokens left
(``_probe_could_pay``): e.g. a prompt of thousands of tokens with a short answer, whose look-back would encode the
whole prompt through the head for a resume that could not repay it."""

EXPLORE_EVERY = 4
"""Of the requests that start alone in their batch, the first and every ``EXPLORE_EVERY``-th after it explore by
the floor rule above (``EXPLORE_FLOOR``) whatever the requests before them showed; the others' look-backs are
priced against what they could find (``AdaptiveDispatcher._probe_worth``). The explorers keep the spread of the
requests' acceptance current: a request whose look-back is skipped adds no evidence to it."""

SPREAD_QUANTILES: tuple[float, ...] = tuple(statistics.NormalDist().inv_cdf((j + 0.5) / 8) for j in range(8))
"""Where ``_probe_worth`` reads a request's possible depth-1 rates: the midpoints of 8 equally likely bands of a
normal distribution with the posterior's mean and sd (in sds from the mean)."""

SPREAD_PRIOR_MAX = 32.0
"""A new request's depth-1 acceptance starts from the spread of the requests before it (``RequestSpread.prior``:
their mean rate, at their strength in pseudo-tries, at most this many) once enough requests were counted, instead
of from the pool, which decays as a request's tracker does (about the latest 33 verifications' worth, passed on at
a weight of 8): at batch 1 mostly the request before it. Seen before (session 33, 2-core EPYC, 24 MT-bench first
turns, greedy, batch 1, `docs/results/epyc-2026-11-29-s33/`), with a calibration that priced the chain of 1 dear
(break-even 1.41 tokens a step where the engine's steps read ~1.3), the pauses fed the pool and the pool the next
requests' pauses: requests 4-7, which the chain of 1 alone drafted at 0.43-0.72 depth-1 acceptance, started from a
pool at 0.37 and stayed paused throughout (`trace_picks_mt_before.txt`; from the spread, at 0.42-0.55 with a
weight of 8-32, they drafted: `trace_picks_mt_after.txt`); in one process auto paused in 2837 of 4758 rounds and
ran 1.022x vanilla, where starting from the spread it paused in 484-740 and ran 1.087-1.101x, the chain of 1
1.143x (`ab_mt_t0_5.txt`). The cap keeps a few agreeing requests (the spread's sd floor alone allows ~100
pseudo-tries) from outweighing a full window of the request's own evidence."""

DEFAULT_CANDIDATES: tuple[TreeStrategy, ...] = (
    Chain(1), Chain(2), Chain(3), Chain(4), Chain(6), DynamicTree(topk=4, depth=5, tree_tokens=16),
)


def _hopeful(rates: Sequence[float], optimism: float, from_depth: int = 0) -> AcceptanceTracker:
    """The tracker of an optimist: the rates from depth ``from_depth`` + 1 on (0-based index ``from_depth``)
    ``optimism`` times what they are, at most 1; the shallower ones as they are."""
    return AcceptanceTracker(1.0, tuple(r if i < from_depth else min(1.0, optimism * r) for i, r in enumerate(rates)),
                             1.0)


class AdaptiveDispatcher:
    """``pick(batch_size) -> TreeStrategy`` like ``strategies.TreeDispatcher``, plus ``observe`` after verification.

    ``spread_probes``: a request alone in its batch looks back only where the spread of the requests before it says
    the look-back could repay its catch-up (``_probe_worth``; False: the optimist's rule alone, as before session
    32). ``spread_prior``: a new request's depth 1 starts from that spread (``SPREAD_PRIOR_MAX``; False: from the
    pool, as before session 33). ``pool_memory``: a pool ages each depth only as it is tried (``start_row``; off by
    default: every depth ages at every verification). The other settings are described where their defaults are
    defined above."""

    def __init__(self, costs: CostTable, candidates: Sequence[TreeStrategy] = DEFAULT_CANDIDATES,
                 prior: AcceptanceTracker | None = None, repick_every: int = 4, probe_every: int = 16,
                 margin: float = 1.02, max_probe_every: int = 256, probe_steps: int = 4,
                 probe_optimism: float = 1.5, batched_margin: float = BATCHED_MARGIN,
                 batched_probe_optimism: float = BATCHED_PROBE_OPTIMISM, cost_feedback: bool = True,
                 keep_margin: float | None = KEEP_MARGIN, deepen_steps: int = DEEPEN_STEPS,
                 spread_probes: bool = True, spread_prior: bool = True, pool_memory: bool = False,
                 sampled_margin: float = SAMPLED_MARGIN, sampled_keep_margin: float | None = SAMPLED_KEEP_MARGIN):
        if repick_every < 1 or probe_every < 1 or max_probe_every < probe_every or probe_steps < 1:
            raise ValueError("repick_every, probe_every and probe_steps must be >= 1 and max_probe_every >= "
                             "probe_every")
        if probe_optimism < 1.0 or batched_probe_optimism < 1.0:
            raise ValueError(f"probe_optimism and batched_probe_optimism must be >= 1, got {probe_optimism} and "
                             f"{batched_probe_optimism}")
        if margin < 1.0 or batched_margin < 1.0:
            raise ValueError(f"margins must be >= 1, got {margin} and {batched_margin}")
        if keep_margin is not None and not 0.0 < keep_margin <= margin:
            raise ValueError(f"keep_margin must be in (0, margin = {margin}] or None, got {keep_margin}")
        if not sampled_margin >= 1.0 or sampled_keep_margin is not None \
                and not 0.0 < sampled_keep_margin <= max(margin, sampled_margin):
            raise ValueError(f"sampled_margin must be >= 1 and sampled_keep_margin in (0, "
                             f"{max(margin, sampled_margin)}] or None, got {sampled_margin} and {sampled_keep_margin}")
        self.costs = costs
        self.candidates = {c.label: c for c in candidates if c.drafts}
        # batches holding a sampled request (T > 0); a tree's sampled step no cheaper against a sampled plain step
        # than its greedy one against a greedy plain step (``CostTable.for_sampled``)
        self._sampled_costs = costs.for_sampled({label: c.num_nodes for label, c in self.candidates.items()})
        self._shapes = {label: (c.num_nodes, c.max_depth) for label, c in self.candidates.items()}  # for choose
        self.none = NoDraft()
        self.pools = {False: prior or AcceptanceTracker(), True: AcceptanceTracker()}  # greedy / sampled requests
        self.rows: dict[int, AcceptanceTracker] = {}
        self._sampled: dict[int, bool] = {}  # row -> its request samples (T > 0)
        # row -> its own depth-1 evidence (drafted chains, look-backs; decayed like ``rows``, without the pool's
        # prior), which each request hands to the spread of its kind when it ends (``end_row``)
        self._own: dict[int, AcceptanceTracker] = {}
        self.spreads = {False: RequestSpread(), True: RequestSpread()}  # greedy / sampled requests
        self.spread_probes = spread_probes  # price a lone request's look-backs by the spread (``_probe_worth``)
        self.spread_prior = spread_prior  # a new request's depth 1 starts from the spread (``SPREAD_PRIOR_MAX``)
        self.pool_memory = pool_memory  # a pool's depth ages only as it is tried (``start_row``)
        self._alone_started = 0  # requests that started alone in their batch (``EXPLORE_EVERY``)
        self._explore_forced = False  # the request alone explores by the floor rule (``EXPLORE_EVERY``)
        self.repick_every, self.probe_every, self.margin = repick_every, probe_every, margin
        self.batched_margin = batched_margin
        self.keep_margin = keep_margin
        self.sampled_margin, self.sampled_keep_margin = sampled_margin, sampled_keep_margin
        if deepen_steps < 0:
            raise ValueError(f"deepen_steps must be >= 0 (0: never), got {deepen_steps}")
        self.deepen_steps = deepen_steps
        self.max_probe_every, self.probe_steps = max_probe_every, probe_steps
        self.probe_optimism, self.batched_probe_optimism = probe_optimism, batched_probe_optimism
        self._probe_wait = probe_every  # steps until the next probe while paused (doubles after each probe)
        self._probe_left = 0  # steps left in the current probe run
        self._probe: TreeStrategy = self.none
        self._probe_done = False  # a probe run just ended: choose again at the next step
        self.look_back_due = False  # the latest pick asks the proposer to look back (then observe_look_back)
        self.last: Choice | None = None
        self.step: Choice | None = None
        self._current: TreeStrategy = self.none
        self._steps = 0
        self._observed = 0  # verifications observed so far: the acceptance evidence changes only with them
        self._chosen_on: tuple | None = None  # (batch size, rows, observations, context bucket) of the latest choice
        self._since_draft = 0
        self._explore = False  # the request alone in the batch has not been probed yet (``start_row``)
        self._context: float | None = None
        self.feedback = StepCostFeedback() if cost_feedback else None
        self._catch_up_s = self._catch_up_pairs = 0.0  # decayed sums of timed catch-ups (``observe_catch_up``)
        # (batch size, rows, context bucket, observations, drafted steps) of a paused pick after which every pick
        # with the same key returns ``none`` and changes nothing but the step counters until a probe is due
        # (``_quiet_step``); None: the next pick goes the whole way. Set by a pick that pauses; the rest of what a
        # choice is made on (``evidence`` in ``pick``: which rows sample) changes only as a row starts or ends,
        # which drops it.
        self._quiet: tuple | None = None

    def __repr__(self) -> str:
        return f"AdaptiveDispatcher(candidates={list(self.candidates)}, calibrated on {self.costs.fingerprint!r})"

    @property
    def configs(self) -> list[TreeStrategy]:
        return [self.none, *self.candidates.values()]

    # ---------------------------------------------------------------------------------------- per row
    def start_row(self, row: int, sampled: bool = False) -> None:
        """A new request took this cache row: its tracker starts from the pooled acceptance of its kind
        (sampled: the request samples at T > 0)."""
        p = self.pools[sampled]
        self.rows[row] = t = AcceptanceTracker(p.decay, tuple(p.rates()), p.weight,
                                               shape_tokens=dict(p.shape_tokens))
        # A depth the pool has little evidence of passes on no more than it has (``DEEPEN_BELOW``): the pool ages
        # every depth at every verification, so after ~65 chains of 1 each request starts from a depth-2 rate with
        # no weight behind it, fixed at whatever the latest chains of 2 saw (on MT-bench, greedy, batch 1, 2-core
        # EPYC: 0.04 for a whole run after one deepening run of 8 steps missed its ~5 second tokens, where on six of
        # the 24 requests the chain of 2 ran 1.14-1.69x against the chain of 1's 1.03-1.32x;
        # `docs/results/epyc-2026-11-29-s33/trace_picks_mt_after.txt`, `per_request_mt.txt`). ``pool_memory=True``
        # keeps each depth until it is tried again; tried in session 33 and left off: in two of three matrix runs it
        # drafted the chains of 2 and 3 in 25-36% of MT-bench's greedy batch-1 rounds where the calibration priced
        # the chain of 3 barely above the chain of 2 (7.44 against 7.19 ms; the engine ran them at ~9.5 and ~8.0)
        # and gained nothing measurable in one process (+0.9, +1.4 and -1.4 points against it off: `ab_mt_t0_3.txt`,
        # `_4`, `_5`): the prices of the deeper chains are the least reliable part of a calibration on a shared VM.
        for i, w in enumerate(p.tries[: len(t.tries)]):
            if 0.0 < w < t.tries[i]:
                t.hits[i], t.tries[i] = t.hits[i] * w / t.tries[i], w
        spread = self.spreads[sampled].prior() if self.spread_prior else None
        if spread is not None:  # depth 1 from the requests before it, not the pool's latest verifications
            m, k = spread
            t.set_depth(1, m, min(k, SPREAD_PRIOR_MAX))
        self._sampled[row] = sampled
        self._own[row] = AcceptanceTracker(p.decay, (0.0,), 0.0)
        self._quiet = None
        # Alone in the batch (every batch of 1), its own acceptance is all the batch's evidence and none of it is
        # known yet: the paused batch probes ``probe_every`` steps after it joined. The waits doubled over the
        # requests before it (and the paused steps counted since their last probe) would otherwise leave it
        # unprobed for its whole budget, or probe it at once, before it recorded a pair. Joining other rows, it
        # keeps their schedule: a probe's catch-up encodes every row's waiting prompt and pairs, and restarting
        # the waits at every admission cost batch-4 HumanEval 9% (0.91x, two runs) for probes that rarely resumed.
        # Its first probe looks back even where the pooled acceptance says no recovery could pay
        # (``_probe_could_pay``): else a pool dragged low by one request is never corrected, since a skipped probe
        # observes nothing (seen in session 21: T=1 HumanEval, the sampled pool's depth-1 rate at 0.22 after one
        # request accepted ~5%, no probe in the next 13 requests, `--tree auto` 0.96x vanilla where the chain of 1
        # ran 1.06x and the requests' own rates were ~0.3-0.4). One look-back a request: a catch-up over its
        # prompt and first pairs (~1 plain step at batch 1), which drafting needs anyway if it resumes.
        # Since session 32 that look-back is priced against what it could find where enough requests were seen
        # (``_probe_worth``), except for every ``EXPLORE_EVERY``-th request, which keeps the rule above.
        if len(self.rows) == 1:
            self._probe_wait, self._since_draft = self.probe_every, 0
            self._explore = True
            self._explore_forced = self._alone_started % EXPLORE_EVERY == 0
            self._alone_started += 1

    def end_row(self, row: int) -> None:
        self._quiet = None
        self.rows.pop(row, None)
        sampled = self._sampled.pop(row, False)
        own = self._own.pop(row, None)
        if own is not None:
            self.spreads[sampled].add(own.hits[0], own.tries[0])

    def observe(self, rows: Sequence[int], cfg: TreeStrategy, n_accepted: Sequence[int]) -> None:
        """After verifying ``cfg`` for these rows: accepted draft tokens per row."""
        if not cfg.drafts:
            return
        self._observed += 1
        for r, k in zip(rows, n_accepted):
            pool = self.pools[self._sampled.get(r, False)]
            for t in (self.rows.setdefault(r, AcceptanceTracker()), pool):
                if isinstance(cfg, Chain):  # a chain's acceptance is per depth; other trees' per shape
                    t.update_chain(cfg.depth, k, keep_untried=self.pool_memory and t is pool)
                else:
                    t.update_shape(cfg.label, k + 1.0)
            if isinstance(cfg, Chain) and r in self._own:  # a tree's first level is not a chain's depth 1
                self._own[r].update_chain(1, min(k, 1))  # depth 1 alone: all ``_own`` is read for

    def observe_look_back(self, rows: Sequence[int], hits: Sequence[float], tries: Sequence[int]) -> None:
        """A look-back probe's evidence: per row, ``tries`` paused steps (depth-1 verifications that were never
        run) and ``hits`` the summed chance that each would have been accepted (for greedy drafts the count of
        steps whose top-1 guess was the target's next token)."""
        self._observed += 1
        for r, h, n in zip(rows, hits, tries):
            if n:
                pool = self.pools[self._sampled.get(r, False)]
                for t in (self.rows.setdefault(r, AcceptanceTracker()), pool):
                    t.update_first(h, n, keep_untried=self.pool_memory and t is pool)
                if r in self._own:
                    self._own[r].update_first(h, n)

    def observe_step(self, batch_size: int, seconds: float) -> None:
        """The latest picked step took ``seconds`` of wall time (the caller leaves out steps that did other work:
        a catch-up of the draft cache, a look-back)."""
        if self.feedback is not None and self.step is not None:
            self.feedback.observe(batch_size, self.step.label, seconds, self.step.step_s / self.step.factor,
                                  self._context)

    def observe_catch_up(self, pairs: float, seconds: float) -> None:
        """A catch-up of the draft cache encoded ``pairs`` (padded, with each forward's fixed cost in pairs:
        ``proposer.plan_catch_up``) in ``seconds``: the price of the next probes' catch-ups (none encoded: no
        price)."""
        if not (pairs >= 0 and seconds >= 0 and math.isfinite(pairs) and math.isfinite(seconds)):
            raise ValueError(f"a catch-up's pairs and seconds must be finite and >= 0, got {pairs} pairs in "
                             f"{seconds} s")
        if pairs > 0:
            self._catch_up_s = CATCH_UP_DECAY * self._catch_up_s + seconds
            self._catch_up_pairs = CATCH_UP_DECAY * self._catch_up_pairs + pairs

    def probe_cost(self, batch_size: int, rows: Sequence[int], catch_up: Callable[[], float] | None = None) -> float:
        """What a probe costs now, in plain steps: its catch-up's pairs (``catch_up()``) at the timed price of
        a pair against a plain step at this batch size and context; ``PROBE_COST_STEPS`` until a catch-up was
        timed or without the count."""
        if catch_up is None or not self._catch_up_pairs:
            return PROBE_COST_STEPS
        return self._pairs_in_steps(catch_up(), batch_size, rows)

    # ----------------------------------------------------------------------------------------- choice
    def _batch_tracker(self, rows: Sequence[int]) -> AcceptanceTracker:
        ts = [self.rows[r] for r in rows if r in self.rows] or [self.pools[False]]
        n = max(len(t.hits) for t in ts)
        rates = [sum((t.rates() + [0.0] * n)[i] for t in ts) / len(ts) for i in range(n)]
        shapes = {}
        for label in {k for t in ts for k in t.shape_tokens}:
            have = [t.shape_tokens[label] for t in ts if label in t.shape_tokens]
            shapes[label] = (sum(s / w for s, w in have) / len(have), 1.0)
        return AcceptanceTracker(1.0, tuple(rates), 1.0, shape_tokens=shapes)

    def pick(self, batch_size: int, rows: Sequence[int] | None = None, context: float | None = None,
             look_back: bool = False, budget: Sequence[int] | None = None,
             catch_up: Callable[[], float] | None = None,
             resume: Callable[[], float] | None = None) -> TreeStrategy:
        """context: the rows' mean committed length (None: priced at the calibration's context); look_back: the
        caller can score its head on the paused steps' pairs, so a due probe sets ``look_back_due`` and keeps
        the step plain instead of drafting; budget: the tokens each row may still generate (None: unknown), so
        that a due probe is skipped where no row has enough left for a resume to repay it; catch_up: counts the
        pairs a probe of these rows would encode now (called only when a probe is due), to price it; resume:
        counts the pairs the catch-up that drafting needs first would encode (a waiting prompt, the pairs
        recorded while paused; called only when a choice is made), so that drafting starts only where the budget
        repays it (``_start_margin``). The proposer passes one counter as both."""
        rows = rows if rows is not None else list(self.rows)
        self._context = context
        self.look_back_due = False
        bucket = None if context is None else int(context) // CONTEXT_BUCKET
        if self._quiet is not None and self._quiet_step(batch_size, rows, bucket):
            return self.none
        if self._probe_left > 0:  # inside a probe run: keep drafting the probe, re-choose right after it
            self._probe_left -= 1
            self._steps += 1
            return self._probe_step(batch_size, rows)
        # Re-choose every repick_every steps, but only on new evidence: while paused nothing is observed, and
        # the same answer cost ~0.1 ms a step on the 2-core EPYC (~1% of a paused step); a context grown by
        # CONTEXT_BUCKET tokens is new evidence too.
        costs = self._costs(rows)
        evidence = (batch_size, tuple(rows), self._observed, bucket, costs is self._sampled_costs,
                    self.feedback.drafted if self.feedback is not None else 0)
        if (self._steps % self.repick_every == 0 and evidence != self._chosen_on) or self.last is None \
                or self._probe_done:
            self._chosen_on = evidence
            start = self._start_margin(batch_size, rows, budget, resume)
            self.last = choose(costs, batch_size, self._shapes, self._batch_tracker(rows),
                               self._margin(batch_size, rows) if start is None else start, context,
                               self._factors(batch_size), drafting=self._current.drafts and start is None,
                               keep_margin=self._keep_margin(batch_size, rows))
            self._current = self.candidates.get(self.last.label, self.none)
        self._steps += 1
        cfg, self.step = self._current, self.last
        if not cfg.drafts:
            self._since_draft += 1
            if self._since_draft >= self._probe_wait and self.candidates:
                self._since_draft = 0
                self._probe_wait = min(2 * self._probe_wait, self.max_probe_every)
                explore, self._explore = self._explore and look_back and len(rows) == 1, False
                # an explore hopes for at least EXPLORE_FLOOR (which only widens what could pay: one check)
                explore = explore and (not budget or max(budget) >= self.probe_every)
                spread = look_back and self.spread_probes and not (explore and self._explore_forced)
                if self._probe_could_pay(batch_size, rows, budget, catch_up, floor=EXPLORE_FLOOR if explore else None,
                                         spread=spread):
                    if look_back:  # the caller scores the head on the recorded pairs; chosen again next step
                        self.look_back_due = self._probe_done = True
                        return cfg
                    self._probe = min(self.candidates.values(), key=lambda c: c.num_nodes)  # the cheapest
                    self._probe_left = self.probe_steps - 1
                    return self._probe_step(batch_size, rows)
        else:
            self._since_draft = 0
            self._probe_wait = self.probe_every  # drafting pays again: probe soon after the next pause
            self._explore = False  # it drafts: its own acceptance is being observed
            deeper = self._deeper(batch_size, rows, cfg, budget) if (self._steps - 1) % self.repick_every == 0 else None
            if deeper is not None:  # a run of the next longer chain, chosen again right after it
                self._probe, self._probe_left = deeper, self.deepen_steps - 1
                return self._probe_step(batch_size, rows)
        self._probe_done = False
        if not cfg.drafts and evidence == self._chosen_on:  # paused on this evidence, no probe due: the next picks
            self._quiet = self._quiet_key(batch_size, rows, bucket)  # on the same evidence are ``_quiet_step``s
        return cfg

    def _quiet_step(self, batch_size: int, rows: Sequence[int], bucket: int | None) -> bool:
        """A pick that ``pick`` would answer with ``none`` and no probe, taken in a few comparisons: the batch
        is paused on the evidence it was last chosen on, that evidence has not changed since (the same rows,
        context bucket, observations, pricing and drafted steps: ``pick`` would not choose again), and no probe
        falls due at this step. Advances the counters as ``pick`` does; False where the whole pick must run.
        Compares the key only: a row that starts or ends drops ``_quiet`` (its request may sample).
        A paused step's proposer work (propose, commit, the price check) was ~75-95 us of a 5-9 ms step at batch 1
        and 4 on a 2-core EPYC, and the whole pick 12 us of it, 4 this way (``quiet_ab.txt`` in
        `docs/results/epyc-2026-11-29-s30/`)."""
        if self._since_draft + 1 >= self._probe_wait or self._quiet != self._quiet_key(batch_size, rows, bucket):
            self._quiet = None
            return False
        self._steps += 1
        self._since_draft += 1
        self.step = self.last
        return True

    def quiet_run(self) -> int:
        """How many of the next picks would be ``_quiet_step``s if they came with the rows of the latest pick, each
        adding one token to every row (paused steps do): 0 unless the latest pick paused on unchanged evidence
        (``_quiet`` set). The run ends before a probe falls due and before the context enters another bucket
        (``CONTEXT_BUCKET``) or price band (``StepCostFeedback.band``, which ``observe_step`` reads from the
        latest pick's context). A caller that skips those picks says how many with ``skip_quiet`` before it
        calls anything else here."""
        if self._quiet is None or self._context is None:
            return 0
        c = int(self._context)  # a paused step adds one token to every row: the mean context grows by one
        edge = (c // CONTEXT_BUCKET + 1) * CONTEXT_BUCKET
        if self.feedback is not None:
            edge = min(edge, (c // self.feedback.band + 1) * self.feedback.band)
        return max(0, min(self._probe_wait - self._since_draft - 1, edge - c - 1))

    def skip_quiet(self, steps: int) -> None:
        """``steps`` quiet picks (``quiet_run``) the caller took for granted: the counters advance as they would
        have."""
        if not 0 <= steps <= self.quiet_run():
            raise ValueError(f"skip_quiet: {steps} steps, but the latest pick allows a quiet run of "
                             f"{self.quiet_run()}")
        self._steps += steps
        self._since_draft += steps

    def _quiet_key(self, batch_size: int, rows: Sequence[int], bucket: int | None) -> tuple:
        """The part of a pick's evidence that a quiet pick compares: all of it but which rows sample."""
        drafted = self.feedback.drafted if self.feedback is not None else 0
        return batch_size, tuple(rows), bucket, self._observed, drafted

    def _deeper(self, batch_size: int, rows: Sequence[int], cfg: TreeStrategy,
                budget: Sequence[int] | None) -> Chain | None:
        """The next longer candidate chain, when a request alone in its batch drafts a chain whose next depth's
        acceptance rests on less than ``DEEPEN_BELOW`` verifications' worth of evidence (it ages while only
        shorter chains are drafted) and would make that chain pay at ``probe_optimism`` times its estimate;
        else None. See ``DEEPEN_STEPS``."""
        if not self.deepen_steps or batch_size > 1 or not isinstance(cfg, Chain) or not rows \
                or rows[0] not in self.rows or budget and max(budget) < self.deepen_steps:
            return None
        nxt = min((c for c in self.candidates.values() if isinstance(c, Chain) and c.depth > cfg.depth),
                  key=lambda c: c.depth, default=None)
        t = self.rows[rows[0]]
        if nxt is None or (t.tries[cfg.depth] if len(t.tries) > cfg.depth else 0.0) >= DEEPEN_BELOW:
            return None
        hopeful = _hopeful(t.rates(), self.probe_optimism, cfg.depth)
        costs, factors = self._costs(rows), self._factors(batch_size)
        now = score(costs, batch_size, cfg.label, cfg.num_nodes, cfg.max_depth, t, self._context,
                    factors.get(cfg.label, 1.0))
        then = score(costs, batch_size, nxt.label, nxt.num_nodes, nxt.max_depth, hopeful, self._context,
                     factors.get(nxt.label, 1.0))
        return nxt if now is not None and then is not None and then.predicted_speedup > now.predicted_speedup else None

    def _start_margin(self, batch_size: int, rows: Sequence[int], budget: Sequence[int] | None,
                      resume: Callable[[], float] | None) -> float | None:
        """The predicted speedup a tree must reach to be drafted when drafting must first catch the draft cache up
        (``resume()`` pairs waiting: a new request's prompt, the pairs recorded while paused): resuming at speedup
        S saves R * (1 - 1/S) plain steps over the R tokens the row with the most left may still generate, and must
        save what the catch-up costs (C plain steps, at the timed price of a pair: ``_pairs_in_steps``), so
        S >= R / (R - C), and at least the usual margin; infinite (never) where C >= R. None where nothing waits,
        the budget is unknown or no catch-up was timed yet (then the usual margins, and a drafting batch keeps its
        tree by ``keep_margin``). Seen before this rule (session 29, 2-core EPYC, Spec-Bench first turns at T=1,
        batch 1, `docs/results/epyc-2026-11-28-s29/t1_diag.txt`): the catch-ups of a request with a 400-770-token
        prompt took 20-54 ms (5-13 plain steps), while `--tree auto` drafted chains predicted at 1.00-1.07x over the
        ~110 tokens left, which save at most ~7 steps."""
        if resume is None or not budget or not self._catch_up_pairs:
            return None
        pairs = resume()
        if pairs <= 0:
            return None
        cost, left = self._pairs_in_steps(pairs, batch_size, rows), max(budget)
        return math.inf if cost >= left else max(self._margin(batch_size, rows), left / (left - cost))

    def _pairs_in_steps(self, pairs: float, batch_size: int, rows: Sequence[int]) -> float:
        """What encoding ``pairs`` through the head costs, in plain steps at this batch size and context, at the
        timed price of a pair (``observe_catch_up``; call only once one was timed)."""
        plain = self._costs(rows).verify_cost(batch_size, 1, self._context)
        return pairs * (self._catch_up_s / self._catch_up_pairs) / plain if plain > 0 else PROBE_COST_STEPS

    def _margin(self, batch_size: int, rows: Sequence[int]) -> float:
        """What a tree's predicted speedup must beat to be drafted: ``margin`` alone in the batch,
        ``batched_margin`` with other rows (see ``BATCHED_MARGIN``), at least ``sampled_margin`` where a row
        samples (``SAMPLED_MARGIN``)."""
        m = self.margin if batch_size <= 1 else self.batched_margin
        return max(m, self.sampled_margin) if self._samples(rows) else m

    def _keep_margin(self, batch_size: int, rows: Sequence[int]) -> float | None:
        """What a drafting batch's best tree must keep predicting, in plain steps' speedups (``choose``): alone in
        the batch ``keep_margin`` (``sampled_keep_margin`` where it samples), None (the start margin both ways)
        with other rows."""
        if batch_size > 1:
            return None
        return self.sampled_keep_margin if self._samples(rows) else self.keep_margin

    def _factors(self, batch_size: int) -> dict[str, float]:
        return self.feedback.factors(batch_size, self._context) if self.feedback is not None else {}

    def _costs(self, rows: Sequence[int]) -> CostTable:
        """The calibration that prices these rows' steps: the sampled one if any of them samples (its plain
        and tree steps both cost more than greedy ones), else the greedy one."""
        return self._sampled_costs if self._samples(rows) else self.costs

    def _samples(self, rows: Sequence[int]) -> bool:
        """Whether any of these rows samples (T > 0): its batch is priced, and its margins set, as sampled."""
        return any(self._sampled.get(r, False) for r in rows)

    def _probe_could_pay(self, batch_size: int, rows: Sequence[int], budget: Sequence[int] | None = None,
                         catch_up: Callable[[], float] | None = None, floor: Sequence[float] | None = None,
                         spread: bool = False) -> bool:
        """Whether drafting would pay if the rows' acceptance were ``probe_optimism`` times what it is now
        (``batched_probe_optimism`` with several rows; at every depth, at most 1), and by enough, over the most
        tokens a row has left (``budget``), to win back what the probe costs (``probe_cost`` plain steps):
        a probe costs a catch-up over every pair recorded while paused (1-2% of the paused steps at batch 4 on a
        2-core Xeon), which is wasted where no
        plausible recovery makes a tree pay (at batch 4 a chain of 1 needed ~0.45 depth-1 acceptance there, and
        T=1 requests showed ~0.25), or where too few tokens are left for it to: resuming at speedup S over R
        tokens saves R * (1 - 1/S) plain steps (a 128-token request's third probe, 16 tokens before its end,
        saves at most 0.3 of a step at S = 1.02).
        ``floor``: per-depth rates the hope starts from at least (``EXPLORE_FLOOR`` for a request alone that
        explores). ``spread``: a look-back, priced against the requests before it where they can say
        (``_probe_worth``) instead of by the optimist's hope."""
        if spread:
            worth = self._probe_worth(batch_size, rows, budget, catch_up)
            if worth is not None:
                return worth
        optimism = self.probe_optimism if batch_size <= 1 else self.batched_probe_optimism
        rates = self._batch_tracker(rows).rates()
        if floor is not None:
            rates = [max(r, f) for r, f in itertools.zip_longest(rates, floor, fillvalue=0.0)]
        hopeful = _hopeful(rates, optimism)
        best = choose(self._costs(rows), batch_size, self._shapes, hopeful, self._margin(batch_size, rows),
                      self._context, self._factors(batch_size))
        if best.label == PLAIN:
            return False
        return not budget or max(budget) * (1.0 - 1.0 / best.predicted_speedup) >= self.probe_cost(
            batch_size, rows, catch_up)

    def _probe_worth(self, batch_size: int, rows: Sequence[int], budget: Sequence[int] | None,
                     catch_up: Callable[[], float] | None) -> bool | None:
        """Whether a look-back by a request alone in its batch is worth its catch-up, from what the requests before
        it showed (``RequestSpread``): its depth-1 rate r is read at ``SPREAD_QUANTILES`` of the posterior given
        its own evidence, and at each the best tree would save R * (1 - 1/S(r)) plain steps over the R tokens it
        has left (0 where nothing beats the start margin); the look-back is made where the mean saving is at least
        ``probe_cost``. (The saving assumes the look-back would reveal r exactly: it overrates a look-back of 16-32
        pairs, so the rule errs towards looking.) None where this cannot say: several rows, an unknown budget,
        fewer requests counted than the spread needs (then ``_probe_could_pay``).
        Seen before (session 32, 2-core EPYC, 26 Spec-Bench first turns at T=1, batch 1, two passes;
        `docs/results/epyc-2026-11-29-s32/t1_costs.txt`): the optimist's rule (1.5 times the request's rate)
        looked back 101 times in 52 requests, each step 14.7 ms against 5.5 for a plain one (2.6% of the run),
        while the chains it drafted in 10% of the rounds gained 0.6%: `--tree auto` ran 0.968x vanilla."""
        if batch_size > 1 or len(rows) != 1 or not budget or rows[0] not in self._own:
            return None
        own = self._own[rows[0]]
        post = self.spreads[self._sampled.get(rows[0], False)].posterior(own.hits[0], own.tries[0])
        if post is None:
            return None
        mean, sd = post
        rates = self._batch_tracker(rows).rates()
        costs, factors, left = self._costs(rows), self._factors(batch_size), max(budget)
        saved = 0.0
        for z in SPREAD_QUANTILES:
            r = min(1.0, max(0.0, mean + z * sd))
            best = choose(costs, batch_size, self._shapes, AcceptanceTracker(1.0, (r, *rates[1:]), 1.0),
                          self._margin(batch_size, rows), self._context, factors)
            if best.label != PLAIN:
                saved += left * (1.0 - 1.0 / best.predicted_speedup)
        return saved / len(SPREAD_QUANTILES) >= self.probe_cost(batch_size, rows, catch_up)

    def _probe_step(self, batch_size: int, rows: Sequence[int]) -> TreeStrategy:
        """One step of a probe run; the choice is made again from its evidence once the run ends."""
        cfg = self._probe
        self.step = score(self._costs(rows), batch_size, cfg.label, cfg.num_nodes, cfg.max_depth,
                          self._batch_tracker(rows), self._context,
                          self._factors(batch_size).get(cfg.label, 1.0)) or self.last
        self._probe_done = self._probe_left == 0
        return cfg
