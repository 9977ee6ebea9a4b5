"""The target's decode and verification forward replayed as CUDA graphs (``--compile`` on a CUDA device).

Why: eager, a decode step of the default model launches ~900 kernels, and each launch costs the host tens of
microseconds; on an H200 a forward took ~50 ms for a model the chip reads in ~0.1 ms (docs/RUNTIME.md, "On a
GPU"). A CUDA graph launches the whole step as one unit.

What is captured: ``runtime.compiled``'s pure step (``_step_graph``, run eagerly: no cache writes, no host reads)
over static input buffers. A graph's shapes are fixed, so the cache prefix it reads is bucketed: slots ``[0, S)``
with S the longest committed row rounded up to a multiple of ``PREFIX_BUCKET`` (slots past a row's committed
length are masked, so a longer prefix changes only the work, not the result). One graph per batch size, number
of new tokens, bucket and logits-or-not, captured on its first use (one warm-up run and the capture: two eager
forwards) and replayed from then on; the new tokens' keys and values are written into the cache outside the
graph, as for the compiled step. Everything else (the first call of each class checked against the eager
forward, the fall-back to eager with a warning) is ``CompiledStep``'s.

Graphs read the cache and the model's weights at the addresses they had when captured: a graph is keyed by the
cache's storage, and a new cache (a larger batch or context) drops the graphs of the old one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

from eaglespec.runtime.compiled import CompiledStep, _step_graph
from eaglespec.runtime.model import Transformer

__all__ = ["GraphedStep", "MAX_GRAPHS", "PREFIX_BUCKET", "graph_step"]

PREFIX_BUCKET = 128
"""Cache slots a graph reads, rounded up to a multiple of this: a 128-token answer to a short prompt crosses one
or two buckets, and attending 127 masked slots costs a GPU next to nothing."""

MAX_GRAPHS = 64
"""Graphs kept at once, the least recently replayed dropped first. Each holds its static outputs (the logits of
a batch of 8 verifying 17 tokens are 27 MB in float32), and a long context crosses many buckets at every batch
size and tree size the dispatcher uses; a dropped graph is captured again if its shape comes back."""


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None: replayed by running the step on the static inputs (``capture=False``)
    inputs: tuple[Tensor | None, ...]  # static tokens, cos, sin, rows, start, block
    outputs: tuple[Tensor | None, ...]  # static hidden, states, logits, new keys, new values


class GraphedStep(CompiledStep):
    """``Transformer.forward`` for decode and verification forwards, replayed as CUDA graphs (module docstring).

    ``capture=False`` runs the same static-buffer bookkeeping without CUDA (tests on the CPU): each "replay" runs
    the step eagerly on the static inputs.
    """

    pads_batch = False  # a graph per batch size costs one capture, not a compile
    what = "CUDA graph step"

    def __init__(self, model: Transformer, capture: bool = True) -> None:
        self.capture = capture
        self.graphs: OrderedDict[tuple, _Graph] = OrderedDict()  # least recently replayed first
        self._storage: tuple[int, int] | None = None  # the cache the graphs read
        self._pool = torch.cuda.graph_pool_handle() if capture else None  # one memory pool for all graphs
        super().__init__(model)

    def _make_graph(self) -> None:
        return None  # graphs are captured per shape class (``_capture``), not compiled

    @staticmethod
    def _prefix_slots(committed: int, max_len: int) -> int:
        return min(max(-(-committed // PREFIX_BUCKET), 1) * PREFIX_BUCKET, max_len)

    def _run(self, tokens: Tensor, cos: Tensor, sin: Tensor, cache_k: Tensor, cache_v: Tensor, rows: Tensor | None,
             start: Tensor, block: Tensor, want_logits: bool) -> tuple:
        storage = (cache_k.data_ptr(), cache_v.data_ptr())
        if storage != self._storage:  # another cache: the old graphs read memory that is no longer it
            self.graphs.clear()
            self._storage = storage
            if self.capture:  # the old pool goes with its graphs (capturing into a released pool trips the allocator)
                self._pool = torch.cuda.graph_pool_handle()
        key = (tuple(tokens.shape), tuple(cache_k.shape), cache_k.stride(), rows is None, want_logits)
        g = self.graphs.get(key)
        inputs = (tokens, cos, sin, rows, start, block)
        if g is None:
            while len(self.graphs) >= MAX_GRAPHS:
                self.graphs.popitem(last=False)
            g = self.graphs[key] = self._capture(inputs, cache_k, cache_v, want_logits)
        else:
            self.graphs.move_to_end(key)
        for static, new in zip(g.inputs, inputs):
            if static is not None:
                static.copy_(new)
        if g.graph is not None:
            g.graph.replay()
        else:
            g.outputs = self._step(g.inputs, cache_k, cache_v, want_logits)
        # Copies: another graph's replay may reuse this one's output memory (they share one pool).
        return tuple(None if t is None else t.clone() for t in g.outputs)

    def _step(self, inputs: tuple[Tensor | None, ...], cache_k: Tensor, cache_v: Tensor, want_logits: bool) -> tuple:
        tokens, cos, sin, rows, start, block = inputs
        return _step_graph(self.model, tokens, cos, sin, cache_k, cache_v, rows, start, block, want_logits)

    def _capture(self, inputs: tuple[Tensor | None, ...], cache_k: Tensor, cache_v: Tensor, want_logits: bool) -> _Graph:
        static = tuple(None if t is None else t.clone() for t in inputs)
        if not self.capture:
            return _Graph(None, static, ())
        # Warm up on a side stream first (lazy library initialisation must not happen during the capture).
        side = torch.cuda.Stream(device=cache_k.device)
        side.wait_stream(torch.cuda.current_stream(cache_k.device))
        with torch.cuda.stream(side):
            self._step(static, cache_k, cache_v, want_logits)
        torch.cuda.current_stream(cache_k.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self._step(static, cache_k, cache_v, want_logits)
        return _Graph(graph, static, outputs)


def graph_step(model: Transformer, capture: bool = True) -> GraphedStep:
    """Replay ``model``'s decode and verification forwards as CUDA graphs (see the module docstring)."""
    if capture and model.device.type != "cuda":
        raise ValueError(f"CUDA graphs need the model on a CUDA device, not {model.device}")
    step = GraphedStep(model, capture)
    model.step_graph = step
    return step
