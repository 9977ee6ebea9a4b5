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

// One layer's key and value cache: [max_batch, Hkv, max_len, D] each, float32 or float16 (strides in elements).
struct Cache {
  char *k, *v;
  bool half;
  int64_t el, s0, s1, s2, rows, hkv, len, d;
};

// Layer `layer` of k and v: [max_batch, Hkv, max_len, D] (layer -1) or [L, max_batch, Hkv, max_len, D].
Cache cache_layer(const Tensor& k, const Tensor& v, int64_t layer) {
  const int64_t lead = layer < 0 ? 0 : 1;
  TORCH_CHECK(k.dim() == 4 + lead && v.sizes() == k.sizes() && v.strides() == k.strides() &&
              v.scalar_type() == k.scalar_type() && (k.scalar_type() == at::kFloat || k.scalar_type() == at::kHalf) &&
              k.stride(3 + lead) == 1 && k.size(3 + lead) % 16 == 0,
              "layer_step: the k and v caches must be float32 or float16 [", lead ? "L, " : "",
              "max_batch, Hkv, max_len, D] alike, D a multiple of 16 and contiguous");
  TORCH_CHECK(!lead || layer < k.size(0), "layer_step: no cache for layer ", layer);
  Cache c{};
  c.half = k.scalar_type() == at::kHalf;
  c.el = k.element_size();
  const int64_t off = lead ? layer * k.stride(0) * c.el : 0;
  c.k = static_cast<char*>(k.data_ptr()) + off;
  c.v = static_cast<char*>(v.data_ptr()) + off;
  c.s0 = k.stride(lead), c.s1 = k.stride(lead + 1), c.s2 = k.stride(lead + 2);
  c.rows = k.size(lead), c.hkv = k.size(lead + 1), c.len = k.size(lead + 2), c.d = k.size(lead + 3);
  return c;
}

