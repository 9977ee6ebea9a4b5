"""The generation loop: one loop for vanilla and speculative decoding, streaming by nature.

Each step, for every active sequence: the proposer (none for vanilla) drafts a tree rooted at the sequence's
pending token (sampled but not yet in the KV cache); one target forward runs over the flattened trees; the
verifier picks the accepted path and the bonus token; the path's K/V are compacted into the prefix and the
committed tokens go through the stop rules and out as a chunk. Vanilla decoding is the same step with a
one-node tree, so both paths share sampling, stopping, batching and accounting.

Sequences join the batch as rows of the KV cache become free (prefill, then decode) and leave it as soon as
they finish, so a batch of prompts decodes together and the server can admit requests between steps.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

import torch

from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.runtime.kvcache import HostRows
from eaglespec.runtime.model import synchronize
from eaglespec.spec.sampling import draw_uniforms, process_logits
from eaglespec.engine.stats import SequenceStats
from eaglespec.engine.stopping import StopChecker
from eaglespec.spec.strategies import NoDraft
from eaglespec.spec.tree import DraftTree, tree_mask, tree_positions
from eaglespec.spec.verify import Verdict, verify_greedy, verify_sampling


class Proposer(Protocol):
    """A drafter plugged into the loop (EAGLE heads, a replay drafter in tests...)."""

    hidden_indices: tuple[int, ...]
    """Target `hidden_states` indices the proposer needs from every target forward (() = final hidden only)."""
    max_tree_nodes: int
    """Upper bound of the nodes (root included) of any tree it proposes: KV slack per row."""

    def reserve(self, max_batch: int, max_len: int) -> None:
        """Make room (e.g. a draft KV cache) for `max_batch` rows of up to `max_len` tokens."""

    def prefill(self, rows: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor, out, pending: torch.Tensor,
                seeds: list[int] | None = None, temperatures: list[float] | None = None) -> None:
        """After the target prefill: rows [B], prompt tokens [B, T] (right-padded), lengths [B], the target's
        ForwardOutput over the prompts and the first sampled (pending) token per row [B]; seeds: one draft
        seed per row, derived from the request's seed (random draft choices of a row depend only on it);
        temperatures: per row, the request's sampling temperature (0 = greedy decoding)."""

    def propose(self, rows: torch.Tensor, pending: torch.Tensor, prefix_lengths: torch.Tensor,
                host: HostRows | None = None, budget: Sequence[int] | None = None) -> DraftTree:
        """Draft a tree per row whose root is the row's pending token; prefix_lengths [B] = target KV lengths;
        host: the same rows and lengths as the engine holds them on the host (so drafting reads nothing back;
        its max_position is the roots' position); budget: the tokens each row may still generate (its
        request's max_new_tokens less its output so far; stop strings and EOS may end it sooner)."""

    def commit(self, rows: torch.Tensor, tree: DraftTree, verdict: Verdict, out,
               n_accepted: list[int] | None = None) -> None:
        """After verification: the accepted path (and the target features of its nodes, in `out`);
        n_accepted: the host copy of `verdict.n_accepted` (the step's one read)."""

    def release(self, rows: torch.Tensor) -> None:
        """The sequences in these rows finished: their draft state may be dropped."""

    # Optional, read after each propose() for the sequences' stats (absent = not reported):
    # step_label: str, the tree drafted (its strategy's label); step_choice: costmodel.Choice | None, the cost
    # model's prediction for it (adaptive dispatch).


@dataclass
class Request:
    """One prompt (already tokenized) and how to continue it."""

    prompt_ids: list[int]
    config: GenerationConfig = field(default_factory=GenerationConfig)


@dataclass
class Chunk:
    """Tokens committed for one request in one step (after stop rules)."""

    index: int  # position of the request in the list given to `stream`
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None


@dataclass
class Completion:
    index: int
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    stats: SequenceStats


@dataclass
class _Sequence:
    index: int
    request: Request
    row: int
    stopper: StopChecker
    generator: torch.Generator  # the bonus draws: one uniform a step (``Engine._verify_group``)
    accept_generator: torch.Generator  # the acceptance tests: a fixed count a step, the engine's slack
    seed: int
    pending: int = -1
    length: int = 0  # committed tokens of its cache row (the host copy of cache.lengths[row])
    output: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stats: SequenceStats = field(default_factory=SequenceStats)
    start: float = 0.0


