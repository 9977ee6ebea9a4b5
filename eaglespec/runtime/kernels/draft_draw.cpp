// The draft head's sampled children in one call: per node, q = softmax(logits / t) over the draft vocabulary,
// one inverse-CDF draw from it (``sample_row``, row_draw.h), its log-probability, and q written out in the
// target's vocabulary for verification (``spec/proposer.EagleProposer.children``, chains and single-child levels).
//
// Why by hand: in torch this is ~12 operations a level (scale, log_softmax, exp, cumsum, searchsorted, clamp,
// where, argmax, gather, a zeroed target-vocabulary row and an index_copy into it): with the head's logits,
// 179-180 us a node of 8192 at batch 1 on a 2-core EPYC, 87-91 here, where the greedy child (an argmax) takes 72
// (docs/results/epyc-2026-11-28-s21/draft_draw_micro.txt): part of what made a sampled chain step cost more than
// a greedy one. Here each node's row is read once to
// scale and find its maximum, once for the sum of exponentials, once to write q; the draw reads q.
//
// The rule, as the torch code it replaces: with t = the row's temperature where > 0, else 1,
// logq = log_softmax(logits / t) (x - max - log(sum(exp(x - max)))), q = exp(logq); the child is the draw from q
// at the node's uniform u where t > 0, the first largest logq where t <= 0 (a greedy row of a mixed batch).
// The draw is ``sample_row``'s: q's values summed in 16-value blocks (the law drawn is q up to float32 rounding
// of those sums, as the cumulative sums torch drew with); exp is SLEEF's (the one libtorch uses, 1 ulp).
//
// Shapes: logits float32 [B, K, V'] (V' the draft vocabulary); temperature float32 [B]; u float32 [B, K];
// d2t int64 [V'] (the target id of each draft id, each in [0, vocab)). Returns the children's target ids int64
// [B, K], their log q float32 [B, K] and q float32 [B, K, vocab] (zero outside the draft vocabulary).
#include <immintrin.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sleef.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <tuple>

#include "row_draw.h"

namespace {

using eaglespec_kernels::sample_row;

// One node: x [v] logits -> logq, q [v] (scratch), the chosen draft id and its log q.
std::pair<int64_t, float> draw_node(const float* x, int64_t v, float t, float u, bool sample, float* logq, float* q,
                                    float* blocks) {
  const __m512 tv = _mm512_set1_ps(t);
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < v; j += 16) {
    const int64_t m = std::min<int64_t>(16, v - j);
    const __mmask16 on = m == 16 ? 0xFFFF : static_cast<__mmask16>((1u << m) - 1);
    const __m512 s = _mm512_div_ps(_mm512_maskz_loadu_ps(on, x + j), tv);
    _mm512_mask_storeu_ps(logq + j, on, s);
    mx = _mm512_mask_max_ps(mx, on, mx, s);
  }
  const float top = _mm512_reduce_max_ps(mx);
  const __m512 topv = _mm512_set1_ps(top);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < v; j += 16) {
    const int64_t m = std::min<int64_t>(16, v - j);
    const __mmask16 on = m == 16 ? 0xFFFF : static_cast<__mmask16>((1u << m) - 1);
    const __m512 e = Sleef_expf16_u10(_mm512_sub_ps(_mm512_maskz_loadu_ps(on, logq + j), topv));
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(on, e));
  }
  const __m512 lz = _mm512_set1_ps(std::log(_mm512_reduce_add_ps(sum)));
  int64_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < v; j += 16) {
    const int64_t m = std::min<int64_t>(16, v - j);
    const __mmask16 on = m == 16 ? 0xFFFF : static_cast<__mmask16>((1u << m) - 1);
    const __m512 l = _mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(on, logq + j), topv), lz);
    _mm512_mask_storeu_ps(logq + j, on, l);
    _mm512_mask_storeu_ps(q + j, on, Sleef_expf16_u10(l));
    if (!sample) {  // the first largest: a block's maximum beats the best so far only if strictly larger
      const float bm = _mm512_mask_reduce_max_ps(on, l);
      if (bm > best_v) {
        best_v = bm;
        for (int64_t i = j; i < j + m; ++i)
          if (logq[i] == bm) {
            best = i;
            break;
          }
      }
    }
  }
  const int64_t id = sample ? sample_row(q, v, u, blocks) : best;
  return {id, logq[id]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> draft_draw(const at::Tensor& logits, const at::Tensor& temperature,
                                                          const at::Tensor& u, const at::Tensor& d2t, int64_t vocab) {
  TORCH_CHECK(logits.dim() == 3 && logits.scalar_type() == at::kFloat, "draft_draw: logits must be float32 "
              "[B, K, V'], got ", logits.scalar_type(), " ", logits.sizes());
  const int64_t b = logits.size(0), k = logits.size(1), v = logits.size(2);
  TORCH_CHECK(v >= 1 && vocab >= v, "draft_draw: needs 1 <= V' <= vocab, got V' = ", v, ", vocab = ", vocab);
  TORCH_CHECK(temperature.scalar_type() == at::kFloat && temperature.dim() == 1 && temperature.size(0) == b,
              "draft_draw: temperature must be float32 [B], got ", temperature.sizes());
  TORCH_CHECK(u.scalar_type() == at::kFloat && u.dim() == 2 && u.size(0) == b && u.size(1) == k,
              "draft_draw: u must be float32 [B, K], got ", u.sizes());
  TORCH_CHECK(d2t.scalar_type() == at::kLong && d2t.dim() == 1 && d2t.size(0) == v,
              "draft_draw: d2t must be int64 [V'] = [", v, "], got ", d2t.sizes());
  auto lc = logits.contiguous();
  auto tc = temperature.contiguous();
  auto uc = u.contiguous();
  auto dc = d2t.contiguous();
  const int64_t* dp = dc.data_ptr<int64_t>();  // a host loop, not two tensor reductions a call
  for (int64_t j = 0; j < v; ++j)
    TORCH_CHECK(dp[j] >= 0 && dp[j] < vocab, "draft_draw: a d2t entry is outside [0, ", vocab, "): ", dp[j]);
  auto ids = at::empty({b, k}, dc.options());
  auto lq = at::empty({b, k}, lc.options());
  auto q = at::empty({b, k, vocab}, lc.options());
  const float* lp = lc.data_ptr<float>();
  const float* tp = tc.data_ptr<float>();
  const float* up = uc.data_ptr<float>();
  int64_t* ip = ids.data_ptr<int64_t>();
  float* lqp = lq.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  // a node costs ~10 us at V' = 8192 plus its target-vocabulary row: threads from 4 nodes on
  at::parallel_for(0, b * k, 4, [&](int64_t r0, int64_t r1) {
    std::unique_ptr<float[]> logq(new float[v]), qd(new float[v]), blocks(new float[(v + 15) / 16]);
    for (int64_t r = r0; r < r1; ++r) {
      const float t = tp[r / k];
      const auto [id, l] = draw_node(lp + r * v, v, t > 0.0f ? t : 1.0f, up[r], t > 0.0f, logq.get(), qd.get(),
                                     blocks.get());
      ip[r] = dp[id];
      lqp[r] = l;
      float* row = qp + r * vocab;
      std::memset(row, 0, sizeof(float) * vocab);
      for (int64_t j = 0; j < v; ++j) row[dp[j]] = qd[j];
    }
  });
  return {ids, lq, q};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eaglespec, m) {
  m.def("draft_draw(Tensor logits, Tensor temperature, Tensor u, Tensor d2t, int vocab) -> (Tensor, Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(eaglespec, CPU, m) { m.impl("draft_draw", &draft_draw); }
