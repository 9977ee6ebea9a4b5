"""Proposers for the generation loop: the EAGLE drafter and a replay drafter (tests, overhead benchmark).

Alignment of draft inputs (docs/TRAINING.md, "Alignment"): the draft pair at position i is (feature f_i, token
t_{i+1}); its output o_i approximates f_{i+1}, and logits(o_i) is the draft distribution of t_{i+2}.
After the target prefill over t_0..t_{P-1} and the first sampled token t_P (the pending token), the draft
cache holds the P pairs (f_i, t_{i+1}), i < P, and `last_h` = o_{P-1} ~ f_P: the children of the root
(t_P) come straight from logits(last_h), with no draft forward. A node x at depth d >= 1 is expanded by the
draft pair (o_parent, x) at position P + d - 1.

Draft-KV alignment after verification, for an accepted path root, a_1..a_k and the
bonus token b, the new committed pairs are (f_root, a_1), (f_a1, a_2), ..., (f_ak, b):
- "stable" (the EAGLE reference): re-encode all k+1 pairs with the target's TRUE features;
- "last" (Meta): keep the K/V that drafting already computed (from predicted features) for accepted nodes
  that were expanded, compacted into place, and re-encode only the remaining suffix with true features
  (usually the last accepted token and the bonus pair).

Paused drafting (the ``NoDraft`` strategy, label ``none``: the dispatcher found that no tree pays) is lazy: a
plain step commits one pair (f_root, bonus) per row, which is only recorded (feature and token, in a buffer of
``max_lag`` pairs per row); the draft cache catches up in one batched head forward over the recorded pairs (or a
few, rows grouped by how many pairs wait: ``plan_catch_up``) when drafting resumes (or a probe drafts or looks
back, or the buffer is full). A paused step therefore costs the target forward alone, and the catch-up computes
exactly what encoding the pairs one step at a time would have (same pairs, same positions, causal attention), in
one forward instead of one per step. The prompt's
pairs are lazy too (with ``max_lag > 0``): ``prefill`` keeps them, and the first catch-up encodes them ahead of
the row's recorded pairs, in the same forward; a request that never drafts never runs the head.

A look-back probe (the dispatcher's, while paused) is a catch-up that also scores the head on the recorded
pairs: the output of pair j, (f_root_j, bonus_j), is what a chain would have drafted from at step j + 1. A
top-1 guess is accepted there exactly when it equals bonus_{j+1}, the token the target committed (under
sampling, the committed token equals the guess with the probability that verification would accept it); a
child drawn at a temperature from q is accepted with probability sum_x min(p(x), q(x)), whose unbiased
estimate from the drawn bonus x ~ p is min(1, q(x) / p(x)): paused steps record p(bonus) for it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

from eaglespec.runtime import cpu_kernels
from eaglespec.runtime.kvcache import HostRows
from eaglespec.runtime.logits import argmax
from eaglespec.spec.costmodel import Choice
from eaglespec.spec.heads import DraftHead
from eaglespec.spec.sampling import one_token_acceptance
from eaglespec.spec.strategies import Chain, TreeDispatcher, TreeStrategy
from eaglespec.spec.tree import DraftTree, expand_static

Alignment = Literal["stable", "last"]

LAG_CHUNK = 64  # recorded pairs per row the paused buffer starts with (it doubles up to max_lag)
CATCH_UP_FORWARD_PAIRS = 16  # a head forward's fixed cost in encoded pairs: a catch-up forward took ~0.6-0.9 ms
# plus 25-39 us a pair on a 2-core EPYC (1 and 4 rows; docs/results/epyc-2026-11-28-s25/catch_up_forward.txt), so
# that rows whose waiting pairs differ a lot (a 400-token prompt beside a 50-token one) are cheaper in forwards of
# their own (``plan_catch_up``)
PLAIN_TIMED_EVERY = 4  # a paused step in this many is timed for the dispatcher's price check (``propose``): the
# check of one took 17-19 us of a 5-9 ms step (batch 1 and 4, 2-core EPYC; paused_step_ab.txt in
# docs/results/epyc-2026-11-29-s30/), and the plain price it keeps (a decayed mean over ~100 timed steps) then
# spans ~400 paused steps, a few seconds
LOOK_BACK = 32  # recorded pairs per row a look-back probe scores (the latest ones): ~1 ms of draft logits at
# batch 1 on a 2-core Xeon, where each step of a probe that drafts costs 1.4-1.6 plain steps (~10 ms each)


def plan_catch_up(widths: Sequence[int], fixed: int = CATCH_UP_FORWARD_PAIRS) -> list[list[int]]:
    """Group the rows of a catch-up (``widths``: the pairs each encodes; rows with none are left out) into head
    forwards, each padded to its longest row, for the fewest padded pairs plus ``fixed`` a forward: rows sorted
    by width, cut into runs by dynamic programming (exact for that cost, since an optimal grouping never puts a
    row between two others of another forward). Returns lists of indices into ``widths`` (in index order within
    a forward), the forward of the shortest rows first.
    A paused batch of 4 whose prompts were 233, 402, 54 and 73 tokens padded them all to the longest: 4 x 418
    pairs with 16 recorded pairs each, against 826 in a forward a row."""
    order = sorted((b for b, w in enumerate(widths) if w > 0), key=lambda b: widths[b])
    best, cut = [0] + [None] * len(order), [0] * (len(order) + 1)  # best[j]: the cost of the first j rows
    for j in range(1, len(order) + 1):
        for i in range(j):
            c = best[i] + (j - i) * widths[order[j - 1]] + fixed
            if best[j] is None or c < best[j]:
                best[j], cut[j] = c, i
    groups, j = [], len(order)
    while j:
        groups.append(sorted(order[cut[j]:j]))
        j = cut[j]
    return groups[::-1]


def catch_up_cost(groups: Sequence[Sequence[int]], widths: Sequence[int], fixed: int = CATCH_UP_FORWARD_PAIRS) -> int:
    """The pairs the forwards of ``plan_catch_up`` encode, padding included, plus ``fixed`` a forward."""
    return sum(len(g) * max(widths[b] for b in g) + fixed for g in groups)


def _row_block(host: HostRows | None) -> slice | None:
    """The rows of ``host`` as a slice of the per-row buffers when they are contiguous (reads and writes through
    views instead of gathers and index writes), else None (no host rows, or scattered ones)."""
    if host is None or not host.rows:
        return None
    r0 = host.rows[0]
    return slice(r0, r0 + len(host.rows)) if host.rows == tuple(range(r0, r0 + len(host.rows))) else None


@dataclass
class _Drafted:
    """Bookkeeping of one propose() call, used by commit()."""

    prefix: Tensor  # int64 [B] draft/target prefix length P when drafting started
    node_slot: Tensor | None  # int64 [B, N]: offset (from P) of the draft slot holding each node's drafted pair,
    # -1 if none; None when no node has one (strategies.Strategy.draft)
    host: HostRows | None  # the rows and their lengths P on the host, when the engine passed them


class EagleProposer:
    """Drafts trees with an EAGLE head; the tree strategy per step comes from a dispatcher keyed by batch size.

    It is the `strategies.Drafter` of the step: the strategy decides the tree, and asks this proposer for the
    root features, children (top-k or sampled) and the draft forwards of expanded nodes."""

    def __init__(self, head: DraftHead, trees: TreeDispatcher | TreeStrategy, alignment: Alignment = "stable",
                 draft_temperature: float | None = None, seed: int | None = None, max_lag: int = 1024):
        """draft_temperature: 0 = children are the draft's top-k tokens (valid at any target temperature);
        > 0 = children are SAMPLED without replacement from softmax(draft logits / draft_temperature) and
        verified with the sampled-children rule (chain and static trees only: a dynamic tree's rerank may
        drop an earlier-sampled sibling while keeping a later one, which that rule does not allow).
        None (the default) = each request's own temperature: a greedy request drafts top-k children, a
        sampled one (T > 0) samples its children at its T wherever the step's tree allows it (chain and
        static; a dynamic tree drafts top-k for every row). A sampled child is accepted with probability
        sum_x min(p(x), q(x)), a top-1 child with p(top-1) only: on the shipped head at T=1 (MT-bench, chain
        of 1), depth-1 acceptance 0.34 against 0.20 (docs/DISPATCH.md, "Sampled requests").

        Draft sampling draws from one generator per cache row, seeded at `prefill` from the request's seed
        (the engine passes them), so a row's drafts do not depend on the other rows of its batch. `seed`
        (server/CLI `--seed`) is mixed into every row's seed; rows whose prefill gives none use `seed + row`
        (random when None).

        max_lag: pairs of paused (``none``) steps recorded per row before the draft cache catches up
        (module docstring); 0 = encode each one at its step (no buffer)."""
        if max_lag < 0:
            raise ValueError(f"max_lag must be >= 0, got {max_lag}")
        if alignment not in ("stable", "last"):
            raise ValueError(f"alignment must be 'stable' or 'last', got {alignment!r}")
        self.head = head
        # a fixed tree, a table by batch size (TreeDispatcher) or the acceptance-aware dispatch.AdaptiveDispatcher
        self.dispatcher = TreeDispatcher({1: trees}) if isinstance(trees, TreeStrategy) else trees
        if draft_temperature is not None and not draft_temperature >= 0:
            raise ValueError(f"draft_temperature must be >= 0 or None (each request's own), got {draft_temperature}")
        refused = [c.label for c in self.dispatcher.configs if not c.samples_children]
        if draft_temperature is not None and draft_temperature > 0 and refused:
            raise ValueError(f"draft sampling (draft_temperature > 0) needs chain or static trees, not "
                             f"{', '.join(refused)}: a dynamic tree's rerank can break the sampled-children order")
        self.draft_temperature = draft_temperature
        self.seed = seed
        self._row_temperature: dict[int, float] = {}  # cache row -> the temperature its children are drawn at
        self._generators: dict[int, torch.Generator] = {}  # cache row -> draft sampler (rows drawing at T > 0)
        self._step_generators: list[torch.Generator] | None = None  # of the rows of the current propose()
        self._step_temperature: Tensor | None = None  # float32 [B]: the rows' draft temperatures (0 = top-k)
        self.alignment = alignment
        self.hidden_indices = head.hidden_indices
        self.max_tree_nodes = max(c.num_nodes for c in self.dispatcher.configs)
        # Drafted pairs per step never exceed the tree's nodes; the commit forward writes <= depth + 1.
        self._draft_slack = self.max_tree_nodes + 1
        self.cache = None
        self.last_h: Tensor | None = None  # [max_batch, H] draft output of each row's last committed pair
        self._drafted: _Drafted | None = None
        self._host: HostRows | None = None  # of the current propose()
        self._rows: Tensor | None = None  # the rows and prefix lengths of the current propose()
        self._prefix: Tensor | None = None
        self.max_lag = max_lag
        # [max_batch, C, F] target features of paused pairs and int64 [max_batch, C] their tokens (the bonus of
        # each step); C grows by doubling from LAG_CHUNK up to max_lag as the paused stretch lengthens
        self._lag_feat: Tensor | None = None
        self._lag_tok: Tensor | None = None
        self._lag_p: Tensor | None = None  # float32 [max_batch, C]: the probability each bonus was drawn with
        self._lag_n: Tensor | None = None  # int64 [max_batch] recorded pairs per row
        self._lag_bound = 0  # host-side bound of _lag_n over the active rows: paused steps since the catch-up
        # host copy of _lag_n's non-zero entries (row -> pairs written to the buffer; the run below adds its steps
        # when it is written), kept while every step comes with host rows; None once one did not (the device
        # counts are then the only ones)
        self._lag_host: dict[int, int] | None = {}
        # recorded steps not yet in the buffer (``_record_paused``): per step (feature [B, 1, F], bonus [B], its
        # probability [B] or None for greedy steps) of the rows _lag_run_rows, the first step's pair of each at
        # its slot in _lag_run_start
        self._lag_run: list[tuple[Tensor, Tensor, Tensor | None]] = []
        self._lag_run_rows: tuple[int, ...] = ()
        self._lag_run_start: tuple[int, ...] = ()
        # row -> its prompt's pairs, not encoded yet (max_lag > 0): target features [P, F] and next tokens [P]
        self._prompts: dict[int, tuple[Tensor, Tensor]] = {}
        self._prompt_n: Tensor | None = None  # int64 [max_batch]: P of a row whose prompt waits, else 0
        self.step_label: str | None = None  # the tree of the latest propose() (its strategy's label)
        self.step_choice: Choice | None = None  # the cost model's prediction for it (adaptive dispatch only)
        self._timed = 0  # batch size of the latest propose() when its step is the chosen tree's work alone, else 0
        self._plain_steps = 0  # paused steps so far: one in PLAIN_TIMED_EVERY is timed (``observe_step_time``)
        # A quiet run (``AdaptiveDispatcher.quiet_run``): paused steps of the rows ``_quiet_rows`` that the latest
        # pick vouched for, taken without asking the dispatcher (``_quiet_left`` more), ``_quiet_taken`` of them
        # not yet told (``_settle_quiet``). Such a step costs a comparison and the root tree: a paused step's
        # proposer work was ~55 us beyond vanilla's at batch 1 on a 2-core EPYC, most of it the dispatcher's pick
        # and the layers of calls around it, run after a target forward that leaves the caches cold.
        self._quiet_left = self._quiet_taken = 0
        self._quiet_rows: tuple[int, ...] | None = None
        self._quiet_step = False  # the latest propose() was a step of a quiet run

    # ------------------------------------------------------------------------------- engine protocol

    def reserve(self, max_batch: int, max_len: int) -> None:
        self.cache = None
        # + max_lag: a catch-up writes the bound of every row's lag, past the shorter lags' ends
        self.cache = self.head.new_cache(max_batch, max_len + self._draft_slack + self.max_lag)
        self.last_h = torch.zeros(max_batch, self.head.config.hidden_size, dtype=self.head.dtype,
                                  device=self.head.device)
        self._lag_feat = self._lag_tok = self._lag_p = None  # allocated by the first paused step
        self._lag_n = torch.zeros(max_batch, dtype=torch.long, device=self.head.device)
        self._lag_bound = 0
        self._lag_host = {}
        self._lag_run.clear()
        self._prompts.clear()
        self._prompt_n = torch.zeros(max_batch, dtype=torch.long, device=self.head.device)
        self._quiet_left = self._quiet_taken = 0  # a new run of requests: nothing skipped is owed

    def release(self, rows: Tensor) -> None:
        self._settle_quiet()
        self._flush_lag_run()
        self.cache.reset(rows)
        self._lag_n[rows] = 0
        self._prompt_n[rows] = 0
        for r in rows.tolist():
            if self._lag_host is not None:
                self._lag_host.pop(r, None)
            self._prompts.pop(r, None)
            self._generators.pop(r, None)
            self._row_temperature.pop(r, None)
            if hasattr(self.dispatcher, "end_row"):
                self.dispatcher.end_row(r)
        if self._lag_host is not None:  # the bound of the rows that stay (else it grows over every request
            # that ever paused, and the next catch-up pads every row to it: 619 pairs a row, seen at batch 4)
            self._lag_bound = max(self._lag_host.values(), default=0)

    def prefill(self, rows: Tensor, tokens: Tensor, lengths: Tensor, out, pending: Tensor,
                seeds: list[int] | None = None, temperatures: list[float] | None = None) -> None:
        """The prompt pairs (f_i, t_{i+1}), i < P, the last pair using the pending token: kept for the first
        catch-up (``max_lag > 0``, module docstring) or encoded now; seed each row's draft sampler from `seeds`
        (one per row); ``temperatures``: each row's request temperature (None: greedy requests)."""
        temps = [float(t) for t in temperatures] if temperatures is not None else [0.0] * rows.numel()
        for b, r in enumerate(rows.tolist()):
            self._row_temperature[r] = temps[b] if self.draft_temperature is None else self.draft_temperature
            if self._row_temperature[r] > 0:
                self._new_generator(r, None if seeds is None else seeds[b])
        self._settle_quiet()
        if hasattr(self.dispatcher, "start_row"):
            for b, r in enumerate(rows.tolist()):
                self.dispatcher.start_row(r, temps[b] > 0)
        B, T = tokens.shape
        feats = self.head.target_feature(out).to(self.head.dtype)  # [B, T, F]
        shifted = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)  # [B, T]: t_{i+1}
        shifted.scatter_(1, (lengths - 1)[:, None], pending[:, None])
        if self.max_lag > 0:
            for r, f, t, n in zip(rows.tolist(), feats, shifted, lengths.tolist()):
                self._prompts[r] = (f[:n], t[:n])
            self._prompt_n[rows] = lengths
            return
        h = self.head.fuse(feats, prefill=True)  # [B, T, H]
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        o = self.head(h, shifted, positions, self.cache, rows=rows, prefill=True)  # [B, T, H]
        self.cache.advance(rows, lengths)
        self.last_h[rows] = o.gather(1, (lengths - 1)[:, None, None].expand(B, 1, o.shape[-1]))[:, 0]

    def _new_generator(self, row: int, seed: int | None) -> torch.Generator:
        """The draft sampler of ``row``: from the request's draft seed, mixed with the proposer's own seed when it
        has one; without a request seed, ``seed + row`` (random when the proposer has none either)."""
        if seed is None:
            s = self.seed + row if self.seed is not None else int(torch.randint(0, 2**62, ()))
        else:
            s = seed if self.seed is None else (seed * 1_000_003 + self.seed) % 2**63
        self._generators[row] = g = torch.Generator(device=self.head.device).manual_seed(s)
        return g

    def propose(self, rows: Tensor, pending: Tensor, prefix_lengths: Tensor,
                host: HostRows | None = None, budget: Sequence[int] | None = None) -> DraftTree:
        """host: the rows and lengths as held on the host (the engine passes them): no draft forward reads
        the device then; budget: the tokens each row may still generate (the dispatcher skips probes that
        could not pay within them)."""
        self._host = host
        if self._quiet_left and host is not None and host.rows == self._quiet_rows and self._lag_bound < self.max_lag:
            # a pick the dispatcher would answer with ``none`` and nothing else (``AdaptiveDispatcher.quiet_run``)
            self._quiet_left -= 1
            self._quiet_taken += 1
            self._quiet_step = True
            self._time_plain(len(host.rows))
            return self._cfg.draft(self, pending)[0]
        self._settle_quiet()
        self._quiet_step = False
        ids = host.rows if host is not None else rows.tolist()
        n = len(ids)
        if hasattr(self.dispatcher, "observe"):  # acceptance-aware: the batch's rows pick the tree (the bench's
            # warm-up swaps the dispatcher: asked every step)
            context = sum(host.lengths) / n if host is not None and host.lengths else None
            # a probe may look back over the recorded pairs instead of drafting (``_look_back``)
            waiting = lambda: self.catch_up_pairs(ids)  # noqa: E731 - what a probe's or a resume's catch-up encodes
            cfg = self.dispatcher.pick(n, ids, context, look_back=self.max_lag > 0, budget=budget,
                                       catch_up=waiting, resume=waiting)
        else:
            cfg = self.dispatcher.pick(n)
        self._cfg = cfg
        self.step_label = cfg.label
        self.step_choice = getattr(self.dispatcher, "step", None)
        # Rows at T > 0 draw their children from their own generators (rows at 0 take the top-k in the same
        # step); a tree whose children cannot be sampled (dynamic) drafts top-k for every row.
        temps = [self._row_temperature.get(r, self.draft_temperature or 0.0) for r in ids] if cfg.drafts else None
        if temps and cfg.samples_children and any(t > 0 for t in temps):  # some row draws its children at a T
            # every row drawing at T > 0 has its sampler (prefill made it; a row never prefilled gets seed + row)
            self._step_generators = [(self._generators.get(r) or self._new_generator(r, None)) if t > 0 else None
                                     for r, t in zip(ids, temps)]
            self._step_temperature = torch.tensor(temps, dtype=torch.float32, device=self.head.device)
        else:
            self._step_generators = self._step_temperature = None
        look_back = getattr(self.dispatcher, "look_back_due", False)
        if not cfg.drafts and not look_back and host is not None and hasattr(self.dispatcher, "quiet_run"):
            self._quiet_left, self._quiet_rows = self.dispatcher.quiet_run(), host.rows
        # the step's batch size, for observe_step_time (0: not to be timed); a paused step is timed once in
        # PLAIN_TIMED_EVERY: they are most of a paused run's steps, and their price moves little
        if cfg.drafts:
            self._timed = n
        else:
            self._time_plain(n)
        # The engine drafts for all its active rows every step, so the bound covers every row that lags.
        if (self._lag_bound or self._prompts) and (cfg.drafts or look_back or self._lag_bound >= self.max_lag):
            self._catch_up(rows, ids, look_back)
            self._timed = 0  # the catch-up is not what the chosen tree costs
        self._rows, self._prefix = rows, prefix_lengths
        tree, node_slot = cfg.draft(self, pending)
        self._drafted = _Drafted(prefix_lengths, node_slot, host)
        return tree

    def _time_plain(self, n: int) -> None:
        """A paused step of ``n`` rows: timed for the price check (``_timed``) once in PLAIN_TIMED_EVERY."""
        self._timed = n if self._plain_steps % PLAIN_TIMED_EVERY == 0 else 0
        self._plain_steps += 1

    def _settle_quiet(self) -> None:
        """End the quiet run: the dispatcher counts the picks it skipped, and is asked again at the next step."""
        if self._quiet_taken:
            self.dispatcher.skip_quiet(self._quiet_taken)
        self._quiet_left = self._quiet_taken = 0

    def observe_step_time(self, seconds: float) -> None:
        """The engine's wall time of the latest step (propose, target forward, verification, commit): handed to
        an acceptance-aware dispatcher as the price check of the tree it chose, unless the step also caught the
        draft cache up (resuming, a look-back probe), which is not that tree's cost; of the paused steps one in
        PLAIN_TIMED_EVERY (``propose`` decides which)."""
        if self._timed and hasattr(self.dispatcher, "observe_step"):
            self.dispatcher.observe_step(self._timed, seconds)
        self._timed = 0

    def commit(self, rows: Tensor, tree: DraftTree, verdict, out, n_accepted: list[int] | None = None) -> None:
        """Append the accepted pairs to the draft cache and refresh last_h (see the module docstring).

        n_accepted: the host copy of ``verdict.n_accepted`` (the engine's one read per step). With it (and the
        host rows given to ``propose``) the "stable" alignment reads nothing back; "last" still reads how many
        drafted pairs it kept, which only the device knows."""
        if self._quiet_step and self._lag_run:  # the run's rows, as at the step before: recorded as it records
            self._run_append(out, verdict.bonus, getattr(verdict, "bonus_p", None))
            return
        if not self._cfg.drafts and self.max_lag > 0:  # a plain step is no evidence of acceptance
            self._record_paused(rows, verdict.bonus, getattr(verdict, "bonus_p", None), out)
            return
        d = self._drafted
        host_k = n_accepted if n_accepted is not None else verdict.n_accepted.tolist()
        if self._cfg.drafts and hasattr(self.dispatcher, "observe"):
            self.dispatcher.observe(list(d.host.rows) if d.host else rows.tolist(), self._cfg, host_k)
        if tree.chain and d.host is not None and (self.alignment == "stable" or d.node_slot is None):
            self._commit_chain(rows, tree, verdict, out, host_k)
        else:
            self._commit_tree(rows, tree, verdict, out, host_k)

    def _commit_tree(self, rows: Tensor, tree: DraftTree, verdict, out, host_k: list[int]) -> None:
        """``commit`` of any tree: the accepted path's pairs gathered by node index."""
        d = self._drafted
        B, D1 = verdict.path.shape  # path [B, D+1]: root first, -1 padded
        k = verdict.n_accepted  # [B]
        path = verdict.path.clamp(min=0)
        j = torch.arange(D1, device=path.device)[None, :]  # [1, D+1] pair index
        # Pair j = (f_{path[j]}, token of path[j+1]) for j < k, (f_{path[k]}, bonus) for j = k.
        next_tok = torch.cat([tree.tokens.gather(1, path[:, 1:]), verdict.bonus[:, None]], dim=1)  # [B, D+1]
        next_tok = torch.where(j == k[:, None], verdict.bonus[:, None], next_tok)
        if self.alignment == "last" and d.node_slot is not None:
            # Drafted pairs of accepted nodes a_1..a_m (m = length of the drafted prefix of the path) are kept.
            slot = d.node_slot.gather(1, path[:, 1:])  # [B, D] drafted slot of a_{j+1}'s pair, -1 if none
            have = (slot >= 0) & (j[:, :-1] < k[:, None])  # [B, D]
            m = have.long().cumprod(dim=1).sum(dim=1)  # [B] leading accepted nodes with a drafted pair
            self.cache.compact(rows, d.prefix[:, None] + slot.clamp(min=0), m)
        else:
            m = torch.zeros_like(k)
        # Re-encode pairs m..k with the target's true features.
        n_new = k + 1 - m  # [B] >= 1
        stable = self.alignment == "stable" and d.host is not None
        T = max(host_k) + 1 if stable else int(n_new.max())  # stable: m = 0, the pairs are known on the host
        idx = (m[:, None] + torch.arange(T, device=path.device)[None, :]).clamp(max=D1 - 1)  # [B, T] pair ids
        feats = self.head.target_feature(out).to(self.head.dtype)  # [B, N, F]
        f = feats.gather(1, path.gather(1, idx)[:, :, None].expand(B, T, feats.shape[-1]))  # [B, T, F]
        toks = next_tok.gather(1, idx)  # [B, T]
        positions = d.prefix[:, None] + idx  # pair j sits at the position of its feature, P + j
        host = replace(d.host, max_position=max(d.host.lengths) + D1 - 1) if stable else None
        self._append_pairs(rows, f, toks, positions, n_new, host)

    def _commit_chain(self, rows: Tensor, tree: DraftTree, verdict, out, host_k: list[int]) -> None:
        """``commit`` re-encoding every new pair of chains (the "stable" alignment, or nothing drafted to keep):
        the accepted path is nodes 0..k, so pair j is (f_j, token of node j + 1) for j < k and (f_k, bonus),
        read with slices instead of the general path's gathers; the same pairs at the same positions."""
        d = self._drafted
        T = max(host_k) + 1  # pairs of the longest row; shorter rows' extra pairs are padding, never committed
        k = verdict.n_accepted  # [B]
        f = self.head.target_feature(out)[:, :T].to(self.head.dtype)  # [B, T, F]
        host = replace(d.host, max_position=max(d.host.lengths) + T - 1)
        lengths = d.host.lengths
        if min(host_k) == T - 1 and min(lengths) == max(lengths):
            # every row accepted T - 1 nodes and starts at one length (every batch of 1): the pairs' tokens are
            # nodes 1 .. T - 1 then the bonus, at positions P .. P + T - 1, all committed (~25 us less a step)
            toks = torch.cat([tree.tokens[:, 1:T], verdict.bonus[:, None]], dim=1)  # [B, T]
            positions = torch.arange(lengths[0], lengths[0] + T, device=rows.device).expand(len(lengths), T)
            self._append_pairs(rows, f, toks, positions, k + 1, host, uniform=T)
            return
        j = torch.arange(T, device=rows.device)  # [T]
        next_tok = torch.cat([tree.tokens[:, 1:], verdict.bonus[:, None]], dim=1)[:, :T]  # [B, T]
        toks = torch.where(j[None, :] == k[:, None], verdict.bonus[:, None], next_tok)  # [B, T]
        self._append_pairs(rows, f, toks, d.prefix[:, None] + j[None, :], k + 1, host)

    def _append_pairs(self, rows: Tensor, f: Tensor, toks: Tensor, positions: Tensor, n_new: Tensor,
                      host: HostRows | None, uniform: int | None = None) -> None:
        """Both commits' end: encode the pairs (target features f [B, T, F], next tokens toks [B, T] at
        positions [B, T]) into the draft cache, commit the first n_new [B] >= 1 of each row and make the last
        committed one's output the row's last_h. ``uniform``: n_new's value when every row's is the same
        (known on the host): the last output is then a view."""
        o = self.head(self.head.fuse(f), toks, positions, self.cache, rows=rows, host=host)  # [B, T, H]
        self.cache.advance(rows, n_new)
        if uniform is not None:
            last = o[:, uniform - 1]  # [B, H]
        else:
            last = o.gather(1, (n_new - 1)[:, None, None].expand(-1, 1, o.shape[-1]))[:, 0]  # [B, H]
        block = _row_block(self._drafted.host)
        if block is not None:
            self.last_h[block] = last
        else:
            self.last_h[rows] = last

    # ------------------------------------------------------------------------------------ paused steps

    def covered_lengths(self, rows: Tensor) -> Tensor:
        """int64 [B]: committed tokens the draft state of each row covers, encoded in the draft cache or
        recorded for the catch-up; equals the target cache's lengths after every step."""
        self._flush_lag_run()
        return self.cache.lengths[rows] + self._prompt_n[rows] + self._lag_n[rows]

    def _record_paused(self, rows: Tensor, bonus: Tensor, bonus_p: Tensor | None, out) -> None:
        """A plain step's pair per row, (f_root, bonus) at the row's next draft position, recorded for the
        catch-up instead of encoded (rows [B], bonus [B]; ``out`` over the one-node trees), with the probability
        the bonus was drawn with (bonus_p [B]; None: greedy, 1) for a look-back probe's sampled estimate.

        While the steps come with host rows, the same rows step after step keep each step's feature and bonus
        tensors as they are, in a run written to the buffer (a copy a row) when something reads it
        (``_flush_lag_run``): no tensor op at all per paused step, whatever each row's lag (rows that joined the
        batch at other steps lag differently). A record of this kind took ~12 us in the engine where writing the
        slots took ~49 (2-core Xeon); at batch 4 on a 2-core EPYC (rows of unequal lags wrote their slots then)
        the paused step's proposer work was 1-2.4% of a step. Without host rows the slots are written now."""
        host, lag = self._host, self._lag_host
        if host is not None and lag is not None and host.rows:
            run = self._lag_run
            if run and self._lag_run_rows != host.rows:
                self._flush_lag_run()
            if not run:  # each lag < max_lag: propose() caught up at the bound
                self._lag_run_rows, self._lag_run_start = host.rows, tuple(lag.get(r, 0) for r in host.rows)
            self._run_append(out, bonus, bonus_p)
            return
        self._flush_lag_run()
        self._lag_host = None  # a step without host rows: from now on only the device knows the lags
        slot = self._lag_n.index_select(0, rows)  # [B] < max_lag: propose() caught up when the bound reached it
        f = self.head.target_feature(out)[:, 0]  # [B, F]
        self._lag_room(self._lag_bound + 1)
        # Flat row-major positions and index_copy_: the same writes as feat[rows, slot] = f, without Python's
        # advanced-indexing assignment (the record of a paused step 55.7 -> 49.4 us in the engine, 2-core Xeon).
        flat = rows * self._lag_feat.shape[1] + slot  # [B]
        self._lag_feat.view(-1, f.shape[-1]).index_copy_(0, flat, f.to(self._lag_feat.dtype))
        self._lag_tok.view(-1).index_copy_(0, flat, bonus)
        self._lag_p.view(-1).index_copy_(0, flat, torch.ones_like(bonus, dtype=torch.float32) if bonus_p is None
                                         else bonus_p.float())
        self._lag_n.index_copy_(0, rows, slot + 1)
        self._lag_bound += 1

    def _run_append(self, out, bonus: Tensor, bonus_p: Tensor | None) -> None:
        """One paused step of the run's rows: its feature [B, 1, F], bonus [B] and their probabilities [B] kept as
        they are (the rows' host counts take the run's steps when it is written: ``_flush_lag_run``)."""
        self._lag_run.append((self.head.target_feature(out), bonus, bonus_p))
        self._lag_bound += 1

    def _lag_room(self, need: int) -> None:
        """Make the paused buffer hold ``need`` <= max_lag pairs a row (it doubles from LAG_CHUNK)."""
        cap = 0 if self._lag_feat is None else self._lag_feat.shape[1]
        if need <= cap:
            return
        n, grown = self._lag_n.shape[0], min(self.max_lag, max(LAG_CHUNK, 2 * cap, need))
        feat = torch.zeros(n, grown, self.head.config.feature_size, dtype=self.head.dtype, device=self.head.device)
        tok = torch.zeros(n, grown, dtype=torch.long, device=self.head.device)
        prob = torch.ones(n, grown, dtype=torch.float32, device=self.head.device)
        if cap:
            feat[:, :cap], tok[:, :cap], prob[:, :cap] = self._lag_feat, self._lag_tok, self._lag_p
        self._lag_feat, self._lag_tok, self._lag_p = feat, tok, prob

    def _flush_lag_run(self) -> None:
        """Write the run of recorded steps (``_record_paused``) into the buffer: the steps of a row in one copy,
        at the row's own slot (rows may lag differently). Once per catch-up, release or buffer read."""
        run = self._lag_run
        if not run:
            return
        rows, starts, T = self._lag_run_rows, self._lag_run_start, len(run)
        self._lag_room(max(starts) + T)
        feat = torch.cat([f for f, _, _ in run], dim=1)  # [B, T, F]
        tok = torch.stack([b for _, b, _ in run], dim=1)  # [B, T]
        prob = None if all(p is None for _, _, p in run) else torch.stack(  # [B, T]; None: greedy steps, drawn w.p. 1
            [p.float() if p is not None else torch.ones_like(b, dtype=torch.float32) for _, b, p in run], dim=1)
        for b, (r, n) in enumerate(zip(rows, starts)):
            self._lag_feat[r, n:n + T] = feat[b]
            self._lag_tok[r, n:n + T] = tok[b]
            self._lag_p[r, n:n + T] = 1.0 if prob is None else prob[b]
        self._lag_n[torch.tensor(rows, device=self._lag_n.device)] += T
        if self._lag_host is not None:
            for r in rows:
                self._lag_host[r] = self._lag_host.get(r, 0) + T
        run.clear()

    def catch_up_pairs(self, row_ids: Sequence[int]) -> int:
        """What a catch-up of these rows would encode now, in pairs: each of its head forwards' rows times
        its longest row, plus CATCH_UP_FORWARD_PAIRS a forward (``plan_catch_up``); 0 when nothing waits."""
        if not (self._lag_bound or self._prompts):
            return 0
        widths = [p + n for p, n in zip(*self._waiting(row_ids))]
        return catch_up_cost(plan_catch_up(widths), widths)

    def _waiting(self, ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Per row, the pairs a catch-up encodes: its waiting prompt's, and its recorded ones (the host's count;
        the bound over all rows when only the device knows them)."""
        lag, run = self._lag_host, len(self._lag_run)  # the host counts leave out the run not written yet
        return ([self._prompts[r][1].shape[0] if r in self._prompts else 0 for r in ids],
                [lag.get(r, 0) + (run if r in self._lag_run_rows else 0) if lag is not None else self._lag_bound
                 for r in ids])

    def _catch_up(self, rows: Tensor, row_ids: Sequence[int] | None = None, look_back: bool = False) -> None:
        """Encode every row's waiting pairs: its prompt's if they wait, then its recorded paused pairs, pair j of
        a row at its draft length + j (= the position of its feature). Rows go through the head in the forwards
        ``plan_catch_up`` groups them into, each padded to its longest row (slots written past a row's length
        are never attended and get overwritten). The catch-up (with its look-back) is timed for the dispatcher's
        price of a probe (``observe_catch_up``).
        row_ids: ``rows`` on the host, when the caller has them. look_back: also score the head on the
        recorded pairs and hand the counts to the dispatcher (``_look_back``)."""
        start = time.perf_counter()
        self._flush_lag_run()
        ids = list(row_ids) if row_ids is not None else rows.tolist()
        sizes, lags = self._waiting(ids)
        widths = [p + n for p, n in zip(sizes, lags)]
        longest = max(lags, default=0)
        if longest:  # the bound may exceed every row's lag (rows that lagged longest have left)
            self._lag_room(longest)
        scored: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []  # (rows, outputs, first recorded pair, pairs)
        groups = plan_catch_up(widths)
        for g in groups:
            W = max(widths[b] for b in g)
            sel = rows if g == list(range(len(ids))) else rows[torch.tensor(g, device=rows.device)]  # [B']
            prompts = [self._prompts.pop(ids[b], None) for b in g]
            if all(pr is None for pr in prompts):  # recorded pairs only: one gather
                feats, toks = self._lag_feat[sel, :W], self._lag_tok[sel, :W]  # [B', W, F], [B', W]
                first = torch.zeros_like(sel)
            else:
                f0, t0 = next(pr for pr in prompts if pr is not None)
                feats = f0.new_zeros(len(g), W, f0.shape[-1])  # [B', W, F]
                toks = t0.new_zeros(len(g), W)  # [B', W]
                for i, (b, pr) in enumerate(zip(g, prompts)):
                    k, n = sizes[b], lags[b]
                    if pr is not None:
                        feats[i, :k], toks[i, :k] = pr
                    if n:
                        feats[i, k:k + n], toks[i, k:k + n] = self._lag_feat[ids[b], :n], self._lag_tok[ids[b], :n]
                first = torch.tensor([sizes[b] for b in g], device=sel.device)
            o = self._encode(sel, feats, toks, self._prompt_n[sel] + self._lag_n[sel])
            if look_back:
                scored.append((sel, o, first, self._lag_n[sel].clone()))
            self._prompt_n[sel] = 0
            self._lag_n[sel] = 0
        self._lag_bound = 0
        if self._lag_host is not None:
            for r in ids:
                self._lag_host.pop(r, None)
        if look_back:
            self._look_back(ids, scored)
        if groups and hasattr(self.dispatcher, "observe_catch_up"):
            if self.last_h.is_cuda:  # the forwards' own time, not their launch
                torch.cuda.synchronize(self.last_h.device)
            self.dispatcher.observe_catch_up(catch_up_cost(groups, widths), time.perf_counter() - start)

    def _look_back(self, ids: Sequence[int], scored: Sequence[tuple[Tensor, Tensor, Tensor, Tensor]]
                   ) -> None:
        """A look-back probe: over the latest LOOK_BACK recorded pairs of each row, would the root child a chain
        of 1 drafts from pair j's output have been accepted at the next step, whose token (pair j + 1's) the
        target drew itself? Each pair counts its chance (``sampling.one_token_acceptance``: the hit of the
        head's top-1 guess for a row drafting top-k, min(1, q/p) of the drawn token for a row drafting at a
        temperature), unbiased for the depth-1 acceptance a probe that drafted would have measured, at a
        catch-up's price. Summed chances and tries per row go to the dispatcher.
        scored: per catch-up forward, its rows [B'], outputs [B', T', H], the index of each row's first recorded
        pair in them [B'] and its recorded pairs [B'] (the last pair's next token is not known yet)."""
        hits = dict.fromkeys(ids, 0.0)  # cache row -> summed chance (``rows`` holds the same row ids on the device)
        tries = dict.fromkeys(ids, 0)
        for sel, o, first, n in scored:
            if self._lag_tok is None:  # no paused pair recorded yet (prompts only): nothing to score
                continue
            j = (n - 1 - LOOK_BACK)[:, None] + torch.arange(LOOK_BACK, device=o.device)[None, :]  # [B', K] pairs
            ok = j >= 0  # pair j scored against pair j + 1's token: j <= n - 2
            j = j.clamp(min=0)
            # the slots of pairs that were not scored (ok False) are clamped into the forward's width: a row that
            # just joined has its prompt waiting and no recorded pair, and first = its width when it is the widest
            at = (first[:, None] + j).clamp(max=o.shape[1] - 1)  # [B', K]
            h = o.gather(1, at[:, :, None].expand(-1, -1, o.shape[-1]))  # [B', K, H]
            rows = sel.tolist()
            temps = torch.tensor([self._row_temperature.get(r, self.draft_temperature or 0.0) for r in rows],
                                 dtype=torch.float32, device=o.device)  # [B']
            x = self._target_to_draft()[self._lag_tok[sel[:, None], j + 1]]  # [B', K] the drawn tokens, draft ids
            chance = one_token_acceptance(self.head.logits(h).float(), temps[:, None].expand_as(x), x,
                                          self._lag_p[sel[:, None], j + 1])  # [B', K]
            for r, c, m in zip(rows, (chance * ok).sum(dim=1).tolist(), ok.sum(dim=1).tolist()):
                hits[r], tries[r] = c, m
        self.dispatcher.observe_look_back(list(ids), [hits[r] for r in ids], [tries[r] for r in ids])

    def _target_to_draft(self) -> Tensor:
        """Draft id of every target id [V] (-1: outside the draft vocabulary)."""
        if getattr(self, "_t2d_ids", None) is None or self._t2d_ids.device != self.head.device:
            d2t = self._draft_to_target()
            t2d = torch.full((self.head.config.vocab_size,), -1, dtype=torch.long, device=d2t.device)
            self._t2d_ids = t2d.index_copy_(0, d2t, torch.arange(d2t.numel(), device=d2t.device))
        return self._t2d_ids

    def _encode(self, rows: Tensor, feats: Tensor, toks: Tensor, n: Tensor) -> Tensor:
        """Append pairs (target features feats [B, T, F], next tokens toks [B, T]) to the draft cache rows
        ``rows`` [B], the first n [B] of each (the rest is padding), and refresh last_h; returns the outputs
        [B, T, H]."""
        positions = self.cache.lengths[rows][:, None] + torch.arange(toks.shape[1], device=rows.device)[None, :]
        o = self.head(self.head.fuse(feats, prefill=True), toks, positions, self.cache, rows=rows,
                      prefill=True)  # [B, T, H]
        self.cache.advance(rows, n)
        last = o.gather(1, (n - 1).clamp(min=0)[:, None, None].expand(-1, 1, o.shape[-1]))[:, 0]  # [B, H]
        self.last_h[rows] = torch.where((n > 0)[:, None], last, self.last_h[rows])
        return o

    # ---------------------------------------------------------------------- drafting (strategies.Drafter)

    def root_features(self) -> Tensor:
        block = _row_block(self._host)
        if block is not None:
            return self.last_h[block, None]  # [B, 1, H]: a view, no gather
        return self.last_h[self._rows][:, None]  # [B, 1, H]

    def children(self, o: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """o [B, K, H] -> children of each node: target token ids [B, K, k], their draft log-probs
        [B, K, k] and, when sampling, the distribution q they were drawn from in TARGET vocab [B, K, V]."""
        logits = self.head.logits(o).float()  # [B, K, V'] draft vocabulary
        if self._step_temperature is None:
            if k == 1:  # chains: the argmax kernel instead of a top-k (~20 us less a node of 8192, 2-core Xeon)
                ids = argmax(logits)[..., None]  # [B, K, 1]
                return self.head.to_target_ids(ids), torch.log_softmax(logits, dim=-1).gather(-1, ids), None
            lp, ids = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
            return self.head.to_target_ids(ids), lp, None
        t = self._step_temperature  # [B]; rows at 0 (greedy requests) take the top-k of q at 1
        if k == 1:
            # One draw (chains, single-child levels): inverse CDF, one uniform per node from the row's own
            # generator. ~25 us a node of 8192 where the Gumbel race below takes ~70 (2-core Xeon): its noise
            # costs a uniform, two logs and a top-k per token. float32 sums make the drawn law q up to ~1e-6.
            u = torch.stack([torch.rand(logits.shape[1], 1, generator=g, device=logits.device)
                             if g is not None else logits.new_zeros(logits.shape[1], 1)
                             for g in self._step_generators])  # [B, K, 1]
            if cpu_kernels.serves(logits, t, u):  # the same rule in one call (kernels/draft_draw.cpp): with the
                # head's logits 179 -> 88 us a node at batch 1 (docs/results/epyc-2026-11-28-s21/draft_draw_micro.txt)
                ids, lq, q = torch.ops.eaglespec.draft_draw(logits, t, u[..., 0], self._draft_to_target(),
                                                            self.head.config.vocab_size)  # [B, K], [B, K], [B, K, V]
                return ids[..., None], lq[..., None], q
        logq = torch.log_softmax(logits / torch.where(t > 0, t, 1.0)[:, None, None], dim=-1)
        if k == 1:
            cdf = logq.exp().cumsum(dim=-1)  # [B, K, V']
            drawn = torch.searchsorted(cdf, u * cdf[..., -1:], side="right").clamp_(max=logq.shape[-1] - 1)  # [B, K, 1]
            ids = torch.where((t > 0)[:, None, None], drawn, logq.argmax(dim=-1, keepdim=True))
        else:
            # Gumbel-top-k: k draws without replacement, in draw order. Row b's noise [K, V'] comes from its own
            # generator, so its stream depends only on its tree shape, not on the batch.
            noise = torch.stack([-torch.log(-torch.log(torch.rand(logq.shape[1:], generator=g, device=logq.device)
                                                       .clamp_(1e-20, 1.0)))
                                 if g is not None else logq.new_zeros(logq.shape[1:])
                                 for g in self._step_generators])  # [B, K, V']
            ids = (logq + noise).topk(k, dim=-1).indices  # [B, K, k]
        q = logq.new_zeros(*logq.shape[:-1], self.head.config.vocab_size)  # [B, K, V] in target vocabulary
        q.index_copy_(-1, self._draft_to_target(), logq.exp())
        return self.head.to_target_ids(ids), logq.gather(-1, ids), q

    def _draft_to_target(self) -> Tensor:
        """Target id of every draft-vocabulary id [V']."""
        if getattr(self, "_d2t_ids", None) is None or self._d2t_ids.device != self.head.device:
            n = self.head.logits(torch.zeros(1, 1, self.head.config.hidden_size, dtype=self.head.dtype,
                                             device=self.head.device)).shape[-1]
            self._d2t_ids = self.head.to_target_ids(torch.arange(n, device=self.head.device))
        return self._d2t_ids

    def expand(self, parent_h: Tensor, tokens: Tensor, depth: int, mask: Tensor) -> Tensor:
        """Draft pairs (parent_h, tokens) [B, K] of nodes at `depth` >= 1; mask [B, K, W]: the drafted slots
        (from P) each node sees, the K new ones last. Returns outputs [B, K, H]."""
        B, K = tokens.shape
        positions = (self._prefix + depth - 1)[:, None].expand(B, K)
        host = None if self._host is None else replace(self._host, max_position=max(self._host.lengths) + depth - 1)
        return self.head(parent_h, tokens, positions, self.cache, rows=self._rows, block_mask=mask, host=host)


class ReplayProposer:
    """Proposes the known continuation of each prompt as a chain (zero draft cost when it is right).

    Used by tests (a drafter that knows the answer gets everything accepted) and by the engine-overhead
    benchmark. `continuations` maps a prompt (tuple of token ids) to the tokens it should continue with.
    """

    hidden_indices: tuple[int, ...] = ()

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], depth: int):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.depth = depth
        self.chain = Chain(depth)
        self.max_tree_nodes = self.chain.num_nodes
        self.step_label = self.chain.label
        self.step_choice = None
        self.continuations = {tuple(k): list(v) for k, v in continuations.items()}
        self._rows: dict[int, tuple[list[int], int]] = {}  # row -> (continuation, prompt length)

    def reserve(self, max_batch: int, max_len: int) -> None:
        self._rows.clear()

    def release(self, rows: Tensor) -> None:
        for r in rows.tolist():
            self._rows.pop(r, None)

    def prefill(self, rows, tokens, lengths, out, pending, seeds=None, temperatures=None) -> None:
        for r, t, n in zip(rows.tolist(), tokens.tolist(), lengths.tolist()):
            self._rows[r] = (self.continuations.get(tuple(t[:n]), []), n)

    def propose(self, rows: Tensor, pending: Tensor, prefix_lengths: Tensor, host=None, budget=None) -> DraftTree:
        drafts = []
        for r, p in zip(rows.tolist(), prefix_lengths.tolist()):
            cont, n = self._rows[r]
            g = p - n + 1  # generated so far, the pending token included
            nxt = cont[g : g + self.depth]
            drafts.append(nxt + [0] * (self.depth - len(nxt)))
        toks = torch.tensor(drafts, dtype=torch.long, device=pending.device)  # [B, depth]
        levels = [toks[:, d, None, None] for d in range(self.depth)]  # one expanded node, one child per level
        return expand_static(self.chain.shape, pending, levels, [torch.zeros(t.shape, device=t.device) for t in levels])

    def commit(self, rows, tree, verdict, out, n_accepted=None) -> None:
        pass
