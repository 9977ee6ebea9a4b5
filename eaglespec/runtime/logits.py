"""Output logits in reduced precision without reduced-precision argmaxes: fast scores over the whole vocabulary,
exact float32 scores for the candidates that can win.

Why by hand: the output projection (``lm_head``, vocab x hidden) is a fifth of SmolLM2-135M's weights and, in
float32, the largest single cost of a packed int4 decode step (7 ms of ~19 ms on a 2-core EPYC). Its int8 or
bfloat16 kernels are 2-4x faster but return bfloat16 scores, whose step is 0.125 around a logit of 20: ties
are frequent, and which tied token wins then hangs on the last bit of the hidden state, so greedy decoding
flips between runs that differ only in rounding (e.g. a 1-token decode and an N-token verification). Here the
fast kernel ranks the vocabulary, and the ``top`` best-ranked tokens get their score recomputed in float32
from the float weights (``top`` rows, a few kilobytes). Those are the only tokens a greedy step can pick
unless the fast kernel's error exceeds the gap between the best token and the ``top``-th one; the rest of
the vocabulary keeps its fast (bfloat16-accurate) score, which only matters for sampling far into the tail.

Every operation here is computed row by row (no reduction across rows), so a row's logits do not depend on
what else is in the batch (tested): verification of N tree tokens scores each exactly as decoding it alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from eaglespec.runtime import cpu_kernels

__all__ = ["RESCORE_TOP", "argmax", "rescored_logits", "topk_indices"]

RESCORE_TOP = 32
"""Candidates rescored exactly per position (32 of 49152 for SmolLM2: ~0.06 ms per row on a 2-core EPYC)."""


def rescored_logits(hidden: Tensor, fast: Callable[[Tensor], Tensor], weight: Tensor,
                    top: int = RESCORE_TOP) -> Tensor:
    """float32 logits [..., V] for ``hidden`` [..., H]: ``fast(hidden)`` everywhere, except at the ``top``
    highest-scoring tokens of each row, whose logits are ``hidden . weight[token]`` in float32.

    ``fast`` is the reduced-precision projection (returns [..., V] in any float dtype); ``weight`` [V, H] the
    weights it approximates (any float dtype; upcast row by row).
    """
    approx = fast(hidden).float()  # [..., V]
    if approx.shape[-1] != weight.shape[0]:
        raise ValueError(f"fast projection gives {approx.shape[-1]} logits, the weight has {weight.shape[0]} rows")
    top = min(top, approx.shape[-1])
    if _own_kernel(approx) and cpu_kernels.serves(hidden, weight) and weight.is_contiguous() \
            and weight.shape[-1] % 16 == 0 and approx.is_contiguous():
        # top-k and the candidates' dot products in one pass over each row, the weight rows read in place
        # (``kernels/select.cpp``): ~0.1 ms less a forward at 1 token, 0.1-0.3 at 8 on a 2-core EPYC (two runs)
        # (docs/results/epyc-2026-11-28-s29/rescore_ab.txt)
        torch.ops.eaglespec.rescore_rows_(approx, hidden.detach(), weight.detach(), top)
        return approx
    cand = topk_indices(approx, top)  # [..., R]
    rows = weight[cand].float()  # [..., R, H]
    exact = (hidden.float().unsqueeze(-2) * rows).sum(-1)  # [..., R]
    return approx.scatter_(-1, cand, exact)


def _own_kernel(x: Tensor) -> bool:
    """Whether ``x`` goes to our selection kernels (``kernels/select.cpp``): ``cpu_kernels.serves`` it (packed
    models load the kernels; others keep torch's). Unlike the layer kernels, also while compiling (the op is
    registered for graphs) and under autograd (indices carry no gradient: the kernels read a detached view)."""
    return x.shape[-1] > 0 and cpu_kernels.serves(x)


def argmax(x: Tensor) -> Tensor:
    """int64 [...]: the index of the largest of each row of ``x`` [..., V], the first one on ties (NaN ranks
    above every number), as ``x.argmax(-1)``. On the CPU, 8 us a row of 49152 where torch's takes ~85
    (``kernels/select.cpp``): every greedy step asks it once per scored position."""
    if _own_kernel(x):
        return torch.ops.eaglespec.argmax_rows(x.detach())
    return x.argmax(dim=-1)


def topk_indices(x: Tensor, k: int) -> Tensor:
    """int64 [..., k]: the indices of the ``k`` largest of each row of ``x`` [..., V], by descending value (the
    values of ``x.topk(k).indices``; among exactly equal values, the smaller indices first). On the CPU ~11 us a
    row of 49152 where torch's takes ~127 (``kernels/select.cpp``)."""
    if _own_kernel(x):
        return torch.ops.eaglespec.topk_rows(x.detach(), k)
    return x.topk(k, dim=-1).indices
