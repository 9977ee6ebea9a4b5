"""Our C++ CPU kernels (``kernels/*.cpp``, registered as ``torch.ops.eaglespec.*``): built on first use, cached.

Why by hand: see each source (``w4a8.cpp``: the int4 x int8 matmul; ``row_attention.cpp``: attention whose
result for a query does not depend on the other queries in the call; ``rms_norm.cpp``: a norm in one call;
``select.cpp``: argmax, top-k and inverse-CDF draws of vocabulary rows; ``verify_chain.cpp``: a sampled chain's
verification in one call; ``draft_draw.cpp``: the draft head's sampled children in one call;
``layer_elementwise.cpp``: rotary and SwiGLU in one call each; ``layer_step.cpp``: a packed decoder layer of a
decode step in one call). They need AVX-512 with VNNI
on x86-64 Linux and a C++ compiler: torch's extension builder (ninja + g++/clang) compiles them into one
library under the cache directory the first time (~20 s), and later processes load it (a changed source,
flag or torch version builds a new one). Where they cannot run,
``available()`` is False and ``unavailable_reason()`` says why; callers then keep torch's kernels.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import sys
import threading
from pathlib import Path

import torch

__all__ = ["HEADERS", "SOURCES", "available", "cpuinfo", "loaded", "serves", "unavailable_reason"]

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name("kernels") / name
           for name in ("w4a8.cpp", "row_attention.cpp", "rms_norm.cpp", "select.cpp", "layer_elementwise.cpp",
                        "layer_step.cpp", "verify_chain.cpp", "draft_draw.cpp")]
HEADERS = [Path(__file__).with_name("kernels") / name  # included by the sources: part of the build id
           for name in ("row_draw.h", "layer_parts.h")]
_REQUIRED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma")
_FLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]

_lock = threading.Lock()
_state: dict[str, object] = {}  # "ok": bool, "why": str


def cpuinfo(field: str) -> str | None:
    """The first ``field`` line of /proc/cpuinfo ("model name", "flags"), or None (no such file or line)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_flags() -> set[str]:
    return set((cpuinfo("flags") or "").split())


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
    name = f"eaglespec_kernels_{build_id()}"
    build_dir = Path(cache_dir) / "kernels" / name
    try:
        from torch.utils.cpp_extension import load

        _put_ninja_on_path()
        build_dir.mkdir(parents=True, exist_ok=True)
        load(name=name, sources=[str(s) for s in SOURCES], extra_cflags=_FLAGS, extra_ldflags=["-fopenmp"],
             build_directory=str(build_dir), is_python_module=False, verbose=False)
    except Exception as e:  # no compiler, no ninja, a compiler that rejects the flags: torch's kernels instead
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return False, f"building the CPU kernels failed ({first[:200]}); see docs/RUNTIME.md"
    return True, f"built in {build_dir}"


def build_id() -> str:
    """12 hex digits naming this build of the kernels (their sources, flags and torch version): a changed
    kernel is a new build, and what was measured with the old one (calibration, kernel plans) is not reused
    (``runtime.quant.machine_fingerprint``, asked once per packed weight shape: the digest is read once)."""
    return _digest(tuple(SOURCES) + tuple(HEADERS), tuple(_FLAGS), torch.__version__)


@functools.lru_cache(maxsize=None)
def _digest(sources: tuple[Path, ...], flags: tuple[str, ...], torch_version: str) -> str:
    digest = hashlib.sha256(" ".join(flags).encode() + torch_version.encode())
    for src in sources:
        digest.update(src.read_bytes())
    return digest.hexdigest()[:12]


def _register_fakes() -> None:
    """Output shapes for torch.compile (the compiled step calls the ops as external kernels)."""
    def register(name, fn):
        try:
            torch.library.register_fake(f"eaglespec::{name}")(fn)
        except RuntimeError:  # registered already in this process
            pass

    register("w4a8_mm", lambda x, wq, scale, offset: x.new_empty((x.shape[0], wq.shape[0] * 16)))
    register("row_attention", lambda q, keys, values, mask: q.new_empty(
        (q.shape[0], q.shape[2], q.shape[1], q.shape[3])))
    register("rms_norm", lambda x, w, eps: torch.empty_like(x))
    register("rotary", lambda x, cos, sin: x.new_empty(x.shape))
    register("silu_mul", lambda gate, up: gate.new_empty(gate.shape))
    register("argmax_rows", lambda x: x.new_empty(x.shape[:-1], dtype=torch.long))
    register("topk_rows", lambda x, k: x.new_empty((*x.shape[:-1], k), dtype=torch.long))
    register("sample_rows", lambda probs, u: u.new_empty(u.shape, dtype=torch.long))
    register("rescore_rows_", lambda scores, hidden, weight, top: None)
    register("verify_chain_sampled", lambda tokens, p, q, u_accept, u_sample, width: (
        tokens.new_empty((p.shape[0], width)), tokens.new_empty(p.shape[:1]), tokens.new_empty(p.shape[:1]),
        p.new_empty(p.shape[:1])))
    register("draft_draw", lambda logits, temperature, u, d2t, vocab: (
        d2t.new_empty(logits.shape[:2]), logits.new_empty(logits.shape[:2]),
        logits.new_empty((*logits.shape[:2], vocab))))


def available(cache_dir: str | Path | None = None) -> bool:
    """Whether the kernels run here (built or loaded on the first call; later calls are free)."""
    with _lock:
        if "ok" not in _state:
            ok, why = _build(Path(cache_dir) if cache_dir is not None else None)
            _state.update(ok=ok, why=why)
            if ok:
                _register_fakes()
            else:
                logger.warning("eaglespec CPU kernels unavailable: %s; torch's kernels are used instead", why)
        return bool(_state["ok"])


def loaded() -> bool:
    """Whether an earlier ``available()`` in this process loaded the kernels (never builds them): code that
    could use them on any model (``model.rms_norm``) asks this, so that only the paths that need them (packed
    int4 weights in ``w4a8``, ``row_attention``) pay for a build."""
    return bool(_state.get("ok"))


def serves(*tensors: torch.Tensor) -> bool:
    """Whether the kernels can take these tensors: loaded in this process (``loaded``) and every tensor float32
    on the CPU. What else a caller needs (no gradients, not being compiled) is the caller's to add."""
    if not loaded():
        return False
    for t in tensors:  # a plain loop and ``is_cpu``: asked ~120 times a decode step, a generator and
        if t.dtype is not torch.float32 or not t.is_cpu:  # ``device.type`` cost ~1.5 us a call
            return False
    return True


def unavailable_reason() -> str:
    """Why ``available()`` said no ("" when it said yes or was not asked yet)."""
    return "" if _state.get("ok", True) else str(_state["why"])