NO_DRAFT = NoDraft()  # vanilla decoding: the same step with the root alone


def draft_seed(seed: int) -> int:
    """The seed of a sequence's draft sampler: derived from its own seed, distinct from the target stream's."""
    return (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**63


def acceptance_seed(seed: int) -> int:
    """The seed of a sequence's acceptance tests' uniforms: derived from its own seed, distinct from its bonus
    draws' (the seed itself) and its draft sampler's."""
    return (seed * 0xD1B54A32D192ED03 + 0x8CB92BA72F3D8DD7) % 2**63


def _uniform_sampling_key(p: SamplingParams) -> tuple:
    return (p.temperature, p.top_k, p.top_p)


class Engine:
    """Runs requests through the target model, with an optional proposer, `max_batch_size` at a time.

    Two ways to drive it: `generate`/`stream` for a fixed list of requests (CLI, benchmarks), or
    `submit` + `step` (+ `cancel`) for requests that arrive while others decode (the server's scheduler).
    Each `step` either prefills waiting requests into free cache rows or runs one decode step for every
    active sequence, and returns the chunks it committed.
    """

    def __init__(self, target, proposer: Proposer | None = None, max_batch_size: int = 1,
                 max_len: int | None = None):
        """max_len: KV slots per row for `submit`-driven use (default: the model's context); `stream`
        sizes the cache to its requests instead."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = target.model
        self.tokenizer = target.tokenizer
        self.eos_token_ids = list(target.eos_token_ids)
        self.proposer = proposer
        self.max_batch_size = max_batch_size
        self.device = self.model.device
        self._queued = self.device.type != "cpu"  # kernels run asynchronously (``_sync`` waits; a no-op on the CPU)
        self.max_context = self.model.args.max_position_embeddings
        if max_len is not None and not 1 < max_len <= self.max_context:
            raise ValueError(f"max_len must be in [2, {self.max_context}], got {max_len}")
        self.max_len = max_len or self.max_context
        self.slack = proposer.max_tree_nodes if proposer is not None else 1
        self.cache = None
        self.waiting: deque[tuple[object, Request]] = deque()
        self.active: list[_Sequence] = []
        self.free_rows: list[int] = []

    # ----------------------------------------------------------------------------------------------- API

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """Run all requests to completion; results in request order."""
        done: dict[int, Completion] = {}
        for _ in self.stream(requests, on_finish=lambda c: done.__setitem__(c.index, c)):
            pass
        return [done[i] for i in range(len(requests))]

    def stream(self, requests: Sequence[Request], on_finish=None) -> Iterator[list[Chunk]]:
        """Yield, once per step, the chunks committed in that step (one per sequence that got tokens).

        Chunk.index is the request's position in `requests`; `on_finish(Completion)` is called as each
        request finishes."""
        self.start(requests)
        while not self.idle:
            yield self.step(on_finish)

    def start(self, requests: Sequence[Request]) -> None:
        """Queue a fixed list of requests on an idle engine as `stream` does (each validated, the KV cache sized
        to them, a request's index its position in the list); each `step` then runs them on. For callers that
        step several engines in turns (the benchmark's `--interleave`)."""
        if not self.idle:
            raise RuntimeError("start() and stream() need an idle engine (requests submitted with submit() are "
                               "pending)")
        requests = list(requests)
        for i, r in enumerate(requests):
            self._validate(i, r, self.max_context)
        if not requests:
            return
        max_len = max(len(r.prompt_ids) + r.config.max_new_tokens for r in requests) + self.slack
        self._reserve(min(self.max_batch_size, len(requests)), max_len)
        for i, r in enumerate(requests):
            self.waiting.append((i, r))

    def submit(self, key, request: Request) -> None:
        """Queue a request; its chunks will carry `key` as their index. Raises ValueError on bad input."""
        self._validate(key, request, self.max_len)
        self.waiting.append((key, request))

    def cancel(self, key) -> bool:
        """Drop a waiting or active request (e.g. its client disconnected); frees its cache row."""
        for i, (k, _) in enumerate(self.waiting):
            if k == key:
                del self.waiting[i]
                return True
        for s in self.active:
            if s.index == key:
                s.finish_reason = "cancelled"
                self._retire([s], None)
                return True
        return False

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    @torch.no_grad()
    def step(self, on_finish=None) -> list[Chunk]:
        """Prefill waiting requests into free rows if any, else decode one step for all active sequences.

        Runs without autograd whatever the caller's grad mode: with it on, a head whose parameters require
        grad records every draft op and copies its whole KV cache each forward (``DraftHead.forward`` keeps
        training graphs intact that way), which made a batch-1 chain-of-1 step ~25% slower (commit 1.9-2.8 ms
        against 0.9 on a 2-core Xeon) for library callers that did not think to wrap it. ``no_grad`` rather
        than ``inference_mode``: the KV caches outlive a step and are reset outside it (``cancel``)."""
        if self.cache is None:
            self._reserve(self.max_batch_size, self.max_len)
        if self.waiting and self.free_rows:
            admitted = []
            while self.waiting and self.free_rows:
                key, req = self.waiting.popleft()
                admitted.append(self._new_sequence(key, req, self.free_rows.pop(0)))
            self.active.extend(admitted)
            # Row order: a full, contiguous set of rows is attended through views instead of gathered copies of
            # the whole KV cache (continuous admission otherwise scatters the rows; measured 5-10x slower
            # decode steps at batch 128 with 1K-token rows).
            self.active.sort(key=lambda s: s.row)
            chunks = self._prefill(admitted)
        elif self.active:
            chunks = self._step(self.active)
        else:
            return []
        finished = [s for s in self.active if s.finish_reason is not None]
        if finished:
            self._retire(finished, on_finish)
        return chunks

    # ------------------------------------------------------------------------------------------ internals

    def _retire(self, finished: list[_Sequence], on_finish) -> None:
        ids = {id(s) for s in finished}
        self.active = [s for s in self.active if id(s) not in ids]
        rows = torch.tensor([s.row for s in finished], device=self.device)
        self.cache.reset(rows)
        if self.proposer is not None:
            self.proposer.release(rows)
        for s in finished:
            self.free_rows.append(s.row)
            if on_finish is not None:
                on_finish(self._completion(s))

    def _validate(self, key, r: Request, max_len: int) -> None:
        """The request against this engine (its config validated itself when it was built)."""
        if not r.prompt_ids:
            raise ValueError(f"request {key}: the prompt is empty (no tokens)")
        need = len(r.prompt_ids) + r.config.max_new_tokens + self.slack
        if need > max_len:
            raise ValueError(
                f"request {key}: prompt ({len(r.prompt_ids)} tokens) + max_new_tokens "
                f"({r.config.max_new_tokens}) + draft slack ({self.slack}) = {need} exceeds the context "
                f"of {max_len} tokens"
            )

    def _reserve(self, batch: int, max_len: int) -> None:
        """(Re)allocate the KV cache(s) if too small; only called while idle."""
        c = self.cache
        if c is None or c.max_batch < batch or c.max_len < max_len:
            self.cache = None  # free the old buffers before allocating the new ones
            self.cache = self.model.new_cache(batch, max_len)
            if self.proposer is not None:
                self.proposer.reserve(batch, max_len)
        self.cache.reset()
        self.free_rows = list(range(self.cache.max_batch))

    def _new_sequence(self, index: int, req: Request, row: int) -> _Sequence:
        cfg = req.config
        seed = cfg.sampling.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()))
        gen = torch.Generator(device=self.device).manual_seed(seed)
        accept = torch.Generator(device=self.device).manual_seed(acceptance_seed(seed))
        stopper = StopChecker(self.tokenizer, self.eos_token_ids, cfg.max_new_tokens, cfg.stop, cfg.ignore_eos)
        seq = _Sequence(index, req, row, stopper, gen, accept, seed, start=time.perf_counter())
        seq.stats.prompt_tokens = len(req.prompt_ids)
        return seq

    def _sync(self) -> None:
        if self._queued:
            synchronize(self.device)

    def _prefill(self, seqs: list[_Sequence]) -> list[Chunk]:
        t0 = time.perf_counter()
        prompts = [s.request.prompt_ids for s in seqs]
        T = max(len(p) for p in prompts)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        # right-padded on the host: one copy to the device, not one per prompt
        tokens = torch.tensor([list(p) + [0] * (T - len(p)) for p in prompts], dtype=torch.long, device=self.device)
        rows = torch.tensor([s.row for s in seqs], device=self.device)
        positions = torch.arange(T, device=self.device).expand(len(seqs), T)
        hidden_indices = self.proposer.hidden_indices if self.proposer else ()
        out = self.model(tokens, positions, self.cache, rows=rows, logits_at=(lengths - 1)[:, None],
                         hidden_indices=hidden_indices, prefill=True)
        self.cache.advance(rows, lengths)
        root, _ = NO_DRAFT.draft(None, tokens[:, 0])
        verdict = self._verify(seqs, root, out.logits)  # [B, 1, V] logits -> first new token
        if self.proposer is not None:
            self.proposer.prefill(rows, tokens, lengths, out, verdict.bonus, seeds=[draft_seed(s.seed) for s in seqs],
                                  temperatures=[s.request.config.sampling.temperature for s in seqs])
        self._sync()
        elapsed = time.perf_counter() - t0
        first = verdict.bonus.tolist()
        chunks = []
        for s, tok in zip(seqs, first):
            s.length = len(s.request.prompt_ids)
            s.stats.prefill_s = elapsed
            chunks.append(self._commit_tokens(s, [tok]))
        return chunks

    def _verify(self, seqs: list[_Sequence], tree: DraftTree, logits: torch.Tensor) -> Verdict:
        """Greedy or sampling verification, grouped by identical sampling parameters."""
        groups: dict[tuple, list[int]] = {}
        for b, s in enumerate(seqs):
            groups.setdefault(_uniform_sampling_key(s.request.config.sampling), []).append(b)
        if len(groups) == 1:
            return self._verify_group(seqs, tree, logits)
        parts = {}
        for idx in groups.values():
            sel = torch.tensor(idx, device=logits.device)
            parts[tuple(idx)] = self._verify_group([seqs[b] for b in idx], tree.select(sel), logits[sel])
        B, D = len(seqs), max(v.path.shape[1] for v in parts.values())
        path = torch.full((B, D), -1, dtype=torch.long, device=logits.device)
        n_acc = torch.zeros(B, dtype=torch.long, device=logits.device)
        bonus = torch.zeros(B, dtype=torch.long, device=logits.device)
        bonus_p = torch.ones(B, dtype=torch.float32, device=logits.device)  # greedy rows: drawn with probability 1
        for idx, v in parts.items():
            sel = torch.tensor(idx, device=logits.device)
            path[sel, : v.path.shape[1]] = v.path
            n_acc[sel], bonus[sel] = v.n_accepted, v.bonus
            if v.bonus_p is not None:
                bonus_p[sel] = v.bonus_p
        return Verdict(path=path, n_accepted=n_acc, bonus=bonus, bonus_p=bonus_p)

    def _verify_group(self, seqs: list[_Sequence], tree: DraftTree, logits: torch.Tensor) -> Verdict:
        p = seqs[0].request.config.sampling
        if p.greedy:
            return verify_greedy(tree, logits, max_depth=tree.max_depth)
        probs = process_logits(logits, p.temperature, p.top_k, p.top_p)  # [B, N, V]
        n = tree.tokens.shape[1]
        # Two streams a row, each drawn a fixed count a step, so that how many uniforms a row takes does not depend
        # on the shape of its batch's tree: the acceptance tests' (the engine's slack at each step that verifies a
        # draft, entry 0, the root's, unused; none at a step whose tree is the root alone, which tests nothing:
        # 5-10 us of a paused step at batch 1) and the bonus draw's (one). A step that drafts nothing therefore
        # takes its bonus uniform where vanilla decoding takes it: a speculative engine that pauses samples
        # vanilla's tokens at any temperature, so paused runs and vanilla runs of a benchmark are paired token for
        # token.
        u_accept = draw_uniforms([s.accept_generator for s in seqs], self.slack, logits.device) if n > 1 \
            else probs.new_zeros(len(seqs), 1)  # [B, slack]
        u_bonus = draw_uniforms([s.generator for s in seqs], 1, logits.device)[:, 0]  # [B]
        return verify_sampling(tree, probs, u_accept[:, :n], u_bonus, sampled_children=tree.draft_q is not None,
                               max_depth=tree.max_depth)

    def _step(self, seqs: list[_Sequence]) -> list[Chunk]:
        t0 = time.perf_counter()
        rows = torch.tensor([s.row for s in seqs], device=self.device)
        pending = torch.tensor([s.pending for s in seqs], device=self.device)
        prefix = self.cache.lengths[rows]
        host_rows, host_lengths = tuple(s.row for s in seqs), tuple(s.length for s in seqs)
        if self.proposer is not None:
            tree = self.proposer.propose(rows, pending, prefix,
                                         host=HostRows(host_rows, host_lengths, max(host_lengths)),
                                         budget=tuple(s.request.config.max_new_tokens - len(s.output) for s in seqs))
            hidden_indices = self.proposer.hidden_indices
            label = getattr(self.proposer, "step_label", None)
            choice = getattr(self.proposer, "step_choice", None)
        else:
            tree, _ = NO_DRAFT.draft(None, pending)
            hidden_indices, label, choice = (), None, None
        self._sync()
        t1 = time.perf_counter()
        n = tree.tokens.shape[1]
        depth_bound = tree.max_depth if tree.max_depth is not None else n - 1
        out = self.model(
            tree.tokens,
            tree_positions(tree.depth, prefix),
            self.cache,
            rows=rows,
            block_mask=None if n == 1 or tree.chain else tree_mask(tree.parents, tree.valid),  # a chain: causal
            logits_at="all",
            hidden_indices=hidden_indices,
            host=HostRows(host_rows, host_lengths, max(host_lengths) + depth_bound),
        )
        verdict = self._verify(seqs, tree, out.logits)
        counts = verdict.n_accepted + 1  # root + accepted draft nodes enter the prefix
        if n == 1 or tree.chain:  # a chain's accepted nodes are the first of its block: already in place
            self.cache.advance(rows, counts)
        else:
            self.cache.compact(rows, prefix[:, None] + verdict.path.clamp(min=0), counts)
        # Committed tokens: the accepted draft nodes' tokens, then the bonus token.
        path_tokens = tree.tokens.gather(1, verdict.path[:, 1:].clamp(min=0))  # [B, D]
        # The one host read of the step: accepted count, accepted tokens and bonus token of every row.
        host = torch.cat([verdict.n_accepted[:, None], path_tokens, verdict.bonus[:, None]], dim=1).tolist()
        n_acc, path_tokens, bonus = [h[0] for h in host], [h[1:-1] for h in host], [h[-1] for h in host]
        for s, k in zip(seqs, n_acc):
            s.length += k + 1
        t2 = time.perf_counter()
        if self.proposer is not None:
            self.proposer.commit(rows, tree, verdict, out, n_accepted=n_acc)
            self._sync()
        t3 = time.perf_counter()
        if self.proposer is not None and hasattr(self.proposer, "observe_step_time"):
            self.proposer.observe_step_time(t3 - t0)  # the dispatcher checks its price of the chosen tree
        chunks = []
        for b, s in enumerate(seqs):
            st = s.stats
            st.record_accepted(n_acc[b])
            st.record_tree(label, choice)
            st.draft_s += (t1 - t0) + (t3 - t2)
            st.verify_s += t2 - t1
            k = n_acc[b]
            chunks.append(self._commit_tokens(s, path_tokens[b][:k] + [bonus[b]]))
        return chunks

    def _commit_tokens(self, s: _Sequence, tokens: list[int]) -> Chunk:
        res = s.stopper.feed(tokens)
        s.output.extend(res.token_ids)
        s.text += res.text
        s.stats.new_tokens = len(s.output)
        if res.finished:
            s.finish_reason = res.finish_reason
            s.stats.wall_s = time.perf_counter() - s.start
        else:
            s.pending = tokens[-1]
        return Chunk(s.index, res.token_ids, res.text, res.finished, res.finish_reason)

    def _completion(self, s: _Sequence) -> Completion:
        return Completion(s.index, s.request.prompt_ids, s.output, s.text, s.finish_reason, s.stats)
