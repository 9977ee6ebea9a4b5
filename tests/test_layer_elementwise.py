"""Our one-call rotary and SwiGLU kernels (kernels/layer_elementwise.cpp) against torch's operators, and where
runtime.model uses them."""

import pytest
import torch
import torch.nn.functional as F

from eaglespec.runtime import cpu_kernels
from eaglespec.runtime.model import apply_rotary, silu_mul

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"our CPU kernels do not run here: {cpu_kernels.unavailable_reason()}")


def _rotary_reference(x, cos, sin_signed):
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


def _tables(b, t, d, g):
    """Random cos and sin_signed tables [b, t, 1, d] (b = 1: one table broadcast over the batch)."""
    return torch.randn(b, t, 1, d, generator=g), torch.randn(b, t, 1, d, generator=g)


@pytest.mark.parametrize("shape", [(1, 1, 12, 64), (2, 5, 4, 128), (3, 2, 2, 40), (1, 3, 1, 6)])
def test_rotary_matches_torchs_operators(shape):
    g = torch.Generator().manual_seed(sum(shape))
    b, t, h, d = shape
    qkv = torch.randn(b, t, h + 3, d, generator=g) * 3
    x = qkv[:, :, :h]  # a slice of one projection, as queries and keys are: not contiguous
    cos, sin = _tables(b, t, d, g)
    got = torch.ops.eaglespec.rotary(x, cos, sin)
    assert got.shape == x.shape and got.is_contiguous()
    if d % 32 == 0:  # whole vectors per half (head dims 64, 128): torch's fused multiply-add, bit for bit
        assert torch.equal(got, _rotary_reference(x, cos, sin))
    torch.testing.assert_close(got, _rotary_reference(x, cos, sin), rtol=1e-6, atol=1e-6)
    one = torch.ops.eaglespec.rotary(x[:1, :1].contiguous(), cos[:1, :1], sin[:1, :1])
    assert torch.equal(one[0, 0], got[0, 0])  # a token's result does not depend on the others in the call


def test_rotary_broadcasts_tables_and_refuses_bad_shapes():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 2, 64, generator=g)
    cos, sin = _tables(1, 4, 64, g)  # [1, T, 1, D]: apply_rotary expands it
    with torch.inference_mode():
        torch.testing.assert_close(apply_rotary(x, cos, sin), _rotary_reference(x, cos, sin), rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="expanded to"):
        torch.ops.eaglespec.rotary(x, cos, sin)
    with pytest.raises(RuntimeError, match="D even"):
        torch.ops.eaglespec.rotary(torch.randn(1, 1, 1, 5), torch.randn(1, 1, 1, 5), torch.randn(1, 1, 1, 5))


@pytest.mark.parametrize("shape", [(1, 1, 1536), (2, 7, 64), (5, 17), (3,)])
def test_silu_mul_matches_torchs_operators(shape):
    g = torch.Generator().manual_seed(sum(shape))
    gu = torch.randn(*shape[:-1], 2 * shape[-1], generator=g) * 4
    gate, up = gu.chunk(2, dim=-1)  # views of one projection, rows strided
    got = torch.ops.eaglespec.silu_mul(gate, up)
    assert got.shape == gate.shape and got.is_contiguous()
    if shape[-1] % 16 == 0:  # whole vectors (every model's MLP width): torch's own arithmetic, bit for bit
        assert torch.equal(got, F.silu(gate) * up)
    else:  # torch computes a tensor's last few values with the scalar exp, which may round otherwise
        torch.testing.assert_close(got, F.silu(gate) * up, rtol=3e-7, atol=1e-7)


def test_silu_mul_at_the_extremes():
    gate = torch.tensor([-1e30, -200.0, -88.0, -20.0, -1e-30, 0.0, 1e-30, 20.0, 88.0, 200.0, 1e30,
                         float("inf"), float("-inf")])
    up = torch.full_like(gate, 2.0)
    got = torch.ops.eaglespec.silu_mul(gate, up)
    # -huge: -0; +inf: inf; -inf: NaN (-inf / inf), each as torch's
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=3e-7, atol=1e-30, equal_nan=True)
    assert got[-2] == float("inf") and got[-1].isnan()


def test_model_helpers_use_the_kernels_only_without_gradients():
    g = torch.Generator().manual_seed(5)
    gate, up = torch.randn(4, 96, generator=g), torch.randn(4, 96, generator=g)
    with torch.inference_mode():
        assert torch.equal(silu_mul(gate, up), torch.ops.eaglespec.silu_mul(gate, up))
    wg = gate.clone().requires_grad_(True)
    y = silu_mul(wg, up)  # training: torch's differentiable operators
    y.sum().backward()
    torch.testing.assert_close(wg.grad, torch.func.grad(lambda a: (F.silu(a) * up).sum())(gate))
    assert silu_mul(gate.bfloat16(), up.bfloat16()).dtype == torch.bfloat16  # other dtypes: torch's
