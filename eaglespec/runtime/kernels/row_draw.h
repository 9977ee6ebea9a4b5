// What select.cpp's ``sample_rows`` and verify_chain.cpp's ``verify_chain_sampled`` share: the inverse-CDF
// draw from a row of probabilities (one rule, so a token drawn in a plain step and one drawn after a chain's
// verification follow the same summation order), and the loop over rows.
#pragma once

#include <immintrin.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>

namespace eaglespec_kernels {

// One inverse-CDF draw from probabilities p[0..v) (non-negative, need not sum to 1) at u in [0, 1) (select.cpp's
// header has the rule); `blocks` holds v / 16 rounded up floats of scratch. `total`, when given, receives the
// row's mass as the draw summed it (its 16-value blocks added in block order).
inline int64_t sample_row(const float* p, int64_t v, float u, float* blocks, float* total_out = nullptr) {
  const int64_t nb = (v + 15) / 16;
  float total = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t j = 16 * b, m = std::min<int64_t>(16, v - j);
    const __mmask16 on = m == 16 ? 0xFFFF : static_cast<__mmask16>((1u << m) - 1);
    blocks[b] = _mm512_reduce_add_ps(_mm512_maskz_loadu_ps(on, p + j));
    total += blocks[b];
  }
  if (total_out != nullptr) *total_out = total;
  const float target = u * total;
  float run = 0.0f;  // the mass of the blocks before b, added in block order as `total` was
  for (int64_t b = 0; b < nb; ++b) {
    if (run + blocks[b] > target) {  // the crossing is in this block, unless rounding in it says otherwise
      float s = run;
      for (int64_t j = 16 * b, end = std::min<int64_t>(v, j + 16); j < end; ++j) {
        s += p[j];
        if (p[j] > 0.0f && s > target) return j;
      }
    }
    run += blocks[b];
  }
  for (int64_t j = v - 1; j >= 0; --j)
    if (p[j] > 0.0f) return j;
  return 0;  // no positive value: invalid input, as in torch's version
}

template <typename F>
void for_rows(int64_t rows, F&& fn) {
  if (rows <= 4) {  // decode and short verification: a thread pool wake-up costs about what a row does
    for (int64_t r = 0; r < rows; ++r) fn(r);
  } else {
    at::parallel_for(0, rows, 2, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) fn(r);
    });
  }
}

}  // namespace eaglespec_kernels
