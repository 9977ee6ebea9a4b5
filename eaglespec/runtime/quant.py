"""Packed low-bit linear layers: int8 (per output channel) and int4 (group-wise, asymmetric) weights run by
torch's own CPU kernels, with the kernel chosen per row count from measurements on this machine.

Why by hand: torch ships the kernels (``aten._weight_int8pack_mm``, ``aten._weight_int4pack_mm_for_cpu``) but
no layer that picks between them and a dense matmul by shape. Which one wins depends on the CPU and on the
number of rows in the forward (1 for decode, N for verifying N tree tokens, hundreds for prefill): on an
AVX2-only EPYC int8 is ~2x faster than float32 at 1-4 rows and loses its lead by 8, on AVX-512 machines int4 wins
at 1 row; prefill is compute-bound, where a dense float32 matmul beats torch's int4 kernel but our ``w4a8``
beats both on speed (2.7x float32 at 128-512 rows on a 2-core EPYC). So each layer carries a ``KernelPlan``
for its prompt forwards (row-count buckets -> kernel) measured by ``calibrate_kernels`` per weight shape and
cached per machine (``pack.pack_model`` / ``pack_linears`` with ``kernel_cache``, which ``load_target`` and
the draft head loader pass; a w4a8 target's prompts run densely for their numerics, see ``pack_model``); a
layer whose plan never runs densely keeps no dense copy. The dense copy is float32, or bfloat16 where the machine
multiplies bfloat16 clearly faster (``calibrate_prompt_dtype``; ``PROMPT_DTYPES``).

Formats and what the kernels compute (activations are cast to bfloat16 for the packed kernels, the output
back to the input dtype):
  * int8: ``y = (x @ q.T) * scale[n]``, q int8 [N, K], scale [N].
  * int4: ``w[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n]`` for group g = k // G, q in 0..15. GGUF's
    Q4_1 blocks (``d * q + m``) map onto it exactly with scale = d and zero = m + 8 d; Q4_0 (``d * (q - 8)``)
    with zero = 0. Two kernels (``INT4_KERNELS``):
      - ``w4a8`` (ours, ``runtime/w4a8.py``; the default where AVX-512 VNNI and a compiler are there): the
        activations are quantized per row to int8 blocks of 32, scales held in float16 (GGUF's own, exact);
        float32 in and out.
      - ``torch`` (``aten._weight_int4pack_mm_for_cpu``): bfloat16 activations; the scales are held in
        bfloat16 (the kernel's dtype), so d and m lose their last three fp16 mantissa bits: the dequantized
        reference is computed from the same bfloat16 scales.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eaglespec.runtime import cpu_kernels, w4a8

__all__ = ["FORMATS", "INT4_KERNELS", "PROMPT_DTYPES", "KernelPlan", "PackedLinear", "calibrate_kernels",
           "calibrate_prompt_dtype", "default_plan", "linear", "resolve_prompt_dtype",
           "dequantize_int4", "quantize_int4", "quantize_int8", "resolve_int4_kernel"]

FORMATS = ("int8", "int4")
INT4_KERNELS = ("auto", "w4a8", "torch")
"""``auto``: ``w4a8`` where it runs (``w4a8.available()``), else ``torch``."""
KERNELS = ("packed", "dense")
ROW_BUCKETS = (4, 16, 64, 256)  # prefill sizes
DENSE_MARGIN = 1.1  # calibrate_kernels keeps a dense copy only where it is at least this much faster
PROMPT_DTYPES = ("auto", "float32", "bfloat16")
"""The dtype of the dense copy that prompt forwards multiply by: ``auto`` = bfloat16 where this machine's bfloat16
matmuls are clearly faster than float32 ones (``calibrate_prompt_dtype``), else float32."""
PROMPT_ROWS = (64, 256)  # prompt sizes calibrate_prompt_dtype times
BF16_MARGIN = 1.2  # bfloat16 prompts only where they are at least this much faster than float32 ones


@dataclass
class KernelPlan:
    """Per format: the kernel for PREFILL forwards of up to ``bucket`` rows (larger row counts use the last
    entry). Decode and verification forwards always run the packed kernel: the packed kernels compute each row
    independently of the others (tested), so a verified tree token gets bit-identical logits to the same token
    decoded alone, which keeps greedy speculative output identical to vanilla output in the same precision.
    Switching kernels by row count there would break that (measured: a 16-token tree verified densely while
    vanilla decoded packed diverged within 40 tokens on the default model)."""

    choice: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    measured_on: str = "default"
    dense_dtype: torch.dtype | None = None
    """The dense copy's dtype, in which dense rows are computed (None: float32, computed in the input's dtype)."""

    def kernel(self, fmt: str, rows: int) -> str:
        table = self.choice.get(fmt) or [(1 << 30, "packed")]
        for bucket, k in table:
            if rows <= bucket:
                return k
        return table[-1][1]

    def needs_dense(self, fmt: str) -> bool:
        return any(k == "dense" for _, k in self.choice.get(fmt, ()))


def default_plan() -> KernelPlan:
    """Without measurements: prefills of up to 16 rows packed, longer ones dense float32 (compute-bound)."""
    return KernelPlan({f: [(16, "packed"), (1 << 30, "dense")] for f in FORMATS})


def resolve_prompt_dtype(name: str) -> str:
    """A ``--prompt-dtype`` value (``PROMPT_DTYPES``, aliases fp32 / bf16), normalized; anything else refused."""
    key = str(name).strip().lower()
    key = {"fp32": "float32", "bf16": "bfloat16"}.get(key, key)
    if key not in PROMPT_DTYPES:
        raise ValueError(f"unknown prompt dtype {name!r}; use one of {PROMPT_DTYPES}")
    return key


def resolve_int4_kernel(name: str) -> str:
    """``auto`` -> the fastest int4 kernel that runs here; an explicit ``w4a8`` that cannot run is refused."""
    name = name.strip().lower()
    if name not in INT4_KERNELS:
        raise ValueError(f"unknown int4 kernel {name!r}; use one of {INT4_KERNELS}")
    if name == "torch":
        return name
    if w4a8.available():
        return "w4a8"
    if name == "w4a8":
        raise ValueError(f"the w4a8 int4 kernel cannot run here: {w4a8.unavailable_reason()}")
    return "torch"


# ================================================================================================ packing
def quantize_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel int8: (q int8 [N, K], scale float32 [N]); w ~= q * scale[:, None]."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(w: Tensor, group_size: int = 32) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric group-wise int4: (q int32 [N, K] in 0..15, scale [N, K/G], zero [N, K/G]) with
    w ~= (q - 8) * scale + zero per group (min/max rounding)."""
    w = w.float()
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"int4: in_features {k} is not a multiple of the group size {group_size}")
    g = w.reshape(n, k // group_size, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15.0).clamp(min=1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
    return q, scale, lo + 8.0 * scale


def dequantize_int4(q: Tensor, scale: Tensor, zero: Tensor, group_size: int) -> Tensor:
    """float32 [N, K] = (q - 8) * scale + zero per group; q [N, K], scale/zero [N, K/G]."""
    n, k = q.shape
    qg = q.float().reshape(n, k // group_size, group_size)
    return ((qg - 8.0) * scale.float()[..., None] + zero.float()[..., None]).reshape(n, k)


class PackedLinear(nn.Module):
    """``y = x @ W.T (+ bias)`` with W held packed; see the module docstring for the formats."""

    def __init__(self, fmt: str, in_features: int, out_features: int, group_size: int = 0,
                 plan: KernelPlan | None = None, kernel: str = "torch") -> None:
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"unknown packed format {fmt!r}; use one of {FORMATS}")
        self.fmt, self.in_features, self.out_features, self.group_size = fmt, in_features, out_features, group_size
        self.kernel = kernel  # int4: "w4a8" or "torch" (resolved, see INT4_KERNELS); int8: "torch"
        self.plan = plan or default_plan()
        self.dense: Tensor | None = None  # float32 [N, K], only when the plan runs some rows densely
        self.bias: Tensor | None = None

    # ------------------------------------------------------------------------------------------ builders
    @classmethod
    def from_int8(cls, q: Tensor, scale: Tensor, plan: KernelPlan | None = None) -> PackedLinear:
        m = cls("int8", q.shape[1], q.shape[0], 0, plan)
        m.register_buffer("qweight", q.to(torch.int8).contiguous())
        m.register_buffer("scales", scale.to(torch.bfloat16).contiguous())
        m._finish()
        return m

    @classmethod
    def from_int4(cls, q: Tensor, scale: Tensor, zero: Tensor, group_size: int = 32,
                  plan: KernelPlan | None = None, kernel: str = "torch") -> PackedLinear:
        """q int [N, K] in 0..15; scale, zero [N, K/G] (convention (q - 8) * scale + zero); ``kernel``: one of
        ``INT4_KERNELS`` (``auto`` resolved here)."""
        n, k = q.shape
        if k % group_size or scale.shape != (n, k // group_size) or zero.shape != scale.shape:
            raise ValueError(f"int4: q {tuple(q.shape)}, scale {tuple(scale.shape)}, zero {tuple(zero.shape)} do "
                             f"not match group size {group_size}")
        if int(q.min()) < 0 or int(q.max()) > 15:
            raise ValueError("int4: quantized values must lie in 0..15")
        kernel = resolve_int4_kernel(kernel)
        if kernel == "w4a8" and group_size != w4a8.GROUP:
            kernel = "torch"  # the w4a8 layout holds blocks of 32 (both kernels need rows in multiples of 16)
        m = cls("int4", k, n, group_size, plan, kernel)
        if kernel == "w4a8":
            offset = zero.double() - 8.0 * scale.double()  # w = scale * q + offset (GGUF Q4_1: offset = m)
            wq, sc, off = w4a8.pack(q, scale, offset)
            m.register_buffer("w4_q", wq)
            m.register_buffer("w4_scale", sc)
            m.register_buffer("w4_offset", off)
            m._q_for_dense = q
            m._finish()
            return m
        m.register_buffer("qweight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            q.to(torch.int32).contiguous(), 1))
        sz = torch.stack([scale, zero], dim=-1).to(torch.bfloat16)  # [N, K/G, 2]
        m.register_buffer("scales_zeros", sz.transpose(0, 1).contiguous())  # [K/G, N, 2], the kernel's layout
        m._q_for_dense = q  # dropped after _finish builds the dense copy (if any)
        m._finish()
        return m

    @classmethod
    def from_float(cls, w: Tensor, fmt: str, group_size: int = 32, plan: KernelPlan | None = None,
                   kernel: str = "torch") -> PackedLinear:
        if fmt == "int8":
            return cls.from_int8(*quantize_int8(w), plan=plan)
        if fmt == "int4":
            return cls.from_int4(*quantize_int4(w, group_size), group_size=group_size, plan=plan, kernel=kernel)
        raise ValueError(f"unknown packed format {fmt!r}; use one of {FORMATS}")

    def _finish(self) -> None:
        if self.plan.needs_dense(self.fmt):
            self.dense = self.dequantize().to(self.plan.dense_dtype or torch.float32)
        self.__dict__.pop("_q_for_dense", None)

    # --------------------------------------------------------------------------------------------- math
    def dequantize(self) -> Tensor:
        """float32 [N, K]: the weight the packed kernel multiplies by (its rounded scales included). For int4 on
        torch's kernel only while the unpacked values are at hand (at construction): its layout is opaque."""
        if self.fmt == "int8":
            return self.qweight.float() * self.scales.float()[:, None]
        if self.kernel == "w4a8":
            return w4a8.dequantize(self.w4_q, self.w4_scale, self.w4_offset)
        q = getattr(self, "_q_for_dense", None)
        if q is None:
            raise RuntimeError("int4 weights can only be dequantized at construction (the packed layout is opaque)")
        sz = self.scales_zeros.float().transpose(0, 1)  # [N, K/G, 2]
        return dequantize_int4(q, sz[..., 0], sz[..., 1], self.group_size)

    def _packed(self, x2: Tensor) -> Tensor:
        b = self._buffers  # read directly: nn.Module's attribute fallback costs ~0.8 us a buffer, 120 layers a step
        if self.kernel == "w4a8":
            return w4a8.mm(x2, b["w4_q"], b["w4_scale"], b["w4_offset"])
        xb = x2.to(torch.bfloat16)
        if self.fmt == "int8":
            return torch.ops.aten._weight_int8pack_mm(xb, b["qweight"], b["scales"])
        return torch.ops.aten._weight_int4pack_mm_for_cpu(xb, b["qweight"], self.group_size, b["scales_zeros"])

    def forward(self, x: Tensor, prefill: bool = False) -> Tensor:
        """x [..., K] -> [..., N]; ``prefill``: a prompt forward, whose kernel the plan picks by row count."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if prefill and self.dense is not None and self.plan.kernel(self.fmt, x2.shape[0]) == "dense":
            if self.plan.dense_dtype is None:
                y = F.linear(x2, self.dense.to(x2.dtype))
            else:
                y = F.linear(x2.to(self.dense.dtype), self.dense).to(x.dtype)
        else:
            y = self._packed(x2)
            if y.dtype != x.dtype:
                y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        g = f", group_size={self.group_size}, kernel={self.kernel}" if self.fmt == "int4" else ""
        return f"{self.fmt}, in={self.in_features}, out={self.out_features}{g}"


def linear(x: Tensor, weight: Tensor | PackedLinear, bias: Tensor | None = None, prefill: bool = False) -> Tensor:
    """``F.linear`` for a dense weight, the packed layer's own kernels for a packed one."""
    if isinstance(weight, PackedLinear):
        # its forward, not __call__: nothing hooks these layers, and __call__'s hook checks cost ~2 us a call
        y = weight.forward(x, prefill)
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)


# ============================================================================================ calibration
def machine_fingerprint(threads: int | None = None) -> str:
    """What measurements made here are keyed by (kernel plans, calibration): the CPU, its cores, the threads,
    torch, and the build of our kernels when they are loaded (a changed kernel costs something else: the
    2026-11-27 attention kernel made a decode step ~3.5% cheaper)."""
    cpu = cpu_kernels.cpuinfo("model name") or platform.processor() or "cpu"
    threads = threads or torch.get_num_threads()
    kernels = f" | kernels {cpu_kernels.build_id()}" if cpu_kernels.loaded() else ""
    return f"{cpu} | {os.cpu_count()} cpus | {threads} threads | torch {torch.__version__}{kernels}"


def _prompt_times(layer: PackedLinear, dense: Tensor, x: Tensor, reps: int) -> tuple[float, float]:
    """Seconds of a prompt forward over ``x`` through the packed layer and through the dense weight (medians)."""
    return (_median_time(lambda: layer(x, True), reps),
            _median_time(lambda: F.linear(x.to(dense.dtype), dense).to(x.dtype), reps))


def calibrate_prompt_dtype(shapes: Sequence[tuple[int, int]], cache_dir: str | os.PathLike[str] | None = None,
                           rows: Sequence[int] = PROMPT_ROWS, reps: int = 5) -> torch.dtype:
    """bfloat16 if dense prompt matmuls over weights of ``shapes`` (out, in) run at least ``BF16_MARGIN`` times
    faster in bfloat16 than in float32 on this machine (summed over the shapes and ``rows``, the activations'
    casts included), else float32; cached per machine and shapes in ``cache_dir/kernels.json``.

    Why measured: CPUs with bfloat16 dot products (AVX512-BF16, AMX) multiply bfloat16 about twice as fast as
    float32 (2-core AMD EPYC, the default model's projections at 94 rows: 1.9x, a whole prompt forward 182 ->
    96 ms); without them oneDNN converts in software and bfloat16 loses."""
    shapes = sorted({tuple(int(d) for d in s) for s in shapes})
    key = (f"{machine_fingerprint()} | prompt dtype | {';'.join(f'{n}x{k}' for n, k in shapes)} | "
           f"{','.join(map(str, rows))}")
    path = Path(cache_dir) / "kernels.json" if cache_dir is not None else None
    cached = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    if key in cached:
        return torch.bfloat16 if cached[key] == "bfloat16" else torch.float32
    g = torch.Generator().manual_seed(0)
    t32 = t16 = 0.0
    for shape in shapes:
        w = torch.randn(shape, generator=g) * 0.02
        for n in rows:
            a, b = _dense_times(w, torch.randn(n, shape[1], generator=g), reps)
            t32, t16 = t32 + a, t16 + b
    choice = "bfloat16" if t16 * BF16_MARGIN < t32 else "float32"
    if path is not None:
        _store(path, key, choice)
    return torch.bfloat16 if choice == "bfloat16" else torch.float32


def _dense_times(w: Tensor, x: Tensor, reps: int) -> tuple[float, float]:
    """Seconds of ``x @ w.T`` in float32 and in bfloat16 (float32 in and out, as a prompt forward casts)."""
    wb = w.bfloat16()
    return (_median_time(lambda: F.linear(x, w), reps), _median_time(lambda: F.linear(x.bfloat16(), wb).float(), reps))


def _store(path: Path, key: str, value) -> None:
    """``kernels.json[key] = value``, written atomically (another process may have added keys meanwhile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cached = json.loads(path.read_text()) if path.is_file() else {}
    cached[key] = value
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(cached, indent=1))
    os.replace(tmp, path)


def _median_time(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def calibrate_kernels(shape: tuple[int, int], formats: Sequence[str] = FORMATS, buckets: Sequence[int] = ROW_BUCKETS,
                      cache_dir: str | os.PathLike[str] | None = None, reps: int = 7, kernel: str = "torch",
                      dense_dtype: torch.dtype | None = None) -> KernelPlan:
    """Time packed vs dense on a weight of ``shape`` (out, in) for each row bucket; cached per machine, shape,
    int4 kernel and dense dtype in ``cache_dir/kernels.json`` (a second call reads it back). ``kernel``: the
    int4 kernel that will run (``INT4_KERNELS``, resolved); ``dense_dtype``: the dense copy's dtype (None =
    float32)."""
    kernel = resolve_int4_kernel(kernel)
    dense_name = str(dense_dtype or torch.float32).removeprefix("torch.")
    key = (f"{machine_fingerprint()} | {shape[0]}x{shape[1]} | {','.join(map(str, buckets))} | int4 {kernel} | "
           f"dense {dense_name}")
    path = Path(cache_dir) / "kernels.json" if cache_dir is not None else None
    cached = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    if key in cached and all(f in cached[key] for f in formats):
        return KernelPlan({f: [tuple(e) for e in cached[key][f]] for f in formats}, key, dense_dtype)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=g) * 0.02
    dense = w.to(dense_dtype or torch.float32)
    choice: dict[str, list[tuple[int, str]]] = {}
    for fmt in formats:
        layer = PackedLinear.from_float(w, fmt, plan=KernelPlan({fmt: [(1 << 30, "packed")]}), kernel=kernel)
        table = []
        for rows in buckets:
            t_packed, t_dense = _prompt_times(layer, dense, torch.randn(rows, shape[1], generator=g), reps)
            # dense must win clearly: its copy costs memory (4 bytes a weight in float32), and one noisy reading
            # once kept a 212 MB copy of the default model's gate/up weights for 4-row prompts
            table.append((rows, "dense" if t_dense * DENSE_MARGIN < t_packed else "packed"))
        table[-1] = (1 << 30, table[-1][1])
        choice[fmt] = table
    if path is not None:
        _store(path, key, choice)
    return KernelPlan(choice, key, dense_dtype)