// The new keys or values of rows [B] x positions [T] (head h of position (b, t) at src + b * s_b + t * s_t + h * d)
// into `dst` (a cache layer's k or v) at (rows[b], slots[b, t]): float32 copied, float16 rounded to nearest even
// as torch's copy rounds. Rows and slots are checked by the caller (Step).
void write_new(const Cache& c, char* dst, const float* src, int64_t s_b, int64_t s_t, int64_t b, int64_t t,
               const int64_t* rows, const int64_t* slots) {
  const int64_t d = c.d;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t h = 0; h < c.hkv; ++h) {
        const float* from = src + bi * s_b + ti * s_t + h * d;
        char* to = dst + (rows[bi] * c.s0 + h * c.s1 + slots[bi * t + ti] * c.s2) * c.el;
        if (!c.half) {
          std::memcpy(to, from, d * sizeof(float));
          continue;
        }
        for (int64_t j = 0; j < d; j += 16)
          _mm256_storeu_si256(
              reinterpret_cast<__m256i*>(to) + j / 16,
              _mm512_cvtps_ph(_mm512_loadu_ps(from + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
}

// What every layer of one forward shares: the shapes, the rotary tables, where the new keys and values go, the
// cache rows attended over and the mask.
struct Step {
  int64_t b, t, hid, n_heads, n_kv_heads, n_slots;
  float eps;
  const float *cos, *sin;
  int64_t c_b, c_t, s_b, s_t;
  const int64_t *rows, *slots, *attend_rows;
  const bool* mask;
  int64_t m_b, m_t;
};

// The layer's intermediate rows, kept by the (calling) thread between steps: sized for the largest step so far.
struct Buffers {
  std::vector<float> normed, qkv, qk, att, h, gu, act;
  static float* at_least(std::vector<float>& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(n);
    return v.data();
  }
};

struct Layer {
  const Tensor &attn_norm, &mlp_norm;
  Projection qkv, o, gate_up, down;
};

// out [B, T, H] = the layer over x [B, T, H] (rows contiguous); `a` / `a_width`: what the q/k/v projection reads
// when it is not rms_norm(x) (null: the norm).
void run_layer(const Step& st, const Layer& w, const Cache& c, const float* x, const float* a_in, int64_t a_width,
               float* out) {
  const int64_t b = st.b, t = st.t, hid = st.hid, m = b * t, d = c.d;
  const int64_t qkv_heads = st.n_heads + 2 * st.n_kv_heads, qk_heads = st.n_heads + st.n_kv_heads;
  TORCH_CHECK(w.attn_norm.scalar_type() == at::kFloat && w.attn_norm.is_contiguous() && w.attn_norm.numel() == hid &&
              w.mlp_norm.scalar_type() == at::kFloat && w.mlp_norm.is_contiguous() && w.mlp_norm.numel() == hid,
              "layer_step: the norms' weights must be contiguous float32 [", hid, "]");
  TORCH_CHECK(c.hkv == st.n_kv_heads, "layer_step: the cache holds ", c.hkv, " KV heads, the layer ", st.n_kv_heads);
  const int64_t n_qkv = width(w.qkv), inter = width(w.gate_up) / 2;
  TORCH_CHECK(n_qkv == qkv_heads * d, "layer_step: the q/k/v projection gives ", n_qkv, " values, the heads need ",
              qkv_heads * d);
  TORCH_CHECK(width(w.o) == hid && width(w.down) == hid, "layer_step: the output and down projections must give ",
              hid, " values");
  thread_local Buffers buf;
  // attention: project, rotate q and k, store k and v, attend over the cache
  if (a_in == nullptr) {
    float* normed = Buffers::at_least(buf.normed, m * hid);
    ek::rms_norm_rows(x, w.attn_norm.data_ptr<float>(), normed, m, hid, st.eps);
    a_in = normed;
  }
  float* qkv = Buffers::at_least(buf.qkv, m * n_qkv);
  project(a_in, m, a_width, w.qkv, qkv, nullptr);
  float* qk = Buffers::at_least(buf.qk, m * qk_heads * d);  // [B, T, Hq + Hkv, D], rotated
  ek::rotary_rows(qkv, t * n_qkv, n_qkv, b, t, qk_heads, d, st.cos, st.c_b, st.c_t, st.sin, st.s_b, st.s_t, qk);
  write_new(c, c.k, qk + st.n_heads * d, t * qk_heads * d, qk_heads * d, b, t, st.rows, st.slots);
  write_new(c, c.v, qkv + qk_heads * d, t * n_qkv, n_qkv, b, t, st.rows, st.slots);
  ek::Attend at{};
  at.q = qk, at.q0 = t * qk_heads * d, at.q1 = d, at.q2 = qk_heads * d;  // [B, Hq, T, D] over [B, T, Hq + Hkv, D]
  at.k = c.k, at.v = c.v, at.half = c.half;
  at.k0 = c.s0, at.k1 = c.s1, at.k2 = c.s2, at.v0 = c.s0, at.v1 = c.s1, at.v2 = c.s2;
  at.rows = st.attend_rows, at.mask = st.mask, at.m_b = st.m_b, at.m_t = st.m_t;
  float* att = Buffers::at_least(buf.att, m * st.n_heads * d);  // [B, T, Hq, D]
  at.out = att;
  at.b = b, at.h = st.n_heads, at.t = t, at.d = d, at.hkv = st.n_kv_heads, at.s = st.n_slots;
  ek::row_attention_rows(at);
  float* h = Buffers::at_least(buf.h, m * hid);
  project(att, m, st.n_heads * d, w.o, h, x);
  // feed-forward
  float* normed = Buffers::at_least(buf.normed, m * hid);
  ek::rms_norm_rows(h, w.mlp_norm.data_ptr<float>(), normed, m, hid, st.eps);
  float* gu = Buffers::at_least(buf.gu, m * 2 * inter);
  project(normed, m, hid, w.gate_up, gu, nullptr);
  float* act = Buffers::at_least(buf.act, m * inter);
  ek::silu_mul_rows(gu, 2 * inter, gu + inter, 2 * inter, act, m, inter);
  project(act, m, inter, w.down, out, h);
}

// The checks and host arrays a forward's layers share (Step), for x [B, T, H] over cache `c` (any layer's).
struct StepArgs {
  Tensor rows_c, slots_c, mask_c;
  std::vector<int64_t> attend_rows;
  Step st{};
  StepArgs(const Tensor& x, const Cache& c, const Tensor& cos, const Tensor& sin, const Tensor& rows,
           const Tensor& write_slots, int64_t row_first, int64_t n_slots, const c10::optional<Tensor>& mask,
           int64_t n_heads, int64_t n_kv_heads, double eps) {
    TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
                "layer_step: x must be float32 [B, T, H] on the CPU");
    const int64_t b = x.size(0), t = x.size(1);
    TORCH_CHECK(rows.scalar_type() == at::kLong && rows.numel() == b && write_slots.scalar_type() == at::kLong &&
                write_slots.numel() == b * t, "layer_step: rows [B] and write_slots [B, T] must be int64");
    TORCH_CHECK(n_slots >= 1 && n_slots <= c.len, "layer_step: n_slots out of range");
    TORCH_CHECK(cos.dim() == 4 && sin.dim() == 4 && cos.size(0) == b && cos.size(1) == t && cos.size(2) == 1 &&
                cos.size(3) == c.d && sin.sizes() == cos.sizes() && cos.stride(3) == 1 && sin.stride(3) == 1 &&
                cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
                "layer_step: cos and sin must be float32 [B, T, 1, D] with a contiguous last dimension");
    rows_c = rows.contiguous(), slots_c = write_slots.contiguous();
    const int64_t* rp = rows_c.data_ptr<int64_t>();
    const int64_t* sp = slots_c.data_ptr<int64_t>();
    for (int64_t bi = 0; bi < b; ++bi) {
      TORCH_CHECK(rp[bi] >= 0 && rp[bi] < c.rows, "layer_step: cache row ", rp[bi], " out of range");
      for (int64_t ti = 0; ti < t; ++ti)
        TORCH_CHECK(sp[bi * t + ti] >= 0 && sp[bi * t + ti] < c.len, "layer_step: cache slot ", sp[bi * t + ti],
                    " out of range");
    }
    if (row_first >= 0) {
      TORCH_CHECK(row_first + b <= c.rows, "layer_step: cache rows out of range");
      for (int64_t i = 0; i < b; ++i) attend_rows.push_back(row_first + i);
    } else {
      attend_rows.assign(rp, rp + b);
    }
    st.b = b, st.t = t, st.hid = x.size(2), st.n_heads = n_heads, st.n_kv_heads = n_kv_heads, st.n_slots = n_slots;
    st.eps = static_cast<float>(eps);
    st.cos = cos.data_ptr<float>(), st.sin = sin.data_ptr<float>();
    st.c_b = cos.stride(0), st.c_t = cos.stride(1), st.s_b = sin.stride(0), st.s_t = sin.stride(1);
    st.rows = rp, st.slots = sp, st.attend_rows = attend_rows.data();
    if (mask.has_value()) {
      mask_c = mask->contiguous();
      TORCH_CHECK(mask_c.scalar_type() == at::kBool && mask_c.dim() == 4 &&
                  (mask_c.size(0) == 1 || mask_c.size(0) == b) && mask_c.size(1) == 1 && mask_c.size(2) == t &&
                  mask_c.size(3) == n_slots,
                  "layer_step: mask must be bool [B|1, 1, T, n_slots]");
      st.mask = mask_c.data_ptr<bool>(), st.m_b = mask_c.size(0) == 1 ? 0 : t * n_slots, st.m_t = n_slots;
    }
  }
};

Tensor layer_step(const Tensor& x_in, const c10::optional<Tensor>& attn_input, const Tensor& attn_norm,
                  const Tensor& mlp_norm, std::vector<Tensor> wqkv,
                  c10::optional<Tensor> bqkv, std::vector<Tensor> wo, c10::optional<Tensor> bo,
                  std::vector<Tensor> w13, c10::optional<Tensor> b13, std::vector<Tensor> w2,
                  c10::optional<Tensor> b2, const Tensor& cos, const Tensor& sin, Tensor k_cache, Tensor v_cache,
                  const Tensor& rows, const Tensor& write_slots, int64_t row_first, int64_t n_slots,
                  const c10::optional<Tensor>& mask, int64_t n_heads, int64_t n_kv_heads, double eps) {
  const Cache c = cache_layer(k_cache, v_cache, -1);
  const StepArgs sa(x_in, c, cos, sin, rows, write_slots, row_first, n_slots, mask, n_heads, n_kv_heads, eps);
  const Tensor x = x_in.contiguous();
  const float* a = nullptr;
  int64_t a_width = x.size(2);
  Tensor ai;
  if (attn_input.has_value()) {  // what the q/k/v projection reads instead of rms_norm(x)
    TORCH_CHECK(attn_input->scalar_type() == at::kFloat && attn_input->dim() == 3 && attn_input->size(0) == x.size(0) &&
                attn_input->size(1) == x.size(1), "layer_step: attn_input must be float32 [B, T, K]");
    ai = attn_input->contiguous();
    a = ai.data_ptr<float>();
    a_width = ai.size(2);
  }
  Tensor out = at::empty(x.sizes(), x.options());
  run_layer(sa.st, Layer{attn_norm, mlp_norm, {wqkv, bqkv}, {wo, bo}, {w13, b13}, {w2, b2}}, c, x.data_ptr<float>(), a,
            a_width, out.data_ptr<float>());
  return out;
}

// Every layer of a model in one call (layer_step for each, in order): `weights` holds kLayerArgs tensors a
// layer (layer_steps_weights in runtime/model.py: the norms, then each projection's w4a8 triple and its bias, an
// empty tensor for none); k_cache / v_cache: [L, max_batch, Hkv, max_len, D]. Returns the last layer's output,
// then, where `keep` lists layers (0-based, repeats allowed), their outputs side by side in the order given: one
// [B, T, keep.size() * H] tensor, the features a draft head reads (torch.cat of the kept outputs took ~20 us and
// an allocation a forward, 2-core EPYC, session 30). The layers write into two buffers in turn. One call from
// Python instead of one a layer: each took ~12 us to parse its 24 arguments (~0.35 ms of a 5 ms decode forward).
constexpr int64_t kLayerArgs = 18;

std::vector<Tensor> layer_steps(const Tensor& x_in, const std::vector<Tensor>& weights, const Tensor& cos,
                                const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache, const Tensor& rows,
                                const Tensor& write_slots, int64_t row_first, int64_t n_slots,
                                const c10::optional<Tensor>& mask, int64_t n_heads, int64_t n_kv_heads, double eps,
                                std::vector<int64_t> keep) {
  const int64_t n_layers = static_cast<int64_t>(weights.size()) / kLayerArgs;
  TORCH_CHECK(n_layers >= 1 && static_cast<int64_t>(weights.size()) == n_layers * kLayerArgs,
              "layer_steps: weights must hold ", kLayerArgs, " tensors a layer, got ", weights.size());
  TORCH_CHECK(k_cache.dim() == 5 && k_cache.size(0) == n_layers, "layer_steps: the caches must be [", n_layers,
              ", max_batch, Hkv, max_len, D]");
  for (const int64_t l : keep) TORCH_CHECK(l >= 0 && l < n_layers, "layer_steps: no layer ", l, " to keep");
  const Cache c0 = cache_layer(k_cache, v_cache, 0);
  const StepArgs sa(x_in, c0, cos, sin, rows, write_slots, row_first, n_slots, mask, n_heads, n_kv_heads, eps);
  Tensor x = x_in.contiguous();
  const int64_t n_keep = static_cast<int64_t>(keep.size()), width = x.size(2), n_rows = x.size(0) * x.size(1);
  Tensor kept = n_keep ? at::empty({x.size(0), x.size(1), n_keep * width}, x.options()) : Tensor();
  Tensor bufs[2] = {at::empty(x.sizes(), x.options()), n_layers > 1 ? at::empty(x.sizes(), x.options()) : Tensor()};
  std::vector<c10::optional<Tensor>> bias(4);
  for (int64_t l = 0; l < n_layers; ++l) {
    const Tensor* w = weights.data() + l * kLayerArgs;
    for (int i = 0; i < 4; ++i) {
      const Tensor& bi = w[5 + 4 * i];
      bias[i] = bi.numel() == 0 ? c10::nullopt : c10::optional<Tensor>(bi);
    }
    const std::vector<Tensor> qkv{w[2], w[3], w[4]}, o{w[6], w[7], w[8]}, gu{w[10], w[11], w[12]},
        down{w[14], w[15], w[16]};
    Tensor& out = bufs[l % 2];  // never x: layer l reads the other buffer (or x_in) and writes this one
    run_layer(sa.st, Layer{w[0], w[1], {qkv, bias[0]}, {o, bias[1]}, {gu, bias[2]}, {down, bias[3]}},
              cache_layer(k_cache, v_cache, l), x.data_ptr<float>(), nullptr, width, out.data_ptr<float>());
    for (int64_t j = 0; j < n_keep; ++j) {
      if (keep[j] != l) continue;
      const float* src = out.data_ptr<float>();
      float* dst = kept.data_ptr<float>() + j * width;
      for (int64_t r = 0; r < n_rows; ++r)
        std::memcpy(dst + r * n_keep * width, src + r * width, width * sizeof(float));
    }
    x = out;
  }
  if (n_keep) return {x, kept};
  return {x};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eaglespec, m) {
  m.def("layer_step(Tensor x, Tensor? attn_input, Tensor attn_norm, Tensor mlp_norm, Tensor[] wqkv, Tensor? bqkv, Tensor[] wo, "
        "Tensor? bo, Tensor[] w13, Tensor? b13, Tensor[] w2, Tensor? b2, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor rows, Tensor write_slots, int row_first, int n_slots, Tensor? mask, int n_heads, "
        "int n_kv_heads, float eps) -> Tensor");
}
TORCH_LIBRARY_FRAGMENT(eaglespec, m) {
  m.def("layer_steps(Tensor x, Tensor[] weights, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor rows, Tensor write_slots, int row_first, int n_slots, Tensor? mask, int n_heads, int n_kv_heads, "
        "float eps, int[] keep) -> Tensor[]");
}
TORCH_LIBRARY_IMPL(eaglespec, CPU, m) {
  m.impl("layer_step", &layer_step);
  m.impl("layer_steps", &layer_steps);
}
