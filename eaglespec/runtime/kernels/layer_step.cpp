// One decoder layer of a decode or verification forward in one call: the same kernels, in the same order, as
// the Python layer (runtime/model.py ``decoder_layer`` over a packed ``DecoderLayer``), without the Python.
//
// Why by hand: an eager decode step of the default model ran ~25 torch calls and ~20 Python frames per layer
// around its kernels, ~2.5 of ~8.3 ms a 1-token forward on a 2-core Xeon; a call from C++ costs a fraction of
// one from Python. Every step below is the operator the Python layer calls (our kernels through the
// dispatcher, aten for the adds, views and the cache writes), so the result is bit-identical to it (tested);
// the layer's shapes and options outside this path (qk norms, other kernels, prompts) stay in Python.
//
// Inputs: x float32 [B, T, H] (the residual stream); attn_input: what the q/k/v projection reads, when it is
// not rms_norm(x, attn_norm) (a draft head's first layer, spec/heads.py); the four projections as w4a8 triples (wq, scale, offset; runtime/w4a8.py) with
// optional biases; the norms' weights [H]; cos, sin_signed [B, T, 1, D] (model.Rotary); the layer's cache
// tensors k, v [max_batch, Hkv, max_len, D]; rows int64 [B] and write_slots int64 [B, T] (where the new keys
// and values go); row_first: rows as a slice start when they are contiguous (-1: gather); n_slots: attention
// runs over slots [0, n_slots); mask bool [B|1, 1, T, n_slots] or absent (model.plan_attention).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Optional.h>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

namespace {

using at::Tensor;

Tensor w4a8(const Tensor& x, const std::vector<Tensor>& w) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("eaglespec::w4a8_mm", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>();
  return op.call(x, w[0], w[1], w[2]);
}

Tensor norm(const Tensor& x, const Tensor& w, double eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("eaglespec::rms_norm", "")
                       .typed<Tensor(const Tensor&, const Tensor&, double)>();
  return op.call(x, w, eps);
}

// PackedLinear.forward + quant.linear: rows of x [..., K] times the packed weight, plus the bias.
Tensor linear(const Tensor& x, const std::vector<Tensor>& w, const c10::optional<Tensor>& bias) {
  TORCH_CHECK(w.size() == 3, "layer_step: a projection is a w4a8 triple (wq, scale, offset)");
  auto sizes = x.sizes().vec();
  Tensor y = w4a8(x.reshape({-1, sizes.back()}), w);
  sizes.back() = y.size(1);
  y = y.reshape(sizes);
  return bias.has_value() ? y + *bias : y;
}

// residual + linear(x): without a bias the add runs inside the matmul as each tile is stored (w4a8_mm_add, the
// same float32 add); with one, as the Python layer adds it, residual + (x W + bias).
Tensor linear_add(const Tensor& x, const std::vector<Tensor>& w, const c10::optional<Tensor>& bias,
                  const Tensor& residual) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("eaglespec::w4a8_mm_add", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&)>();
  if (bias.has_value()) return residual + linear(x, w, bias);
  TORCH_CHECK(w.size() == 3, "layer_step: a projection is a w4a8 triple (wq, scale, offset)");
  const auto sizes = residual.sizes().vec();
  return op.call(x.reshape({-1, x.size(-1)}), w[0], w[1], w[2], residual.reshape({-1, sizes.back()})).view(sizes);
}

