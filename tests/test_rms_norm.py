"""Our one-call RMSNorm kernel (kernels/rms_norm.cpp) against torch's, and where model.rms_norm uses it."""

import pytest
import torch
import torch.nn.functional as F

from eaglespec.runtime import cpu_kernels
from eaglespec.runtime.model import rms_norm

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"our CPU kernels do not run here: {cpu_kernels.unavailable_reason()}")


def _reference(x, w, eps):
    return w * F.rms_norm(x.float(), (x.shape[-1],), eps=eps)


@pytest.mark.parametrize("shape", [(1, 1, 576), (3, 7, 64), (40, 72), (2, 5)])
def test_kernel_matches_torchs_rms_norm(shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g) * 3
    w = torch.randn(shape[-1], generator=g)
    got = torch.ops.eaglespec.rms_norm(x, w, 1e-5)
    assert got.shape == x.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, _reference(x, w, 1e-5), rtol=2e-6, atol=2e-6)
    zeros = torch.ops.eaglespec.rms_norm(torch.zeros(2, shape[-1]), w, 1e-5)  # eps keeps an all-zero row finite
    assert torch.equal(zeros, torch.zeros(2, shape[-1]))


def test_a_rows_result_does_not_depend_on_the_other_rows():
    """Decode normalizes one row, verification many: bit-identical results keep speculation lossless."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(33, 576, generator=g), torch.randn(576, generator=g)
    many = torch.ops.eaglespec.rms_norm(x, w, 1e-6)  # > 16 rows: split over threads
    for i in (0, 16, 32):
        assert torch.equal(torch.ops.eaglespec.rms_norm(x[i : i + 1], w, 1e-6)[0], many[i])


def test_model_norm_uses_the_kernel_only_without_gradients():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(4, 576, generator=g), torch.randn(576, generator=g)
    with torch.inference_mode():
        assert torch.equal(rms_norm(x, w, 1e-5), torch.ops.eaglespec.rms_norm(x, w, 1e-5))
    wg = w.clone().requires_grad_(True)
    y = rms_norm(x, wg, 1e-5)  # training: torch's differentiable norm
    y.sum().backward()
    torch.testing.assert_close(wg.grad, F.rms_norm(x, (576,), eps=1e-5).sum(0))
    half = rms_norm(x.bfloat16(), w.bfloat16(), 1e-5)  # other dtypes: torch's, in the input's dtype
    assert half.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="w must be"):
        torch.ops.eaglespec.rms_norm(x, w[:10], 1e-5)
