// Lossless speculative sampling of chains in one call: ``spec/verify._verify_chain_sampling``'s rule, row by row.
//
// Why by hand: a sampled request's chain of 1 is verified every step, and the rule in torch is ~30 small
// operations over [B, N, V] (sums, gathers, a residual over the vocabulary, a row select, the draw, the bonus
// token's probability): 288-439 us a chain of 1 at batch 1 on a 2-core EPYC, 23-44 here, where a greedy chain's
// verification takes ~60 (docs/results/epyc-2026-11-28-s21/verify_micro.txt). Each row here reads p (and q)
// at the nodes it tests, stops at its first rejection, builds its residual in one pass and draws its bonus with
// ``sample_row`` (row_draw.h, the rule every sampled plain step uses).
//
// The rule (Leviathan et al. 2023, Chen et al. 2023; with drafts drawn from q, Miao et al. 2024 (SpecInfer)):
// node i's candidate is x = tokens[i + 1]; with p and q at node i normalised by their sums,
//   ratio = p(x) / q(x) where q(x) > 0 (x was drawn from q), else p(x) (a deterministic candidate, or no q);
//   accepted iff u_accept[i + 1] < ratio. The row stops at the first rejected node e (or the leaf, N - 1).
// Bonus: at the leaf a draw from p there; after a rejection a draw from the residual, normalise(max(0, p - q))
// at e when x came from q and that residual has mass, else p at e without x. bonus_p: the drawn token's share
// of the mass it was drawn from. A one-node "chain" (N = 1, a plain sampled step) is a draw from p at the root.
//
// Sums here run in fixed orders of their own (16-lane accumulators; the draw's blocks), so a uniform within
// float32 rounding of a threshold may decide otherwise than torch's sums would; elsewhere the verdict is
// torch's (tested against ``_verify_chain_sampling`` with the kernels off, and by the distribution oracle).
//
// Shapes: tokens int64 [B, N]; p float32 [B, N, V]; q float32 [B, N, V] or absent; u_accept float32 [B, N]
// (entry 0 unused); u_sample float32 [B]. Returns path int64 [B, width] (0, 1, ..., n, then -1),
// n_accepted int64 [B], bonus int64 [B], bonus_p float32 [B].
#include <immintrin.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Optional.h>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <tuple>

#include "row_draw.h"

namespace {

using eaglespec_kernels::sample_row;

constexpr float kTiny = std::numeric_limits<float>::min();  // torch.finfo(float32).tiny, verify._TINY

// Sum of x[0..v): four 16-lane accumulators over consecutive vectors, added pairwise, then across lanes.
inline float row_sum(const float* x, int64_t v) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 64 <= v; j += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + j));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + j + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + j + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + j + 48));
  }
  for (; j < v; j += 16) {
    const int64_t m = std::min<int64_t>(16, v - j);
    const __mmask16 on = m == 16 ? 0xFFFF : static_cast<__mmask16>((1u << m) - 1);
    a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(on, x + j));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

struct RowOut {
  int64_t n, bonus;
  float bonus_p;
};

