"""The C allocator's settings for a process that decodes: keep freed memory for the next step's tensors.

Why by hand: glibc's ``malloc`` gives each block above ``M_MMAP_THRESHOLD`` (128 KiB at start, raised on the fly
by frees up to 32 MiB) its own ``mmap`` and hands it back on ``free``, and returns the top of its heap to the
kernel once more than ``M_TRIM_THRESHOLD`` of it is free. A decode step allocates and frees tens of tensors of
that size: every position's logits over a 49152-token vocabulary are 192 KiB in float32 (768 KiB at batch 4),
and so are their probabilities, the rescoring's, sampling's and verification's temporaries, and every prompt's
activations. Each such block then comes back as fresh pages, paid in page faults on first touch (a sampled
verification of a chain of 1 at batch 4: 2.7-4.0 ms with the defaults, 0.5-0.9 ms with the thresholds raised, 2-core
EPYC; whole decoding runs 4-23% faster, ``docs/RUNTIME.md``). Neither torch nor Python sets them; jemalloc or tcmalloc preloaded (``LD_PRELOAD``) would do the same
job. ``tune`` raises both thresholds for this process (the env variables ``MALLOC_MMAP_THRESHOLD_`` /
``MALLOC_TRIM_THRESHOLD_`` do so at start-up, and where either is set the user's choice stands). The cost: up to
``trim_threshold`` of freed memory stays mapped to the process for its next allocations.

``eaglespec``'s commands call it before loading a model; programs that use the library call it themselves.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

log = logging.getLogger(__name__)

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune"]

MMAP_THRESHOLD = 32 << 20  # blocks below this come from the heap (the most every 64-bit glibc accepts)
TRIM_THRESHOLD = 256 << 20  # free heap kept before any is returned to the kernel
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc's malloc.h)
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_done: list[str] = []  # the outcome of the first call in this process


def tune(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> str:
    """Raise glibc malloc's mmap and trim thresholds for this process (see the module docstring); returns what
    happened, as a phrase ("tuned", or why not: not glibc, set by the environment, refused). Idempotent: only
    the first call in a process acts."""
    if _done:
        return _done[0]
    if mmap_threshold <= 0 or trim_threshold <= 0:
        raise ValueError(f"thresholds must be positive, got mmap {mmap_threshold}, trim {trim_threshold}")
    _done.append(_tune(mmap_threshold, trim_threshold))
    log.debug("allocator: %s", _done[0])
    return _done[0]


def _tune(mmap_threshold: int, trim_threshold: int) -> str:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"not glibc ({platform.system()} {platform.libc_ver()[0] or 'unknown libc'}): left as it is"
    given = [name for name in _ENV if os.environ.get(name)]
    if given:
        return f"set by the environment ({', '.join(given)}): left as it is"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(min(mmap_threshold, 2**31 - 1))) == 1
        ok = ok and libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(min(trim_threshold, 2**31 - 1))) == 1
    except (OSError, AttributeError) as e:
        return f"mallopt unavailable ({e}): left as it is"
    return "tuned" if ok else "mallopt refused the thresholds: left as it is"
