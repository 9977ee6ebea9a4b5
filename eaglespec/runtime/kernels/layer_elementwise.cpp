// A decoder layer's elementwise steps, one call each: the rotary embedding of queries and keys, and SwiGLU's
// silu(gate) * up. float32, each value computed on its own (no reductions), so a row's result never depends on
// the other rows in the call, and with torch's own arithmetic: bit-identical to torch's operators (tested;
// silu wherever a row's width is a multiple of 16, as every model's MLP is: torch computes a tensor's last
// few values with a scalar exp).
//
// Why by hand: eagerly, torch 2.13 runs the rotary embedding as three operators (x * cos, roll, addcmul; roll
// alone ~9 us on a 2-core Xeon) and SwiGLU as two (silu, mul), for each of the default model's 30 layers and
// every step: ~150 operator calls whose dispatch, not their arithmetic, is the cost at 1-8 tokens. (A compiled
// step fuses them itself; these run eagerly only.)
//
// Shapes:
//   rotary(x, cos, sin_signed): x float32 [B, T, Hn, D] with a contiguous last dimension (other strides free:
//     queries and keys are slices of one projection); cos, sin_signed float32 broadcastable to [B, T, 1, D]
//     (expanded by the caller: strides read here). Returns contiguous [B, T, Hn, D]:
//     y = x * cos + roll(x, D / 2) * sin_signed  (D even), one fused multiply-add as torch's addcmul.
//   silu_mul(gate, up): float32 [..., I] each (views of one [..., 2I] projection: rows strided), same shape.
//     Returns contiguous [..., I]: gate / (1 + exp(-gate)) * up.
#include <immintrin.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sleef.h>
#include <cmath>
#include <cstdint>

#include "layer_parts.h"

namespace {

// silu as torch 2.13's CPU kernel computes it, x / (1 + exp(-x)) with SLEEF's exp (the one libtorch ships and
// exports), times up: the products of F.silu(gate) * up, so nothing a user decodes changes.
inline __m512 silu_mul16(__m512 g, __m512 u) {
  const __m512 e = Sleef_expf16_u10(  // of -g: the sign bit flipped
      _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32(INT32_MIN))));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

void silu_mul_row(const float* g, const float* u, float* y, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, silu_mul16(_mm512_loadu_ps(g + j), _mm512_loadu_ps(u + j)));
  if (j < n) {
    const __mmask16 on = static_cast<__mmask16>((1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(y + j, on, silu_mul16(_mm512_maskz_loadu_ps(on, g + j), _mm512_maskz_loadu_ps(on, u + j)));
  }
}

// One head's D values: y[i] = x[i] * c[i] + x[(i + D/2) mod D] * s[i].
void rotary_row(const float* x, const float* c, const float* s, float* y, int64_t d) {
  const int64_t h = d / 2;
  int64_t j = 0;
  for (; j + 16 <= h; j += 16) {
    const __m512 lo = _mm512_loadu_ps(x + j), hi = _mm512_loadu_ps(x + h + j);
    _mm512_storeu_ps(y + j, _mm512_fmadd_ps(hi, _mm512_loadu_ps(s + j), _mm512_mul_ps(lo, _mm512_loadu_ps(c + j))));
    _mm512_storeu_ps(y + h + j,
                     _mm512_fmadd_ps(lo, _mm512_loadu_ps(s + h + j), _mm512_mul_ps(hi, _mm512_loadu_ps(c + h + j))));
  }
  for (; j < h; ++j) {
    y[j] = std::fma(x[h + j], s[j], x[j] * c[j]);
    y[h + j] = std::fma(x[j], s[h + j], x[h + j] * c[h + j]);
  }
}

template <typename F>
void for_items(int64_t items, int64_t grain, F&& fn) {
  if (items <= grain) {  // a decode step's rows: a thread pool wake-up costs more than they do
    for (int64_t i = 0; i < items; ++i) fn(i);
  } else {
    at::parallel_for(0, items, grain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) fn(i);
    });
  }
}

}  // namespace

