"""The int4-weight x int8-activation matmul (``kernels/w4a8.cpp``): building it, packing weights for it, and
calling it.

Why by hand: see the C++ file. In short, torch 2.13's CPU int4 kernel costs more with every row it multiplies
(a tree's verification pays per token), while quantizing the activations per row to int8 lets AVX-512 VNNI
do the work on integers: on a 2-core AVX-512 EPYC the 30 decoder layers' linears of SmolLM2-135M take 3.7 /
3.9 / 6.1 / 9.7 ms at 1 / 4 / 8 / 16 rows against torch's 5.6 / 8.0 / 13.3 / 23.5 (docs/RUNTIME.md).

The kernel is compiled on first use with the C++ compiler torch's extension builder finds (ninja + g++/clang),
into the cache directory, and reused after that (rebuilt when the source changes). Where it cannot run (no
AVX-512 VNNI, not x86-64 Linux, no compiler) ``available()`` says why and int4 weights keep torch's kernel.

Numerics: a row x is cut into blocks of 32 and each block quantized to int8 with the scale d = max|x| / 127
(round to nearest even); the weight is w = scale * q + offset with q in 0..15 and scale, offset in float16
per block of 32 (GGUF's Q4_0 / Q4_1 blocks exactly). Per block: sum(w x) ~= scale d sum(q xq) + offset d
sum(xq). Rows are independent and integer sums exact, so a row's output does not depend on the other rows
(bit-identical decode and verification: greedy speculation stays identical to vanilla).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import sys
import threading
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["GROUP", "TILE", "available", "dequantize", "mm", "pack", "reference_mm", "unavailable_reason"]

logger = logging.getLogger(__name__)

GROUP = 32  # input values per block (one scale and offset)
TILE = 16  # output channels per tile (one AVX-512 register of float32)
_SOURCE = Path(__file__).with_name("kernels") / "w4a8.cpp"
_REQUIRED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma")
_FLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]

_lock = threading.Lock()
_state: dict[str, object] = {}  # "ok": bool, "why": str


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _put_ninja_on_path() -> None:
    """torch's extension builder runs ``ninja`` from PATH; the ``ninja`` package's binary is not on it when the
    virtual environment is not activated (``.venv/bin/eaglespec``)."""
    try:
        import ninja
    except ImportError:
        return
    bin_dir = getattr(ninja, "BIN_DIR", None)
    if bin_dir and bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def _build(cache_dir: Path | None) -> tuple[bool, str]:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False, f"needs x86-64 Linux (this is {sys.platform} {platform.machine()})"
    missing = [f for f in _REQUIRED_FLAGS if f not in _cpu_flags()]
    if missing:
        return False, f"this CPU lacks {', '.join(missing)}"
    if cache_dir is None:
        from eaglespec.runtime.cachedir import cache_root

        cache_dir = cache_root()
    source = _SOURCE.read_bytes()
    tag = hashlib.sha256(source + " ".join(_FLAGS).encode() + torch.__version__.encode()).hexdigest()[:12]
    name = f"eaglespec_w4a8_{tag}"
    build_dir = Path(cache_dir) / "kernels" / name
    try:
        from torch.utils.cpp_extension import load

        _put_ninja_on_path()
        build_dir.mkdir(parents=True, exist_ok=True)
        load(name=name, sources=[str(_SOURCE)], extra_cflags=_FLAGS, extra_ldflags=["-fopenmp"],
             build_directory=str(build_dir), is_python_module=False, verbose=False)
    except Exception as e:  # no compiler, no ninja, a compiler that rejects the flags: torch's kernel instead
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return False, f"building {_SOURCE.name} failed ({first[:200]}); see docs/RUNTIME.md"
    return True, f"built in {build_dir}"


def available(cache_dir: str | Path | None = None) -> bool:
    """Whether the kernel runs here (built and loaded on the first call; later calls are free)."""
    with _lock:
        if "ok" not in _state:
            ok, why = _build(Path(cache_dir) if cache_dir is not None else None)
            _state.update(ok=ok, why=why)
            if ok:
                _register_fake()
            else:
                logger.warning("int4 x int8 kernel unavailable: %s; int4 weights use torch's kernel", why)
        return bool(_state["ok"])


def unavailable_reason() -> str:
    """Why ``available()`` said no ("" when it said yes or was not asked yet)."""
    return "" if _state.get("ok", True) else str(_state["why"])


def _register_fake() -> None:
    """Shapes for torch.compile (the compiled step calls the op as an external kernel)."""
    try:
        @torch.library.register_fake("eaglespec::w4a8_mm")
        def _(x, wq, scale, offset):
            return x.new_empty((x.shape[0], wq.shape[0] * TILE))
    except RuntimeError:  # registered already (a second build of the same library in this process)
        pass


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
    return torch.ops.eaglespec.w4a8_mm(x.float(), wq, scale, offset)


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
