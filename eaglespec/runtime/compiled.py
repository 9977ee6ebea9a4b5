"""The target's decode and verification forward as one compiled graph (``--compile``).

Why: in eager PyTorch a decode step of the default model is about a thousand small operators (norms, rotary,
casts around the packed kernels, attention), and on a 2-core CPU their dispatch costs as much as the int4
matmuls themselves. Compiled layer by layer it got slower (60 graphs a step each pay their guards,
docs/RUNTIME.md); one graph for the whole step removes that overhead.

What makes one graph possible is attention with shapes that do not change every step: the graph does not
write the cache. It reads the whole cache narrowed to the committed slots ``[L, max_batch, Hkv, S, D]`` (S =
the longest committed row, a dynamic dimension), gathers the forward's rows, attends over ``cat(prefix, new
tokens)`` under a mask built inside the graph from each row's committed length and the block (tree) mask, and
returns the new tokens' keys and values, which the caller writes into the cache at the slots
``plan_attention`` assigns (one indexed write for all layers). Nothing about which rows a forward runs on
reaches the graph's guards, so rows joining, finishing or scattering never recompile (``__call__``).
The layers are the same ``decoder_layer`` the eager path runs; only ``attend`` differs.

Lossless: as in eager packed models, every row is computed independently of the others (packed kernels per
row, attention in ``Transformer.attention_dtype``), so a token verified in an N-token graph gets the logits it
gets decoded in the 1-token graph; greedy speculative output equals vanilla output with both compiled
(tests/test_compiled.py). Compiled and eager results are not bit-identical (fused float32 norms and rotary
round differently in the last bit, which bfloat16 kernel inputs can amplify), so one generation never mixes
them: with a graph installed every decode and verification forward runs it.

Compile time: one graph per class of shapes (a one-row cache or not, 1 new token or more), 1-2 minutes each
on a 2-core CPU the first time, ~15-25 s from inductor's on-disk cache (``$TORCHINDUCTOR_CACHE_DIR``, by
default under eaglespec's cache directory). Every graph's first call is checked against the eager forward; a
graph that disagrees, or fails to compile, is dropped for the eager path with a warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from eaglespec.runtime.kvcache import HostRows, KVCache
from eaglespec.runtime.model import (ForwardOutput, Transformer, attention, decoder_layer, plan_attention,
                                     rms_norm, write_block)

__all__ = ["CompiledStep", "compile_step"]

log = logging.getLogger(__name__)

CHECK_RTOL = 0.15
"""First-call check: the compiled hidden states and logits must equal the eager ones within this relative L2
error per row. Not tighter: the packed kernels round their inputs (to bfloat16 in torch's int4 kernel, to
int8 blocks in w4a8), so a last-bit difference of a fused float32 norm flips some roundings and grows
through the layers (measured on the default model: relative error ~1e-2 with torch's int4 kernel, 0.0502
with w4a8 on an MT-bench prompt's first decode step); a miscompiled graph is off by ~1."""


def _step_graph(model: Transformer, tokens: Tensor, cos: Tensor, sin: Tensor, cache_k: Tensor, cache_v: Tensor,
                rows: Tensor | None, start: Tensor, block: Tensor, want_logits: bool):
    """The pure step: no cache writes, no host reads.

    tokens [B, T]; cos, sin [B, T, 1, D] rotary tables; cache_k, cache_v [L, max_batch, Hkv, S, D] slots [0, S)
    of every cache row (always a view of the whole cache, so that its strides and offset never change and
    never trigger a recompile); rows [B] the forward's cache rows (None for a one-row cache: no gather);
    start [B] committed length of each row (slots >= start[b] are stale for row b); block [B, T, T] bool, new
    token i may see new token j.
    Returns hidden [B, T, H], every residual stream states [B, T, L + 1, H] (HF ``hidden_states`` order; the
    caller picks the ones it taps, so one graph serves every proposer), logits [B, T, V] or None, and the new
    tokens' keys and values [L, B, Hkv, T, D].
    """
    batch, n_new = tokens.shape
    n_prefix = cache_k.shape[3]
    keys, values = (cache_k, cache_v) if rows is None else (cache_k[:, rows], cache_v[:, rows])  # [L, B, Hkv, S, D]
    own = torch.eye(n_new, dtype=torch.bool, device=tokens.device)
    block = (block | own).expand(batch, n_new, n_new)  # [B, T, T]
    prefix = torch.arange(n_prefix, device=tokens.device)[None, :] < start[:, None]  # [B, S]
    mask = torch.cat([prefix[:, None, :].expand(batch, n_new, n_prefix), block], dim=-1)[:, None]  # [B, 1, T, S+T]
    new_k: list[Tensor] = []
    new_v: list[Tensor] = []

    def attend(q: Tensor, k: Tensor, v: Tensor, i: int) -> Tensor:
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, T, D]
        new_k.append(k)
        new_v.append(v)
        return attention(q, torch.cat([keys[i], k], dim=2), torch.cat([values[i], v], dim=2), mask,
                         compute_dtype=model.attention_dtype, exact_rows=model.row_attention)  # [B, T, Hq * D]

    x = model.embed_tokens(tokens)  # [B, T, H]
    states = [x]
    for i, layer in enumerate(model.layers):
        x = decoder_layer(layer, i, x, (cos, sin), attend)
        states.append(x)
    hidden = rms_norm(x, model.norm, model.args.rms_norm_eps)
    logits = model.output_logits(hidden) if want_logits else None
    return hidden, torch.stack(states, dim=2), logits, torch.stack(new_k), torch.stack(new_v)


