// int4 weights x int8 activations on AVX-512 VNNI: the matmul of a packed decoder step.
//
// Why by hand: torch 2.13's CPU int4 kernel (_weight_int4pack_mm_for_cpu) takes bfloat16 activations and
// converts every weight nibble to a float per row, so its time grows with the rows of a forward (about 1.3x
// at 4 rows and 2.2x at 8 on an AVX-512 EPYC); a step that verifies a tree pays for each token. Quantizing
// the activations to int8 (one scale per 32 values, as llama.cpp's Q8 blocks do) lets VPDPBUSD multiply 64
// weight/activation pairs an instruction, so the weights are unpacked once per tile and the rows cost
// little more than the memory read.
//
// Batch invariance: every row is quantized on its own and its integer dot products are exact, and the float
// accumulation over groups runs in the same order whatever the number of rows, so a token verified among N
// rows gets bit-identical outputs to the same token decoded alone (speculation stays lossless).
//
// Layout (built by eaglespec/runtime/w4a8.py): output channels in tiles of 16, input in groups of 32.
//   wq     uint8 [N/16, K/32, 4, 64]: chunk c holds inputs 8c..8c+7 of the group; byte 4*j + t carries output
//          16*tile + j's input 8c+t in its low nibble and input 8c+4+t in its high nibble.
//   scale  float16 [N/16, K/32, 16], zero float16 [N/16, K/32, 16]: w = scale * q + zero, q in 0..15 (GGUF's
//          Q4_0 / Q4_1 blocks carry their scales in float16, so they are held exactly).
#include <immintrin.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>
#include <vector>

#include "layer_parts.h"

namespace {

constexpr int kGroup = 32;
constexpr int kTile = 16;
// Groups ahead of the one being multiplied whose weights, scales and zeros are prefetched into L1. Measured on
// a 2-core Xeon (Emerald Rapids), the model's 121 linears, medians of 30 alternating rounds: 1 row 2.99 -> 2.53
// ms, 2 rows 3.04 -> 2.61, 4 rows 3.77 -> 3.38, 8 rows 6.26 -> 5.80, the same from 8 to 32 groups ahead; outputs
// identical (docs/RUNTIME.md). Presumably the hardware prefetcher, which stops at 4 KB pages, falls behind
// while the rows' VPDPBUSD work runs (not measured directly). Prefetches never fault, so running past a
// weight's end is harmless.
constexpr int64_t kPrefetchGroups = 16;

// One row of x: int8 blocks of 32 with scale d and d * sum(q) (the zero point's term).
void quantize_row(const float* x, int64_t k, int8_t* q, float* d, float* s) {
  for (int64_t g = 0; g < k / kGroup; ++g) {
    const float* xg = x + g * kGroup;
    __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    float dg = amax / 127.0f;
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv)));  // round to nearest even
    __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * kGroup), _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * kGroup + 16), _mm512_cvtsepi32_epi8(qb));
    d[g] = dg;
    s[g] = dg * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb)));
  }
}

// Rows [0, MR) of one tile of 16 outputs: y[r, 16 tile + j] for j < 16, plus res[r, 16 tile + j] where res is
// given (one float32 add of the finished sum, as `res + y` computes it).
template <int MR>
void tile_rows(const uint8_t* wq, const uint16_t* scale, const uint16_t* zero, int64_t groups, const int8_t* xq,
               const float* xd, const float* xs, int64_t k, float* y, int64_t n, const float* res) {
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  __m512 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t ahead = g + kPrefetchGroups;
    for (int c = 0; c < 4; ++c) _mm_prefetch(reinterpret_cast<const char*>(wq + ahead * 256 + c * 64), _MM_HINT_T0);
    if ((ahead & 1) == 0) {  // 32 bytes of scales (and of zeros) a group: one cache line per two groups
      _mm_prefetch(reinterpret_cast<const char*>(scale + ahead * kTile), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(zero + ahead * kTile), _MM_HINT_T0);
    }
    __m512i w[8];
    for (int c = 0; c < 4; ++c) {
      __m512i v = _mm512_loadu_si512(wq + (g * 4 + c) * 64);
      w[2 * c] = _mm512_and_si512(v, lo4);
      w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
    }
    const __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale + g * kTile)));
    const __m512 ze = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(zero + g * kTile)));
    // The integer sums of every row first, rows interleaved and two chains a row (even and odd chunks), so that
    // VPDPBUSD's latency overlaps across independent chains instead of serializing 8 a row; integer sums are
    // exact, so the split changes no result. 2-core Xeon, the model's 121 linears, medians of 18 alternating
    // rounds: 8 rows 5.67 -> 4.89 ms, 4 rows 3.14 -> 2.87, 1-2 rows unchanged
    // (docs/results/xeon-2026-11-27-s15/ab-outputs.md).
    __m512i s0[MR], s1[MR];
    for (int r = 0; r < MR; ++r) s0[r] = s1[r] = _mm512_setzero_si512();
    for (int c = 0; c < 8; c += 2) {
      for (int r = 0; r < MR; ++r) {
        const int32_t* x4 = reinterpret_cast<const int32_t*>(xq + r * k + g * kGroup);
        s0[r] = _mm512_dpbusd_epi32(s0[r], w[c], _mm512_set1_epi32(x4[c]));
        s1[r] = _mm512_dpbusd_epi32(s1[r], w[c + 1], _mm512_set1_epi32(x4[c + 1]));
      }
    }
    for (int r = 0; r < MR; ++r) {
      const __m512i isum = _mm512_add_epi32(s0[r], s1[r]);
      const __m512 f = _mm512_mul_ps(sc, _mm512_set1_ps(xd[r * groups + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), f, acc[r]);
      acc[r] = _mm512_fmadd_ps(ze, _mm512_set1_ps(xs[r * groups + g]), acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r)
    _mm512_storeu_ps(y + r * n, res != nullptr ? _mm512_add_ps(_mm512_loadu_ps(res + r * n), acc[r]) : acc[r]);
}

using TileFn = void (*)(const uint8_t*, const uint16_t*, const uint16_t*, int64_t, const int8_t*, const float*,
                        const float*, int64_t, float*, int64_t, const float*);
// Rows multiplied per pass over a tile's unpacked weights: a tree of 8 tokens (or a prompt, 8 rows at a time) in
// one pass. 2-core Xeon, with the prefetch: 7 rows 5.11 -> 4.85 ms, 8 rows 5.61 -> 5.39 against 6 a pass
// (121 linears, medians of 30 alternating rounds); 1-6 rows run the same code either way.
constexpr int kMaxRows = 8;
constexpr TileFn kTileFns[9] = {nullptr, tile_rows<1>, tile_rows<2>, tile_rows<3>, tile_rows<4>,
                                           tile_rows<5>, tile_rows<6>, tile_rows<7>, tile_rows<8>};

}  // namespace

