// Selection over a row of vocabulary scores: the index of the largest (``argmax_rows``), the indices of the
// k largest (``topk_rows``) and an inverse-CDF draw from a row of probabilities (``sample_rows``), each row
// on its own.
//
// Why by hand: every decode and verification step ranks each scored position's 49152 logits twice, once for
// the candidates the float32 rescoring recomputes (``runtime/logits.py``, top 32) and once for the greedy
// token. torch 2.13's CPU ``topk`` and ``argmax`` take ~127 and ~85 us a row on a 2-core Xeon (its ``amax``
// 11 us): at 1 row that is ~2.5% of a whole decode step, at 8 verified tokens ~0.8 ms of it (the main part of
// the verify(8) / verify(1) excess this work goes after). Here:
//   * argmax: one vectorized pass keeping, per lane, the largest value and its first index (a strictly larger
//     value replaces it); the lanes then give the largest value's smallest index: the first maximum, as torch.
//   * top-k: the maximum of every 64-value block, the k-th largest of those maxima as a threshold (at least k
//     values reach it: one per block), then only the blocks whose maximum reaches it are scanned for values
//     >= threshold, and those few candidates are sorted. Two passes over the row, no sort of the vocabulary.
// NaN ranks above every number (as torch's argmax and topk rank it); a row holding one takes a scalar path.
// Outputs: the k indices by descending value, equal values by ascending index (torch.topk leaves the order of
// equal values unspecified: the same values, possibly other indices among exact ties).
//   * sampling (``spec/sampling.sample_from_probs``: every sampled step draws its token this way, and
//     speculative verification draws each bonus token so): torch needs a cumsum, two wheres and two
//     reductions over the vocabulary, ~210 us a row of 49152 on a 2-core EPYC, ~3% of a sampled decode step.
//     Here the row's sums of 16-value blocks (one vectorized pass, each block summed in one fixed lane order)
//     give the total mass and, added in block order, the block where the cumulative mass passes u * total;
//     only that block is walked value by value. The cumulative mass at value i is the sum of the blocks
//     before it plus its block's values up to i in order, a fixed order, so a draw depends on the row and u
//     alone. As torch's version: the first value with p > 0 whose cumulative mass exceeds u * total; none
//     (u rounding up to the top): the last value with p > 0; zero probabilities are never drawn.
//
//   * rescoring (``runtime/logits.rescored_logits``): a packed lm_head ranks the vocabulary and its ``top`` best
//     get float32 scores from the float32 weight rows. In torch that is a top-k, a gather of top x H weights
//     into a new tensor, a product, a sum and a scatter: ~0.07 ms at 1 row and ~0.27 ms at 8 in isolation,
//     0.22 / 0.57 ms inside a forward (the weight rows come from DRAM), 2-core EPYC (session 29). Here each
//     row's top-k and its candidates' dot products run in one pass, the weight rows read in place. A dot
//     product sums 16 lanes over the hidden size in order (one fused multiply-add chain a lane), then the lanes
//     by _mm512_reduce_add_ps: a fixed order, so a row's scores depend on nothing but the row.
//
// Shapes: x float32 [..., V] with a contiguous last dimension. argmax_rows -> int64 [...];
// topk_rows(x, k) -> int64 [..., k], 1 <= k <= V; sample_rows(probs [..., V], u [...]) -> int64 [...];
// rescore_rows_(scores [..., V], hidden [..., H], weight [V, H], top): in place, nothing returned.
#include <immintrin.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "row_draw.h"

namespace {

constexpr int64_t kBlock = 64;  // values per block of the top-k threshold (four 16-lane vectors)

// "a ranks before b": larger first, NaN first of all, equal values by smaller index.
inline bool before(float a, int64_t ia, float b, int64_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) return na && (!nb || ia < ib);
  return a > b || (a == b && ia < ib);
}

inline bool has_nan(const float* x, int64_t v) {
  __mmask16 nan = 0;
  int64_t j = 0;
  for (; j + 16 <= v; j += 16) {
    const __m512 a = _mm512_loadu_ps(x + j);
    nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
  }
  for (; j < v; ++j)
    if (std::isnan(x[j])) return true;
  return nan != 0;
}

