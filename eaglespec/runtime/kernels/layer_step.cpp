// One decoder layer of a decode or verification forward in one call: the same kernels, in the same order, as
// the Python layer (runtime/model.py ``decoder_layer`` over a packed ``DecoderLayer``), without the Python.
//
// Why by hand: an eager decode step of the default model ran ~25 torch calls and ~20 Python frames per layer
// around its kernels, ~2.5 of ~8.3 ms a 1-token forward on a 2-core Xeon; a call from C++ costs a fraction of
// one from Python. Every step below is the computation of the operator the Python layer calls (our kernels as
// plain functions over raw rows, layer_parts.h; the same float32 adds; the cache writes), so the result is
// bit-identical to it (tested). Since session 28 no tensor view or intermediate tensor is made: the views and
// reshapes through the dispatcher cost ~9.5 us a layer (~0.3 ms of a 5 ms decode forward, 2-core EPYC), and the
// intermediate rows live in the calling thread's buffers. The layer's shapes and options outside this path (qk
// norms, other kernels, prompts) stay in Python.
//
// Inputs: x float32 [B, T, H] (the residual stream); attn_input: what the q/k/v projection reads, when it is
// not rms_norm(x, attn_norm) (a draft head's first layer, spec/heads.py); the four projections as w4a8 triples (wq, scale, offset; runtime/w4a8.py) with
// optional biases; the norms' weights [H]; cos, sin_signed [B, T, 1, D] (model.Rotary); the layer's cache
// tensors k, v [max_batch, Hkv, max_len, D]; rows int64 [B] and write_slots int64 [B, T] (where the new keys
// and values go); row_first: rows as a slice start when they are contiguous (-1: gather); n_slots: attention
// runs over slots [0, n_slots); mask bool [B|1, 1, T, n_slots] or absent (model.plan_attention).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <c10/util/Optional.h>
#include <cstdint>
#include <cstring>
#include <immintrin.h>
#include <vector>

#include "layer_parts.h"

namespace {

using at::Tensor;
namespace ek = eaglespec_kernels;

// A w4a8 triple (wq, scale, offset; runtime/w4a8.py) and its optional bias.
struct Projection {
  const std::vector<Tensor>& w;
  const c10::optional<Tensor>& bias;
};

// n, the output width of a projection, from its packed weight's tiles of 16 (checked before any buffer is sized
// from it).
int64_t width(const Projection& p) {
  TORCH_CHECK(p.w.size() == 3 && p.w[0].dim() == 4, "layer_step: a projection is a w4a8 triple (wq, scale, offset)");
  return p.w[0].size(0) * 16;
}

// y [m, n] = x [m, k] W (+ bias), then + res [m, n] where res is given: with a bias, in the Python layer's order
// res + (x W + bias), each a float32 add; without, the residual is added inside the matmul as each tile is stored
// (w4a8_mm_add: the same add). Returns n.
int64_t project(const float* x, int64_t m, int64_t k, const Projection& p, float* y, const float* res) {
  width(p);
  if (!p.bias.has_value()) return ek::w4a8_rows(x, m, k, p.w[0], p.w[1], p.w[2], y, res);
  const int64_t n = ek::w4a8_rows(x, m, k, p.w[0], p.w[1], p.w[2], y, nullptr);
  const Tensor& b = *p.bias;
  TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == n && b.is_contiguous(),
              "layer_step: a bias must be contiguous float32 [", n, "]");
  const float* bp = b.data_ptr<float>();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const float v = y[r * n + j] + bp[j];
      y[r * n + j] = res != nullptr ? res[r * n + j] + v : v;
    }
  return n;
}

