// RMSNorm of float32 rows in one call: y = w * (x * rsqrt(mean(x^2) + eps)), each row on its own.
//
// Why by hand: torch 2.13's CPU rms_norm runs as separate operators (pow, mean, add, rsqrt, mul, then the
// weight), each dispatched from Python; an eager decode step of the default model runs 61 norms over one row
// of 576 values, where that dispatch, not the arithmetic, is the cost (~12 us a norm on a 2-core EPYC). One
// kernel call does the same float32 math: the sum of squares in a fixed order per row (16 lanes, then the
// lanes in a fixed tree), so a row's result never depends on the other rows in the call.
//
// Shapes: x float32 [..., H] with a contiguous last dimension; w float32 [H]. Returns float32 [..., H].
#include <immintrin.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>

#include "layer_parts.h"

namespace {

void norm_row(const float* x, const float* w, float* y, int64_t h, float eps) {
  __m512 acc = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= h; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  if (j < h) {
    const __mmask16 on = static_cast<__mmask16>((1u << (h - j)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(on, x + j);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(h) + eps);
  const __m512 s = _mm512_set1_ps(inv);
  for (j = 0; j + 16 <= h; j += 16)
    _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_loadu_ps(w + j), _mm512_mul_ps(_mm512_loadu_ps(x + j), s)));
  if (j < h) {
    const __mmask16 on = static_cast<__mmask16>((1u << (h - j)) - 1);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(on, w + j), _mm512_mul_ps(_mm512_maskz_loadu_ps(on, x + j), s));
    _mm512_mask_storeu_ps(y + j, on, v);
  }
}

}  // namespace

void eaglespec_kernels::rms_norm_rows(const float* xp, const float* wp, float* yp, int64_t rows, int64_t h, float e) {
  if (rows <= 16) {  // decode and verification: a thread pool wake-up costs more than the rows
    for (int64_t r = 0; r < rows; ++r) norm_row(xp + r * h, wp, yp + r * h, h, e);
  } else {
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) norm_row(xp + r * h, wp, yp + r * h, h, e);
    });
  }
}

namespace {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "rms_norm: float32 tensors only");
  TORCH_CHECK(x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(-1), "rms_norm: w must be [H] for x [..., H]");
  auto xc = x.contiguous();
  auto wc = w.contiguous();
  auto y = at::empty_like(xc);
  const int64_t h = x.size(-1), rows = h == 0 ? 0 : xc.numel() / h;
  eaglespec_kernels::rms_norm_rows(xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), rows, h,
                                   static_cast<float>(eps));
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eaglespec, m) { m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor"); }
TORCH_LIBRARY_IMPL(eaglespec, CPU, m) { m.impl("rms_norm", &rms_norm); }