// write_block: the new keys or values src [B, T, Hkv, D] float32 (any strides, last dim contiguous) into the cache
// tensor dst [max_batch, Hkv, max_len, D] (float32, or float16 rounded to nearest even as torch's copy rounds) at
// (rows[b], write_slots[b, t]).
void write_new(Tensor& dst, const Tensor& src, const int64_t* rows, const int64_t* slots) {
  const int64_t b = src.size(0), t = src.size(1), hkv = src.size(2), d = src.size(3);
  const bool half = dst.scalar_type() == at::kHalf;
  TORCH_CHECK(src.stride(3) == 1 && dst.stride(3) == 1 && dst.size(1) == hkv && dst.size(3) == d && d % 16 == 0 &&
              (half || dst.scalar_type() == at::kFloat), "layer_step: cache layer does not match the new keys/values");
  const float* sp = src.data_ptr<float>();
  char* dp = static_cast<char*>(dst.data_ptr());
  const int64_t el = dst.element_size();
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t r = rows[bi];
    TORCH_CHECK(r >= 0 && r < dst.size(0), "layer_step: cache row ", r, " out of range");
    for (int64_t ti = 0; ti < t; ++ti) {
      const int64_t s = slots[bi * t + ti];
      TORCH_CHECK(s >= 0 && s < dst.size(2), "layer_step: cache slot ", s, " out of range");
      for (int64_t h = 0; h < hkv; ++h) {
        const float* from = sp + bi * src.stride(0) + ti * src.stride(1) + h * src.stride(2);
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

Tensor layer_step(const Tensor& x, const c10::optional<Tensor>& attn_input, const Tensor& attn_norm,
                  const Tensor& mlp_norm, std::vector<Tensor> wqkv,
                  c10::optional<Tensor> bqkv, std::vector<Tensor> wo, c10::optional<Tensor> bo,
                  std::vector<Tensor> w13, c10::optional<Tensor> b13, std::vector<Tensor> w2,
                  c10::optional<Tensor> b2, const Tensor& cos, const Tensor& sin, Tensor k_cache, Tensor v_cache,
                  const Tensor& rows, const Tensor& write_slots, int64_t row_first, int64_t n_slots,
                  const c10::optional<Tensor>& mask, int64_t n_heads, int64_t n_kv_heads, double eps) {
  static auto rotary = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("eaglespec::rotary", "")
                           .typed<Tensor(const Tensor&, const Tensor&, const Tensor&)>();
  static auto attend = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("eaglespec::row_attention", "")
                           .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const c10::optional<Tensor>&)>();
  static auto silu_mul = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("eaglespec::silu_mul", "")
                             .typed<Tensor(const Tensor&, const Tensor&)>();
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "layer_step: x must be float32 [B, T, H] on the CPU");
  const int64_t b = x.size(0), t = x.size(1), d = k_cache.size(3);
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.numel() == b && write_slots.scalar_type() == at::kLong &&
              write_slots.numel() == b * t, "layer_step: rows [B] and write_slots [B, T] must be int64");
  TORCH_CHECK(n_slots >= 1 && n_slots <= k_cache.size(2), "layer_step: n_slots out of range");
  // attention: project, rotate q and k, store k and v, attend over the cache
  const Tensor a = attn_input.has_value() ? *attn_input : norm(x, attn_norm, eps);
  Tensor qkv = linear(a, wqkv, bqkv).view({b, t, n_heads + 2 * n_kv_heads, d});
  Tensor qk = rotary.call(qkv.narrow(2, 0, n_heads + n_kv_heads), cos, sin);  // [B, T, Hq + Hkv, D]
  Tensor v = qkv.narrow(2, n_heads + n_kv_heads, n_kv_heads);
  const Tensor rows_c = rows.contiguous(), slots_c = write_slots.contiguous();
  write_new(k_cache, qk.narrow(2, n_heads, n_kv_heads), rows_c.data_ptr<int64_t>(), slots_c.data_ptr<int64_t>());
  write_new(v_cache, v, rows_c.data_ptr<int64_t>(), slots_c.data_ptr<int64_t>());
  Tensor keys, values;
  if (row_first >= 0) {
    keys = k_cache.narrow(0, row_first, b).narrow(2, 0, n_slots);
    values = v_cache.narrow(0, row_first, b).narrow(2, 0, n_slots);
  } else {
    keys = k_cache.index_select(0, rows_c).narrow(2, 0, n_slots);
    values = v_cache.index_select(0, rows_c).narrow(2, 0, n_slots);
  }
  Tensor o = attend.call(qk.narrow(2, 0, n_heads).transpose(1, 2), keys, values, mask).reshape({b, t, n_heads * d});
  Tensor h = linear_add(o, wo, bo, x);
  // feed-forward
  Tensor gu = linear(norm(h, mlp_norm, eps), w13, b13);
  const int64_t inter = gu.size(-1) / 2;
  return linear_add(silu_mul.call(gu.narrow(-1, 0, inter), gu.narrow(-1, inter, inter)), w2, b2, h);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eaglespec, m) {
  m.def("layer_step(Tensor x, Tensor? attn_input, Tensor attn_norm, Tensor mlp_norm, Tensor[] wqkv, Tensor? bqkv, Tensor[] wo, "
        "Tensor? bo, Tensor[] w13, Tensor? b13, Tensor[] w2, Tensor? b2, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor rows, Tensor write_slots, int row_first, int n_slots, Tensor? mask, int n_heads, "
        "int n_kv_heads, float eps) -> Tensor");
}
TORCH_LIBRARY_IMPL(eaglespec, CPU, m) { m.impl("layer_step", &layer_step); }