// The new keys or values of rows [B] x positions [T] (head h of position (b, t) at src + b * s_b + t * s_t + h * d)
// into the cache tensor dst [max_batch, Hkv, max_len, D] (float32, or float16 rounded to nearest even as torch's
// copy rounds) at (rows[b], slots[b, t]).
void write_new(Tensor& dst, const float* src, int64_t s_b, int64_t s_t, int64_t b, int64_t t, int64_t hkv,
               const int64_t* rows, const int64_t* slots) {
  const int64_t d = dst.size(3);
  const bool half = dst.scalar_type() == at::kHalf;
  TORCH_CHECK(dst.dim() == 4 && dst.stride(3) == 1 && dst.size(1) == hkv && d % 16 == 0 &&
              (half || dst.scalar_type() == at::kFloat), "layer_step: cache layer does not match the new keys/values");
  char* dp = static_cast<char*>(dst.data_ptr());
  const int64_t el = dst.element_size();
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t r = rows[bi];
    TORCH_CHECK(r >= 0 && r < dst.size(0), "layer_step: cache row ", r, " out of range");
    for (int64_t ti = 0; ti < t; ++ti) {
      const int64_t s = slots[bi * t + ti];
      TORCH_CHECK(s >= 0 && s < dst.size(2), "layer_step: cache slot ", s, " out of range");
      for (int64_t h = 0; h < hkv; ++h) {
        const float* from = src + bi * s_b + ti * s_t + h * d;
        char* to = dp + (r * dst.stride(0) + h * dst.stride(1) + s * dst.stride(2)) * el;
        if (!half) {
          std::memcpy(to, from, d * sizeof(float));
          continue;
        }
        for (int64_t c = 0; c < d; c += 16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(to) + c / 16,
                              _mm512_cvtps_ph(_mm512_loadu_ps(from + c), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
    }
  }
}

// The layer's intermediate rows, kept by the (calling) thread between steps: sized for the largest step so far.
struct Buffers {
  std::vector<float> normed, qkv, qk, att, h, gu, act;
  static float* at_least(std::vector<float>& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(n);
    return v.data();
  }
};

Tensor layer_step(const Tensor& x_in, const c10::optional<Tensor>& attn_input, const Tensor& attn_norm,
                  const Tensor& mlp_norm, std::vector<Tensor> wqkv,
                  c10::optional<Tensor> bqkv, std::vector<Tensor> wo, c10::optional<Tensor> bo,
                  std::vector<Tensor> w13, c10::optional<Tensor> b13, std::vector<Tensor> w2,
                  c10::optional<Tensor> b2, const Tensor& cos, const Tensor& sin, Tensor k_cache, Tensor v_cache,
                  const Tensor& rows, const Tensor& write_slots, int64_t row_first, int64_t n_slots,
                  const c10::optional<Tensor>& mask, int64_t n_heads, int64_t n_kv_heads, double eps_d) {
  TORCH_CHECK(x_in.dim() == 3 && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(),
              "layer_step: x must be float32 [B, T, H] on the CPU");
  const int64_t b = x_in.size(0), t = x_in.size(1), hid = x_in.size(2), m = b * t, d = k_cache.size(3);
  const float eps = static_cast<float>(eps_d);
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.numel() == b && write_slots.scalar_type() == at::kLong &&
              write_slots.numel() == b * t, "layer_step: rows [B] and write_slots [B, T] must be int64");
  TORCH_CHECK(n_slots >= 1 && n_slots <= k_cache.size(2), "layer_step: n_slots out of range");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() &&
              v_cache.scalar_type() == k_cache.scalar_type(), "layer_step: k and v caches must match");
  TORCH_CHECK(attn_norm.scalar_type() == at::kFloat && attn_norm.is_contiguous() && attn_norm.numel() == hid &&
              mlp_norm.scalar_type() == at::kFloat && mlp_norm.is_contiguous() && mlp_norm.numel() == hid,
              "layer_step: the norms' weights must be contiguous float32 [", hid, "]");
  const int64_t qkv_heads = n_heads + 2 * n_kv_heads, qk_heads = n_heads + n_kv_heads;
  TORCH_CHECK(cos.dim() == 4 && sin.dim() == 4 && cos.size(0) == b && cos.size(1) == t && cos.size(2) == 1 &&
              cos.size(3) == d &&
              sin.sizes() == cos.sizes() && cos.stride(3) == 1 && sin.stride(3) == 1 &&
              cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "layer_step: cos and sin must be float32 [B, T, 1, D] with a contiguous last dimension");
  const Tensor x = x_in.contiguous();
  const Tensor rows_c = rows.contiguous(), slots_c = write_slots.contiguous();
  const int64_t* rp = rows_c.data_ptr<int64_t>();
  const int64_t* sp = slots_c.data_ptr<int64_t>();
  thread_local Buffers buf;
  // attention: project, rotate q and k, store k and v, attend over the cache
  const float* a;
  int64_t a_width = hid;
  Tensor ai;
  if (attn_input.has_value()) {  // what the q/k/v projection reads instead of rms_norm(x)
    TORCH_CHECK(attn_input->scalar_type() == at::kFloat && attn_input->dim() == 3 && attn_input->size(0) == b &&
                attn_input->size(1) == t, "layer_step: attn_input must be float32 [B, T, K]");
    ai = attn_input->contiguous();
    a = ai.data_ptr<float>();
    a_width = ai.size(2);
  } else {
    float* normed = Buffers::at_least(buf.normed, m * hid);
    ek::rms_norm_rows(x.data_ptr<float>(), attn_norm.data_ptr<float>(), normed, m, hid, eps);
    a = normed;
  }
  const Projection p_qkv{wqkv, bqkv}, p_o{wo, bo}, p_13{w13, b13}, p_2{w2, b2};
  const int64_t n_qkv = width(p_qkv), inter = width(p_13) / 2;
  TORCH_CHECK(n_qkv == qkv_heads * d, "layer_step: the q/k/v projection gives ", n_qkv, " values, the heads need ",
              qkv_heads * d);
  TORCH_CHECK(width(p_o) == hid && width(p_2) == hid, "layer_step: the output and down projections must give ", hid,
              " values");
  float* qkv = Buffers::at_least(buf.qkv, m * n_qkv);
  project(a, m, a_width, p_qkv, qkv, nullptr);
  float* qk = Buffers::at_least(buf.qk, m * qk_heads * d);  // [B, T, Hq + Hkv, D], rotated
  ek::rotary_rows(qkv, t * n_qkv, n_qkv, b, t, qk_heads, d, cos.data_ptr<float>(), cos.stride(0), cos.stride(1),
                  sin.data_ptr<float>(), sin.stride(0), sin.stride(1), qk);
  write_new(k_cache, qk + n_heads * d, t * qk_heads * d, qk_heads * d, b, t, n_kv_heads, rp, sp);
  write_new(v_cache, qkv + qk_heads * d, t * n_qkv, n_qkv, b, t, n_kv_heads, rp, sp);
  ek::Attend at{};
  at.q = qk, at.q0 = t * qk_heads * d, at.q1 = d, at.q2 = qk_heads * d;  // [B, Hq, T, D] over [B, T, Hq + Hkv, D]
  at.k = k_cache.data_ptr(), at.v = v_cache.data_ptr(), at.half = k_cache.scalar_type() == at::kHalf;
  at.k0 = k_cache.stride(0), at.k1 = k_cache.stride(1), at.k2 = k_cache.stride(2);
  at.v0 = v_cache.stride(0), at.v1 = v_cache.stride(1), at.v2 = v_cache.stride(2);
  std::vector<int64_t> gathered;
  if (row_first >= 0) {
    TORCH_CHECK(row_first + b <= k_cache.size(0), "layer_step: cache rows out of range");
    gathered.resize(b);
    for (int64_t i = 0; i < b; ++i) gathered[i] = row_first + i;
  } else {
    gathered.assign(rp, rp + b);  // checked by write_new
  }
  at.rows = gathered.data();
  Tensor mc;
  if (mask.has_value()) {
    mc = mask->contiguous();
    TORCH_CHECK(mc.scalar_type() == at::kBool && mc.dim() == 4 && (mc.size(0) == 1 || mc.size(0) == b) &&
                mc.size(1) == 1 && mc.size(2) == t && mc.size(3) == n_slots,
                "layer_step: mask must be bool [B|1, 1, T, n_slots]");
    at.mask = mc.data_ptr<bool>(), at.m_b = mc.size(0) == 1 ? 0 : t * n_slots, at.m_t = n_slots;
  }
  float* att = Buffers::at_least(buf.att, m * n_heads * d);  // [B, T, Hq, D]
  at.out = att;
  at.b = b, at.h = n_heads, at.t = t, at.d = d, at.hkv = n_kv_heads, at.s = n_slots;
  ek::row_attention_rows(at);
  float* h = Buffers::at_least(buf.h, m * hid);
  project(att, m, n_heads * d, p_o, h, x.data_ptr<float>());
  // feed-forward
  float* normed = Buffers::at_least(buf.normed, m * hid);
  ek::rms_norm_rows(h, mlp_norm.data_ptr<float>(), normed, m, hid, eps);
  float* gu = Buffers::at_least(buf.gu, m * 2 * inter);
  project(normed, m, hid, p_13, gu, nullptr);
  float* act = Buffers::at_least(buf.act, m * inter);
  ek::silu_mul_rows(gu, 2 * inter, gu + inter, 2 * inter, act, m, inter);
  Tensor out = at::empty({b, t, hid}, x.options());
  project(act, m, inter, p_2, out.data_ptr<float>(), h);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eaglespec, m) {
  m.def("layer_step(Tensor x, Tensor? attn_input, Tensor attn_norm, Tensor mlp_norm, Tensor[] wqkv, Tensor? bqkv, Tensor[] wo, "
        "Tensor? bo, Tensor[] w13, Tensor? b13, Tensor[] w2, Tensor? b2, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor rows, Tensor write_slots, int row_first, int n_slots, Tensor? mask, int n_heads, "
        "int n_kv_heads, float eps) -> Tensor");
}
TORCH_LIBRARY_IMPL(eaglespec, CPU, m) { m.impl("layer_step", &layer_step); }