int64_t eaglespec_kernels::w4a8_rows(const float* xp, int64_t m, int64_t k, const at::Tensor& wq,
                                     const at::Tensor& scale, const at::Tensor& zero, float* yp, const float* rp) {
  TORCH_CHECK(wq.dim() == 4 && wq.scalar_type() == at::kByte && wq.size(2) == 4 && wq.size(3) == 64,
              "w4a8_mm: wq must be uint8 [N/16, K/32, 4, 64]");
  const int64_t tiles = wq.size(0), groups = wq.size(1), n = tiles * kTile;
  TORCH_CHECK(k == groups * kGroup, "w4a8_mm: x has ", k, " columns, the weight ", groups * kGroup);
  TORCH_CHECK(scale.scalar_type() == at::kHalf && zero.scalar_type() == at::kHalf &&
              scale.numel() == tiles * groups * kTile && zero.numel() == scale.numel() &&
              scale.is_contiguous() && zero.is_contiguous() && wq.is_contiguous(),
              "w4a8_mm: scale and zero must be contiguous float16 [N/16, K/32, 16]");
  if (m == 0) return n;
  // The quantized rows: int8 [M, K], then scales d [M, K/32] and d * sum(q) [M, K/32], in one buffer.
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(m * (k / 4 + 2 * groups)));
  int8_t* qp = reinterpret_cast<int8_t*>(buf.data());
  float* dp = buf.data() + m * k / 4;
  float* sp = dp + m * groups;
  for (int64_t r = 0; r < m; ++r) quantize_row(xp + r * k, k, qp + r * k, dp + r * groups, sp + r * groups);
  const uint8_t* wp = wq.data_ptr<uint8_t>();
  const uint16_t* scp = reinterpret_cast<const uint16_t*>(scale.data_ptr<at::Half>());
  const uint16_t* zp = reinterpret_cast<const uint16_t*>(zero.data_ptr<at::Half>());
  at::parallel_for(0, tiles, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m - r0));
        kTileFns[rows](wp + t * groups * 256, scp + t * groups * kTile, zp + t * groups * kTile, groups,
                       qp + r0 * k, dp + r0 * groups, sp + r0 * groups, k, yp + r0 * n + t * kTile, n,
                       rp != nullptr ? rp + r0 * n + t * kTile : nullptr);
      }
    }
  });
  return n;
}

namespace {

// x float32 [M, K]; returns float32 [M, N]: x times the weight, plus `residual` [M, N] where given.
at::Tensor w4a8_matmul(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& scale, const at::Tensor& zero,
                       const at::Tensor* residual) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "w4a8_mm: x must be float32 [M, K]");
  TORCH_CHECK(wq.dim() == 4, "w4a8_mm: wq must be uint8 [N/16, K/32, 4, 64]");
  const int64_t m = x.size(0), n = wq.size(0) * kTile;
  at::Tensor rc;
  if (residual != nullptr) {
    TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->dim() == 2 && residual->size(0) == m &&
                residual->size(1) == n, "w4a8_mm_add: residual must be float32 [M, N] = [", m, ", ", n, "]");
    rc = residual->contiguous();
  }
  auto xc = x.contiguous();
  auto y = at::empty({m, n}, x.options());
  eaglespec_kernels::w4a8_rows(xc.data_ptr<float>(), m, x.size(1), wq, scale, zero, y.data_ptr<float>(),
                               residual != nullptr ? rc.data_ptr<float>() : nullptr);
  return y;
}

at::Tensor w4a8_mm(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& scale, const at::Tensor& zero) {
  return w4a8_matmul(x, wq, scale, zero, nullptr);
}

// residual + x times the weight, the add done as each tile is stored: the one-call decoder layer's two residual
// adds, each a separate operator before (~1.4 us a call at 1 token, ~2.8 at 8: 0.08 / 0.17 ms of a 30-layer
// forward, 2-core EPYC); bit-identical to `residual + w4a8_mm(...)`.
at::Tensor w4a8_mm_add(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& scale, const at::Tensor& zero,
                       const at::Tensor& residual) {
  return w4a8_matmul(x, wq, scale, zero, &residual);
}

}  // namespace

TORCH_LIBRARY(eaglespec, m) {
  m.def("w4a8_mm(Tensor x, Tensor wq, Tensor scale, Tensor zero) -> Tensor");
  m.def("w4a8_mm_add(Tensor x, Tensor wq, Tensor scale, Tensor zero, Tensor residual) -> Tensor");
}
TORCH_LIBRARY_IMPL(eaglespec, CPU, m) {
  m.impl("w4a8_mm", &w4a8_mm);
  m.impl("w4a8_mm_add", &w4a8_mm_add);
}