// One row: p, q ([N][V], q may be null), its tokens [N] and uniforms [N]; `res` (V floats) and `blocks` scratch.
RowOut verify_row(const float* p, const float* q, const int64_t* tok, const float* ua, float us, int64_t n_nodes,
                  int64_t v, float* res, float* blocks) {
  int64_t e = 0;
  float sp = 0.0f, sq = 0.0f;
  bool from_q = false;
  for (; e < n_nodes - 1; ++e) {
    const int64_t x = tok[e + 1];
    const float* pe = p + e * v;
    sp = std::max(row_sum(pe, v), kTiny);
    const float px = pe[x] / sp;
    float ratio = px;
    from_q = false;
    if (q != nullptr) {
      const float* qe = q + e * v;
      sq = std::max(row_sum(qe, v), kTiny);
      const float qx = qe[x] / sq;
      from_q = qx > 0.0f;
      if (from_q) ratio = px / std::max(qx, kTiny);
    }
    if (!(ua[e + 1] < ratio)) break;  // rejected: the row stops here
  }
  const float* pe = p + e * v;
  float total = 0.0f;
  if (e == n_nodes - 1) {  // the leaf (every candidate accepted, or a plain step): a draw from p there
    const int64_t b = sample_row(pe, v, us, blocks, &total);
    return {e, b, pe[b] / std::max(total, kTiny)};
  }
  const int64_t x = tok[e + 1];
  bool residual = false;
  if (from_q) {  // normalise(max(0, p - q)), if it has mass (a sum of non-negatives is > 0 iff one is)
    const float* qe = q + e * v;
    for (int64_t j = 0; j < v; ++j) {
      const float r = std::max(pe[j] / sp - qe[j] / sq, 0.0f);
      res[j] = r;
      residual |= r > 0.0f;
    }
  }
  if (!residual) {  // p without the rejected candidate
    for (int64_t j = 0; j < v; ++j) res[j] = pe[j] / sp;
    res[x] = 0.0f;
  }
  const int64_t b = sample_row(res, v, us, blocks, &total);
  return {e, b, res[b] / std::max(total, kTiny)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_chain_sampled(
    const at::Tensor& tokens, const at::Tensor& p, const c10::optional<at::Tensor>& q, const at::Tensor& u_accept,
    const at::Tensor& u_sample, int64_t width) {
  TORCH_CHECK(p.dim() == 3 && p.scalar_type() == at::kFloat, "verify_chain_sampled: p must be float32 [B, N, V], got ",
              p.scalar_type(), " ", p.sizes());
  const int64_t b = p.size(0), n = p.size(1), v = p.size(2);
  TORCH_CHECK(n >= 1 && v >= 1 && v <= std::numeric_limits<int32_t>::max(), "verify_chain_sampled: needs N >= 1 and "
              "0 < V < 2^31, got ", p.sizes());
  TORCH_CHECK(width >= n, "verify_chain_sampled: width must be >= N (", n, "), got ", width);
  TORCH_CHECK(tokens.scalar_type() == at::kLong && tokens.dim() == 2 && tokens.size(0) == b && tokens.size(1) == n,
              "verify_chain_sampled: tokens must be int64 [B, N] = [", b, ", ", n, "], got ", tokens.sizes());
  TORCH_CHECK(u_accept.scalar_type() == at::kFloat && u_accept.dim() == 2 && u_accept.size(0) == b &&
              u_accept.size(1) == n, "verify_chain_sampled: u_accept must be float32 [B, N], got ", u_accept.sizes());
  TORCH_CHECK(u_sample.scalar_type() == at::kFloat && u_sample.dim() == 1 && u_sample.size(0) == b,
              "verify_chain_sampled: u_sample must be float32 [B], got ", u_sample.sizes());
  auto pc = p.contiguous();
  auto tc = tokens.contiguous();
  at::Tensor qc;
  if (q.has_value()) {
    TORCH_CHECK(q->scalar_type() == at::kFloat && q->sizes() == p.sizes(), "verify_chain_sampled: q must be float32 "
                "shaped as p ", p.sizes(), ", got ", q->scalar_type(), " ", q->sizes());
    qc = q->contiguous();
  }
  const int64_t* tp = tc.data_ptr<int64_t>();  // a host loop, not two tensor reductions a call
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 1; i < n; ++i)
      TORCH_CHECK(tp[r * n + i] >= 0 && tp[r * n + i] < v, "verify_chain_sampled: a candidate token is outside [0, ",
                  v, "): ", tp[r * n + i]);
  auto uac = u_accept.contiguous();
  auto usc = u_sample.contiguous();
  auto path = at::empty({b, width}, tc.options());
  auto n_acc = at::empty({b}, tc.options());
  auto bonus = at::empty({b}, tc.options());
  auto bonus_p = at::empty({b}, pc.options());
  const float* pp = pc.data_ptr<float>();
  const float* qp = qc.defined() ? qc.data_ptr<float>() : nullptr;
  const float* uap = uac.data_ptr<float>();
  const float* usp = usc.data_ptr<float>();
  int64_t* pathp = path.data_ptr<int64_t>();
  int64_t* np = n_acc.data_ptr<int64_t>();
  int64_t* bp = bonus.data_ptr<int64_t>();
  float* bpp = bonus_p.data_ptr<float>();
  // A row reads p (and q) at up to N nodes and writes its residual: 30-80 us at V = 49152, more than a thread
  // pool's wake-up, so rows spread over the threads from 2 on (select.cpp's loop waits for 5).
  at::parallel_for(0, b, 1, [&](int64_t r0, int64_t r1) {
    std::unique_ptr<float[]> res(new float[v]), blocks(new float[(v + 15) / 16]);  // uninitialised: written first
    for (int64_t r = r0; r < r1; ++r) {
      const RowOut o = verify_row(pp + r * n * v, qp != nullptr ? qp + r * n * v : nullptr, tp + r * n,
                                  uap + r * n, usp[r], n, v, res.get(), blocks.get());
      np[r] = o.n, bp[r] = o.bonus, bpp[r] = o.bonus_p;
      for (int64_t i = 0; i < width; ++i) pathp[r * width + i] = i <= o.n ? i : -1;
    }
  });
  return {path, n_acc, bonus, bonus_p};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eaglespec, m) {
  m.def("verify_chain_sampled(Tensor tokens, Tensor p, Tensor? q, Tensor u_accept, Tensor u_sample, int width) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(eaglespec, CPU, m) { m.impl("verify_chain_sampled", &verify_chain_sampled); }
