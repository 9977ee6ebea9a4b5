"""The int4-weight x int8-activation matmul (``kernels/w4a8.cpp``): building it, packing weights for it, and
calling it.

Why by hand: see the C++ file. In short, torch 2.13's CPU int4 kernel costs more with every row it multiplies
(a tree's verification pays per token), while quantizing the activations per row to int8 lets AVX-512 VNNI
do the work on integers: on a 2-core AVX-512 EPYC the 30 decoder layers' linears of SmolLM2-135M take 3.7 /
3.9 / 6.1 / 9.7 ms at 1 / 4 / 8 / 16 rows against torch's 5.6 / 8.0 / 13.3 / 23.5 (docs/RUNTIME.md).

The kernel is built on first use (``cpu_kernels``); where it cannot run (no AVX-512 VNNI, not x86-64 Linux, no
compiler) ``available()`` says why and int4 weights keep torch's kernel.

Numerics: a row x is cut into blocks of 32 and each block quantized to int8 with the scale d = max|x| / 127
(round to nearest even); the weight is w = scale * q + offset with q in 0..15 and scale, offset in float16
per block of 32 (GGUF's Q4_0 / Q4_1 blocks exactly). Per block: sum(w x) ~= scale d sum(q xq) + offset d
sum(xq). Rows are independent and integer sums exact, so a row's output does not depend on the other rows
(bit-identical decode and verification: greedy speculation stays identical to vanilla).
"""

from __future__ import annotations

import torch
from torch import Tensor

from eaglespec.runtime.cpu_kernels import available, unavailable_reason

__all__ = ["GROUP", "TILE", "available", "dequantize", "mm", "pack", "reference_mm", "unavailable_reason"]

GROUP = 32  # input values per block (one scale and offset)
TILE = 16  # output channels per tile (one AVX-512 register of float32)


# ================================================================================================= layout
def pack(q: Tensor, scale: Tensor, offset: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's layout of ``w = scale * q + offset`` (q int [N, K] in 0..15, scale/offset [N, K/32]).

    Returns wq uint8 [N/16, K/32, 4, 64] (chunk c: inputs 8c..8c+7 of the block; byte 4j + t: output j's input
    8c + t in the low nibble, 8c + 4 + t in the high one) and scale, offset float16 [N/16, K/32, 16]."""
    n, k = q.shape
    if n % TILE or k % GROUP:
        raise ValueError(f"w4a8: a [{n}, {k}] weight needs rows in multiples of {TILE} and columns of {GROUP}")
    if scale.shape != (n, k // GROUP) or offset.shape != scale.shape:
        raise ValueError(f"w4a8: scale {tuple(scale.shape)} / offset {tuple(offset.shape)} do not match "
                         f"[{n}, {k // GROUP}]")
    t, g = n // TILE, k // GROUP
    qq = q.to(torch.uint8).reshape(t, TILE, g, 4, 8)  # tile, j, block, chunk, input in chunk
    wq = (qq[..., :4] | (qq[..., 4:] << 4)).permute(0, 2, 3, 1, 4).reshape(t, g, 4, 64).contiguous()
    per_tile = (lambda s: s.to(torch.float16).reshape(t, TILE, g).permute(0, 2, 1).contiguous())
    return wq, per_tile(scale), per_tile(offset)


def _unpack(wq: Tensor, scale: Tensor, offset: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(q [N, K/32, 32], scale [N, K/32], offset [N, K/32]) as float64, from the kernel's layout."""
    t, g = wq.shape[:2]
    b = wq.reshape(t, g, 4, TILE, 4)
    q = torch.cat([b & 0x0F, b >> 4], dim=-1)  # [t, g, chunk, j, 8]
    q = q.permute(0, 3, 1, 2, 4).reshape(t * TILE, g, GROUP).double()
    per_row = (lambda s: s.double().permute(0, 2, 1).reshape(t * TILE, g))
    return q, per_row(scale), per_row(offset)


def dequantize(wq: Tensor, scale: Tensor, offset: Tensor) -> Tensor:
    """float32 [N, K]: the weight a packed triple encodes (inverse of ``pack``)."""
    q, sc, off = _unpack(wq, scale, offset)
    return (q * sc[..., None] + off[..., None]).float().reshape(q.shape[0], -1)


# =================================================================================================== math
def mm(x: Tensor, wq: Tensor, scale: Tensor, offset: Tensor) -> Tensor:
    """float32 [M, N] = x [M, K] @ W.T (x cast to float32)."""
    return torch.ops.eaglespec.w4a8_mm(x if x.dtype == torch.float32 else x.float(), wq, scale, offset)


def reference_mm(x: Tensor, wq: Tensor, scale: Tensor, offset: Tensor) -> Tensor:
    """What the kernel computes, in float64 from the same quantized activations (the tests' oracle)."""
    m, k = x.shape
    xb = x.double().reshape(m, k // GROUP, GROUP)
    amax = xb.abs().amax(-1, keepdim=True)
    d = (amax.float() / 127.0).double()  # the kernel's float32 scale
    inv = torch.where(amax > 0, (127.0 / amax.float()).double(), torch.zeros_like(amax))
    xq = torch.round((xb.float() * inv.float()).double()).clamp(-128, 127)  # [M, G, 32]
    qw, sc, off = _unpack(wq, scale, offset)  # [N, G, 32], [N, G], [N, G]
    isum = torch.einsum("mgk,ngk->mng", xq, qw)  # [M, N, G]
    return (isum * sc[None] * d[..., 0][:, None, :] + off[None] * (d[..., 0] * xq.sum(-1))[:, None, :]).sum(-1)