int64_t argmax_row(const float* x, int64_t v) {
  if (has_nan(x, v)) {
    for (int64_t j = 0; j < v; ++j)
      if (std::isnan(x[j])) return j;
  }
  int64_t j = 0, best = 0;
  if (v >= 16) {
    __m512 top = _mm512_loadu_ps(x);
    __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i idx = at;
    for (j = 16; j + 16 <= v; j += 16) {
      idx = _mm512_add_epi32(idx, step);
      const __m512 a = _mm512_loadu_ps(x + j);
      const __mmask16 gt = _mm512_cmp_ps_mask(a, top, _CMP_GT_OQ);
      top = _mm512_mask_mov_ps(top, gt, a);
      at = _mm512_mask_mov_epi32(at, gt, idx);
    }
    alignas(64) float tv[16];
    alignas(64) int32_t ti[16];
    _mm512_store_ps(tv, top);
    _mm512_store_si512(ti, at);
    best = ti[0];
    for (int l = 1; l < 16; ++l)
      if (tv[l] > x[best] || (tv[l] == x[best] && ti[l] < best)) best = ti[l];
  }
  for (; j < v; ++j)  // the tail (the whole row when shorter than a vector): later indices win only if larger
    if (x[j] > x[best]) best = j;
  return best;
}

void topk_row_scalar(const float* x, int64_t v, int64_t k, int64_t* out) {
  std::vector<int64_t> ids(v);
  for (int64_t j = 0; j < v; ++j) ids[j] = j;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [x](int64_t a, int64_t b) { return before(x[a], a, x[b], b); });
  std::copy(ids.begin(), ids.begin() + k, out);
}

void topk_row(const float* x, int64_t v, int64_t k, int64_t* out) {
  const int64_t blocks = v / kBlock;  // whole blocks; the rest of the row is scanned as candidates
  if (blocks < 2 * k || has_nan(x, v)) {
    topk_row_scalar(x, v, k, out);
    return;
  }
  std::vector<float> bmax(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* p = x + b * kBlock;
    const __m512 m = _mm512_max_ps(_mm512_max_ps(_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)),
                                   _mm512_max_ps(_mm512_loadu_ps(p + 32), _mm512_loadu_ps(p + 48)));
    bmax[b] = _mm512_reduce_max_ps(m);
  }
  std::vector<float> order(bmax);
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), std::greater<float>());
  const float thr = order[k - 1];  // >= k values reach it (each of the k blocks' maxima): the top k all do
  std::vector<std::pair<float, int64_t>> cand;
  cand.reserve(4 * k);
  const __m512 t = _mm512_set1_ps(thr);
  for (int64_t b = 0; b < blocks; ++b) {
    if (bmax[b] < thr) continue;
    const float* p = x + b * kBlock;
    for (int64_t c = 0; c < kBlock; c += 16) {
      __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(p + c), t, _CMP_GE_OQ);
      while (hit) {
        const int l = __builtin_ctz(hit);
        cand.emplace_back(p[c + l], b * kBlock + c + l);
        hit &= hit - 1;
      }
    }
  }
  for (int64_t j = blocks * kBlock; j < v; ++j)
    if (x[j] >= thr) cand.emplace_back(x[j], j);
  std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [](const auto& a, const auto& b) {
    return before(a.first, a.second, b.first, b.second);
  });
  for (int64_t i = 0; i < k; ++i) out[i] = cand[i].second;
}

// hidden . w over H values (H a multiple of 16): 16 lanes, each a fused multiply-add chain in order, then summed.
inline float dot_row(const float* h, const float* w, int64_t n) {
  __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(h), _mm512_loadu_ps(w));
  for (int64_t c = 16; c < n; c += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(h + c), _mm512_loadu_ps(w + c), acc);
  return _mm512_reduce_add_ps(acc);
}

using eaglespec_kernels::for_rows;
using eaglespec_kernels::sample_row;

at::Tensor checked(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, name, ": float32 scores only, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, name, ": needs [..., V] with V > 0, got ", x.sizes());
  TORCH_CHECK(x.size(-1) <= std::numeric_limits<int32_t>::max(), name, ": V must fit in int32");
  return x.contiguous();
}

at::Tensor argmax_rows(const at::Tensor& x) {
  auto xc = checked(x, "argmax_rows");
  const int64_t v = xc.size(-1), rows = xc.numel() / v;
  auto out = at::empty(xc.sizes().slice(0, xc.dim() - 1), xc.options().dtype(at::kLong));
  const float* xp = xc.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  for_rows(rows, [&](int64_t r) { op[r] = argmax_row(xp + r * v, v); });
  return out;
}