void eaglespec_kernels::rotary_rows(const float* xp, int64_t x_b, int64_t x_t, int64_t batch, int64_t t,
                                    int64_t heads, int64_t d, const float* cp, int64_t c_b, int64_t c_t,
                                    const float* sp, int64_t s_b, int64_t s_t, float* yp) {
  for_items(batch * t, 8, [&](int64_t i) {
    const int64_t b = i / t, ti = i % t;
    const float* c = cp + b * c_b + ti * c_t;
    const float* s = sp + b * s_b + ti * s_t;
    for (int64_t hd = 0; hd < heads; ++hd)
      rotary_row(xp + b * x_b + ti * x_t + hd * d, c, s, yp + (i * heads + hd) * d, d);
  });
}

void eaglespec_kernels::silu_mul_rows(const float* gp, int64_t gs, const float* up, int64_t us, float* yp,
                                      int64_t rows, int64_t n) {
  // Split from 5 rows on: a row (I = 1536) is ~1 us of exp, more than a wake-up. 2-core Xeon, 2 threads: 8 rows
  // 10.4 -> 8.2 us, 16 rows 16.2 -> 12.8, 1-4 rows unchanged (docs/results/xeon-2026-11-27-s15/ab-outputs.md).
  for_items(rows, 4, [&](int64_t r) { silu_mul_row(gp + r * gs, up + r * us, yp + r * n, n); });
}

namespace {

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "rotary: float32 tensors only");
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "rotary: x must be [B, T, heads, D] with D even, got ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), Hn = x.size(2), D = x.size(3);
  const std::vector<int64_t> table{B, T, 1, D};
  TORCH_CHECK(cos.dim() == 4 && sin.dim() == 4 && cos.sizes() == at::IntArrayRef(table) &&
                  sin.sizes() == at::IntArrayRef(table),
              "rotary: cos and sin must be expanded to [B, T, 1, D] = ", at::IntArrayRef(table), ", got ", cos.sizes(),
              " and ", sin.sizes());
  // one head's values contiguous, heads at a stride of D (the layout rotary_rows reads)
  auto xc = x.stride(3) == 1 && x.stride(2) == D ? x : x.contiguous();
  auto cc = cos.stride(3) == 1 ? cos : cos.contiguous();
  auto sc = sin.stride(3) == 1 ? sin : sin.contiguous();
  auto y = at::empty({B, T, Hn, D}, x.options());
  eaglespec_kernels::rotary_rows(xc.data_ptr<float>(), xc.stride(0), xc.stride(1), B, T, Hn, D, cc.data_ptr<float>(),
                                 cc.stride(0), cc.stride(1), sc.data_ptr<float>(), sc.stride(0), sc.stride(1),
                                 y.data_ptr<float>());
  return y;
}

at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.scalar_type() == at::kFloat && up.scalar_type() == at::kFloat, "silu_mul: float32 tensors only");
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.dim() >= 1, "silu_mul: gate and up must have one shape, got ",
              gate.sizes(), " and ", up.sizes());
  const int64_t n = gate.size(-1);
  auto g2 = gate.reshape({-1, n});  // a view for the halves of one projection (rows strided)
  auto u2 = up.reshape({-1, n});
  if (g2.stride(1) != 1) g2 = g2.contiguous();
  if (u2.stride(1) != 1) u2 = u2.contiguous();
  auto y = at::empty(gate.sizes(), gate.options());
  eaglespec_kernels::silu_mul_rows(g2.data_ptr<float>(), g2.stride(0), u2.data_ptr<float>(), u2.stride(0),
                                   y.data_ptr<float>(), g2.size(0), n);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eaglespec, m) {
  m.def("rotary(Tensor x, Tensor cos, Tensor sin_signed) -> Tensor");
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
}
TORCH_LIBRARY_IMPL(eaglespec, CPU, m) {
  m.impl("rotary", &rotary);
  m.impl("silu_mul", &silu_mul);
}