class CompiledStep:
    """``Transformer.forward`` for decode and verification forwards (``prefill=False``), run as one compiled
    graph. Installed on a model by ``compile_step``; the model's forward calls it when ``handles`` says so."""

    pads_batch = True
    """Run a batch of one on a cache of several rows as two rows (see ``__call__``)."""
    what = "compiled step"
    """How warnings name this step."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self._graph = self._make_graph()
        self._checked: set[tuple] = set()
        self.disabled: str | None = None  # why the graph was dropped for the eager path

    def _make_graph(self):
        """What ``_run`` calls (here: ``_step_graph`` compiled by inductor, dynamic shapes, C++ wrapper)."""
        return torch.compile(_step_graph, dynamic=True, fullgraph=True, options={"cpp_wrapper": True})

    def handles(self, n_new: int, block_mask: Tensor | None, logits_at) -> bool:
        """Decode/verification forwards whose block is exactly the new tokens, with logits at all or none."""
        if self.disabled is not None or self.model.args.sliding_window is not None:
            return False
        if block_mask is not None and block_mask.shape[-1] != n_new:
            return False
        return logits_at is None or (isinstance(logits_at, str) and logits_at == "all")

    def __call__(self, tokens: Tensor, positions: Tensor, cache: KVCache, rows: Tensor | None = None,
                 block_mask: Tensor | None = None, logits_at: Tensor | Literal["all"] | None = None,
                 hidden_indices: Sequence[int] = (), host: HostRows | None = None) -> ForwardOutput:
        model = self.model
        batch, n_new = tokens.shape
        indices = list(hidden_indices)  # checked by Transformer.forward
        plan = plan_attention(cache, n_new, rows, None, positions=positions, batch=batch, host=host)
        # Inputs whose shapes sort the forward into one of few graph classes, whatever rows it runs on:
        # - the whole cache, narrowed to the committed slots (at least 2: sizes 0 and 1 get graphs of their own;
        #   slots past a row's length are masked), so strides, offset and dispatch keys never change;
        # - with a cache of several rows, at least 2 rows: a batch that shrinks to one row (the others finished)
        #   runs that row twice (same values, same slots) in the graph it already uses, instead of compiling
        #   a batch-1 graph mid-run (1-2 minutes; measured: a batch-4 bench fell from ~170 to 1.4 tok/s).
        n_prefix = self._prefix_slots(plan.n_slots - n_new, cache.max_len)
        cache_k, cache_v = cache.k[:, :, :, :n_prefix], cache.v[:, :, :, :n_prefix]
        cos, sin = model.rotary(positions, model.dtype, plan.max_position)
        graph_rows = None if cache.max_batch == 1 else plan.rows  # a one-row cache needs no gather
        start = cache.lengths[plan.rows]
        if block_mask is None:  # causal, as a tensor: one graph for chains and trees
            block = torch.ones(batch, n_new, n_new, dtype=torch.bool, device=tokens.device).tril()
        else:  # [B, T, T] even where the caller broadcasts one mask over the batch (a size-1 dim is a class)
            block = block_mask.to(device=tokens.device, dtype=torch.bool).expand(batch, n_new, n_new).contiguous()
        if self.pads_batch and batch == 1 and cache.max_batch > 1:
            twice = lambda t: t.expand(2, *t.shape[1:]).contiguous()  # noqa: E731 (strides as a real batch's)
            tokens, cos, sin, graph_rows, start = map(twice, (tokens, cos, sin, graph_rows, start))
            block = twice(block)
        want_logits = logits_at is not None
        kind = (cache.max_batch == 1, n_new == 1, want_logits)
        try:
            hidden, states, logits, new_k, new_v = self._run(tokens, cos, sin, cache_k, cache_v, graph_rows, start,
                                                             block, want_logits)
        except Exception as e:  # a compile failure (or recompile limit) must not end the generation
            self.disabled = f"the {self.what} failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
            log.warning("%s: running eager from now on", self.disabled)
            return model(tokens[:batch], positions, cache, rows=rows, block_mask=block_mask, logits_at=logits_at,
                         hidden_indices=indices, host=host, eager=True)
        hidden, states, new_k, new_v = hidden[:batch], states[:batch], new_k[:, :batch], new_v[:, :batch]
        logits = None if logits is None else logits[:batch]
        aux = states[:, :, indices].flatten(2) if indices else None  # [B, T, len(indices) * H]
        if kind not in self._checked:
            self._checked.add(kind)
            ref = model(tokens[:batch], positions, cache, rows=rows, block_mask=block_mask, logits_at=logits_at,
                        hidden_indices=indices, host=host, eager=True)
            if not self._agrees(ref, hidden, logits, kind):
                return ref  # the eager forward wrote its own keys and values
        write_block(cache.k, new_k, plan)
        write_block(cache.v, new_v, plan)
        return ForwardOutput(hidden=hidden, aux=aux, logits=logits)

    @staticmethod
    def _prefix_slots(committed: int, max_len: int) -> int:
        """How many cache slots the graph reads for a longest committed row of ``committed`` slots."""
        return min(max(committed, 2), max_len)

    def _run(self, tokens: Tensor, cos: Tensor, sin: Tensor, cache_k: Tensor, cache_v: Tensor, rows: Tensor | None,
             start: Tensor, block: Tensor, want_logits: bool) -> tuple:
        """``_step_graph``'s outputs for these inputs (here: the compiled graph's)."""
        return self._graph(self.model, tokens, cos, sin, cache_k, cache_v, rows, start, block, want_logits)

    def _agrees(self, ref: ForwardOutput, hidden: Tensor, logits: Tensor | None, kind: tuple) -> bool:
        pairs = [(ref.hidden, hidden)] + ([(ref.logits, logits)] if logits is not None else [])
        worst = max(float(((a - b).norm(dim=-1) / a.norm(dim=-1).clamp(min=1e-6)).max()) for a, b in pairs)
        if worst <= CHECK_RTOL:
            return True
        self.disabled = (f"the {self.what} disagreed with the eager forward on its first call "
                         f"(one-row cache: {kind[0]}, one token: {kind[1]}; relative error {worst:.3g})")
        log.warning("%s: running eager from now on", self.disabled)
        return False


def compile_step(model: Transformer, cache_dir: str | os.PathLike[str] | None = None) -> CompiledStep:
    """Run ``model``'s decode and verification forwards as one compiled graph (see the module docstring);
    ``cache_dir``: where inductor keeps compiled graphs, unless ``$TORCHINDUCTOR_CACHE_DIR`` says otherwise."""
    if cache_dir is not None:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir))
    # Each class of shapes (one-row cache or not, one new token or more, logits or not, tree mask or not) is a
    # graph of its own; dynamo's default of 8 per function is too few for a process that runs several classes.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    # Without this, two dimensions that happen to be equal on a graph's first call (the batch and the cache's
    # rows, 4 and 4; the prefix and the new tokens) are assumed equal for good, and the next call recompiles.
    torch.fx.experimental._config.use_duck_shape = False
    step = CompiledStep(model)
    model.step_graph = step
    return step