at::Tensor topk_rows(const at::Tensor& x, int64_t k) {
  auto xc = checked(x, "topk_rows");
  const int64_t v = xc.size(-1), rows = xc.numel() / v;
  TORCH_CHECK(k >= 1 && k <= v, "topk_rows: k must be in [1, ", v, "], got ", k);
  std::vector<int64_t> shape(xc.sizes().begin(), xc.sizes().end());
  shape.back() = k;
  auto out = at::empty(shape, xc.options().dtype(at::kLong));
  const float* xp = xc.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  for_rows(rows, [&](int64_t r) { topk_row(xp + r * v, v, k, op + r * k); });
  return out;
}

at::Tensor sample_rows(const at::Tensor& probs, const at::Tensor& u) {
  auto pc = checked(probs, "sample_rows");
  TORCH_CHECK(u.scalar_type() == at::kFloat, "sample_rows: float32 uniforms only, got ", u.scalar_type());
  TORCH_CHECK(u.sizes() == pc.sizes().slice(0, pc.dim() - 1), "sample_rows: u must be shaped as probs without its "
              "last dimension: probs ", pc.sizes(), ", u ", u.sizes());
  auto uc = u.contiguous();
  const int64_t v = pc.size(-1), rows = pc.numel() / v;
  auto out = at::empty(uc.sizes(), pc.options().dtype(at::kLong));
  const float* pp = pc.data_ptr<float>();
  const float* up = uc.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  for_rows(rows, [&](int64_t r) {
    std::vector<float> blocks((v + 15) / 16);
    op[r] = sample_row(pp + r * v, v, up[r], blocks.data());
  });
  return out;
}

void rescore_rows_(at::Tensor& scores, const at::Tensor& hidden, const at::Tensor& weight, int64_t top) {
  TORCH_CHECK(scores.scalar_type() == at::kFloat && hidden.scalar_type() == at::kFloat &&
              weight.scalar_type() == at::kFloat, "rescore_rows_: scores, hidden and weight must be float32");
  TORCH_CHECK(scores.dim() >= 1 && scores.is_contiguous(), "rescore_rows_: scores must be contiguous [..., V]");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.size(0) == scores.size(-1),
              "rescore_rows_: weight must be contiguous [V, H] with V = ", scores.size(-1), ", got ", weight.sizes());
  const int64_t v = scores.size(-1), h = weight.size(1), rows = scores.numel() / std::max<int64_t>(v, 1);
  TORCH_CHECK(h % 16 == 0 && h > 0, "rescore_rows_: the hidden size must be a positive multiple of 16, got ", h);
  TORCH_CHECK(hidden.size(-1) == h && hidden.numel() == rows * h, "rescore_rows_: hidden must be [..., ", h,
              "] with one row per row of scores, got ", hidden.sizes(), " for scores ", scores.sizes());
  TORCH_CHECK(top >= 1 && top <= v, "rescore_rows_: top must be in [1, ", v, "], got ", top);
  TORCH_CHECK(v <= std::numeric_limits<int32_t>::max(), "rescore_rows_: V must fit in int32");
  auto hc = hidden.contiguous();
  float* sp = scores.data_ptr<float>();
  const float* hp = hc.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  for_rows(rows, [&](int64_t r) {
    std::vector<int64_t> cand(top);
    float* row = sp + r * v;
    topk_row(row, v, top, cand.data());
    for (int64_t i = 0; i < top; ++i) row[cand[i]] = dot_row(hp + r * h, wp + cand[i] * h, h);
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eaglespec, m) {
  m.def("argmax_rows(Tensor x) -> Tensor");
  m.def("topk_rows(Tensor x, int k) -> Tensor");
  m.def("sample_rows(Tensor probs, Tensor u) -> Tensor");
  m.def("rescore_rows_(Tensor(a!) scores, Tensor hidden, Tensor weight, int top) -> ()");
}
TORCH_LIBRARY_IMPL(eaglespec, CPU, m) {
  m.impl("argmax_rows", &argmax_rows);
  m.impl("topk_rows", &topk_rows);
  m.impl("sample_rows", &sample_rows);
  m.impl("rescore_rows_", &rescore_rows_);
}
