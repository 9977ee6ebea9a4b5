// Attention of a few new queries over a KV cache, each query computed on its own in a fixed order.
//
// Why by hand: decoding and verification must give a token the same attention output whether it is decoded
// alone or verified among N tree tokens, or greedy speculative output drifts from vanilla output (packed
// kernels round activations, which amplifies a last-bit difference). torch's CPU attention kernels block the
// queries and sum in an order that depends on how many there are, so the runtime ran them in float64 (the
// rounding then vanished in the cast back), which costs a float64 copy of the keys and values every layer:
// ~2.5 ms of a ~12 ms int4 decode step and ~6 ms of an 8-token verification on a 2-core EPYC. Here every
// (batch row, head, query) is its own job: scores are dot products summed in one fixed order over the
// visible slots only, compacted, and the softmax and the weighted sum over values run in slot order over
// them, so the float32 result depends on nothing but the query and the keys and values it sees, in order:
// not on the number of queries, the tree layout, gaps left by other branches or the cache length.
//
// Shapes: q [B, H, T, D] float32; keys, values [B, Hkv, S, D] float32, last dimension contiguous (any other
// strides: views of the cache are read in place); mask bool [B or 1, 1, T, S] (true = may attend) or absent
// (every slot visible); H a multiple of Hkv, D a multiple of 16. Returns [B, T, H, D] float32.
#include <immintrin.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Optional.h>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

// exp(x) for x <= 0 (scores minus their max), Cephes-style: x = n ln2 + r, |r| <= ln2 / 2, a degree-6
// polynomial for e^r, then scaled by 2^n; lane by lane, so a value never depends on its neighbours.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// The 16 horizontal sums of a[0..15], as one vector (lane l = sum of a[l]'s lanes): pairs of lanes are added
// in the same pattern for every l, so a slot's score depends only on its own products and its place in the
// block of visible slots.
inline __m512 sum16(const __m512* a) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 w = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v, w, 0x88), _mm512_shuffle_f32x4(v, w, 0xDD));
}

// Where one call's tensors live, and their shapes (see the header).
struct Args {
  const float *qp, *kp, *vp;
  float* op;
  const bool* mp;
  int64_t h, t, d, hkv, s, s_pad, ks0, ks1, ks2, vs0, vs1, vs2, m_b, m_t;
  float scale;
};

// One job = one query token of one batch row against one KV head: its query heads (the group) share the
// visible slots and read each key and value row once for all of them. Per query head the arithmetic is the
// same as if it ran alone. NV (vectors of 16 per head) and G (query heads per KV head) are compile-time
// where a shape is instantiated (0 = read at run time): the group's output accumulators (G x NV vectors)
// then stay in registers through the loop over the values instead of going to memory at every slot, which
// made the weighted sum the kernel's slowest part. The order of every sum is the same either way.
template <int NV, int G>
void attend_job(const Args& a, int64_t i, int64_t nv_rt, int64_t group_rt, std::vector<float>& p,
                std::vector<int64_t>& seen) {
  const int64_t nv = NV > 0 ? NV : nv_rt, group = G > 0 ? G : group_rt;
  constexpr int kNV = NV > 0 ? NV : 32, kG = G > 0 ? G : 16;  // array bounds (D <= 512, group <= 16)
  __m512 qv[kG * kNV], o[kG * kNV];
  float best[kG], inv[kG];
  const int64_t bi = i / (a.hkv * a.t), kvh = (i / a.t) % a.hkv, ti = i % a.t;
  const float* kb = a.kp + bi * a.ks0 + kvh * a.ks1;
  const float* vb = a.vp + bi * a.vs0 + kvh * a.vs1;
  const bool* mrow = a.mp ? a.mp + bi * a.m_b + ti * a.m_t : nullptr;
  for (int64_t g = 0; g < group; ++g) {
    const float* qrow = a.qp + ((bi * a.h + kvh * group + g) * a.t + ti) * a.d;
    for (int64_t c = 0; c < nv; ++c)
      qv[g * nv + c] = _mm512_mul_ps(_mm512_loadu_ps(qrow + 16 * c), _mm512_set1_ps(a.scale));
  }
  // Only the visible slots, compacted: every sum below then runs over the same sequence of numbers
  // whether a token is verified at slot 52 of a tree with a gap before it or decoded at slot 51.
  int64_t n = 0;
  for (int64_t j = 0; j < a.s; ++j)
    if (mrow == nullptr || mrow[j]) seen[n++] = j;
  for (int64_t g = 0; g < group; ++g) best[g] = -INFINITY;
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t m = std::min<int64_t>(16, n - j);
    const __mmask16 on = m == 16 ? 0xFFFF : static_cast<__mmask16>((1u << m) - 1);
    for (int64_t g = 0; g < group; ++g) {
      const __m512* qg = &qv[g * nv];
      __m512 acc[16];
      for (int64_t l = 0; l < 16; ++l) {
        if (l >= m) { acc[l] = _mm512_setzero_ps(); continue; }
        const float* kr = kb + seen[j + l] * a.ks2;  // the block's 16 key rows stay in L1 across the group
        acc[l] = _mm512_mul_ps(qg[0], _mm512_loadu_ps(kr));
        for (int64_t c = 1; c < nv; ++c) acc[l] = _mm512_fmadd_ps(qg[c], _mm512_loadu_ps(kr + 16 * c), acc[l]);
      }
      const __m512 sc = sum16(acc);
      _mm512_mask_storeu_ps(&p[g * a.s_pad + j], on, sc);
      best[g] = std::max(best[g], _mm512_mask_reduce_max_ps(on, sc));
    }
  }
  if (n == 0) {  // nothing visible: zeros (never happens for a token, which sees itself)
    for (int64_t g = 0; g < group; ++g) {
      float* orow = a.op + ((bi * a.t + ti) * a.h + kvh * group + g) * a.d;
      for (int64_t c = 0; c < a.d; ++c) orow[c] = 0.0f;
    }
    return;
  }
  for (int64_t g = 0; g < group; ++g) {
    float* pg = &p[g * a.s_pad];
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 on = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
      const __m512 x = _mm512_maskz_loadu_ps(on, pg + j);
      const __m512 e = _mm512_maskz_mov_ps(on, exp_nonpositive(_mm512_sub_ps(x, _mm512_set1_ps(best[g]))));
      _mm512_mask_storeu_ps(pg + j, on, e);
      total = _mm512_add_ps(total, e);
    }
    inv[g] = 1.0f / _mm512_reduce_add_ps(total);
  }
  for (int64_t k = 0; k < group * nv; ++k) o[k] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const float* vr = vb + seen[j] * a.vs2;
    for (int64_t c = 0; c < nv; ++c) {
      const __m512 vc = _mm512_loadu_ps(vr + 16 * c);  // each value row read once for the group
      for (int64_t g = 0; g < group; ++g)
        o[g * nv + c] = _mm512_fmadd_ps(_mm512_set1_ps(p[g * a.s_pad + j]), vc, o[g * nv + c]);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* orow = a.op + ((bi * a.t + ti) * a.h + kvh * group + g) * a.d;
    for (int64_t c = 0; c < nv; ++c)
      _mm512_storeu_ps(orow + 16 * c, _mm512_mul_ps(o[g * nv + c], _mm512_set1_ps(inv[g])));
  }
}

using JobFn = void (*)(const Args&, int64_t, int64_t, int64_t, std::vector<float>&, std::vector<int64_t>&);

// Head dims 64 and 128 with up to 8 query heads per KV head (Llama, Qwen, SmolLM shapes) run compiled for
// their shape; anything else runs the same code with its sizes read at run time.
JobFn pick_job(int64_t nv, int64_t group) {
  static constexpr JobFn d64[9] = {nullptr, attend_job<4, 1>, attend_job<4, 2>, attend_job<4, 3>, attend_job<4, 4>,
                                   attend_job<4, 5>, attend_job<4, 6>, attend_job<4, 7>, attend_job<4, 8>};
  static constexpr JobFn d128[9] = {nullptr, attend_job<8, 1>, attend_job<8, 2>, attend_job<8, 3>,
                                    attend_job<8, 4>, attend_job<8, 5>, attend_job<8, 6>, attend_job<8, 7>,
                                    attend_job<8, 8>};
  if (group >= 1 && group <= 8 && nv == 4) return d64[group];
  if (group >= 1 && group <= 8 && nv == 8) return d128[group];
  return attend_job<0, 0>;
}

at::Tensor row_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                         const c10::optional<at::Tensor>& mask) {
  TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.dim() == 4, "row_attention: q, keys, values must be 4-D");
  TORCH_CHECK(q.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat &&
              values.scalar_type() == at::kFloat, "row_attention: float32 tensors only");
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = keys.size(1), s = keys.size(2);
  TORCH_CHECK(keys.size(0) == b && values.size(0) == b && values.size(1) == hkv && values.size(2) == s &&
              keys.size(3) == d && values.size(3) == d, "row_attention: keys/values do not match q");
  TORCH_CHECK(hkv > 0 && h % hkv == 0 && d % 16 == 0 && d <= 512, "row_attention: needs H % Hkv == 0, D % 16 == 0");
  TORCH_CHECK(keys.stride(3) == 1 && values.stride(3) == 1, "row_attention: keys/values need a contiguous last dim");
  Args a{};
  at::Tensor mc;
  if (mask.has_value()) {
    mc = mask->contiguous();
    TORCH_CHECK(mc.scalar_type() == at::kBool && mc.dim() == 4 && (mc.size(0) == 1 || mc.size(0) == b) &&
                mc.size(1) == 1 && mc.size(2) == t && mc.size(3) == s, "row_attention: mask must be bool [B|1, 1, T, S]");
    a.mp = mc.data_ptr<bool>();
    a.m_b = mc.size(0) == 1 ? 0 : t * s;
    a.m_t = s;
  }
  auto qc = q.contiguous();
  auto out = at::empty({b, t, h, d}, q.options());
  a.qp = qc.data_ptr<float>();
  a.kp = keys.data_ptr<float>();
  a.vp = values.data_ptr<float>();
  a.op = out.data_ptr<float>();
  a.h = h, a.t = t, a.d = d, a.hkv = hkv, a.s = s;
  a.ks0 = keys.stride(0), a.ks1 = keys.stride(1), a.ks2 = keys.stride(2);
  a.vs0 = values.stride(0), a.vs1 = values.stride(1), a.vs2 = values.stride(2);
  const int64_t group = h / hkv, nv = d / 16;
  TORCH_CHECK(group <= 16, "row_attention: at most 16 query heads per KV head");
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.s_pad = (s + 15) / 16 * 16;
  const JobFn job = pick_job(nv, group);
  at::parallel_for(0, b * hkv * t, 2, [&](int64_t i0, int64_t i1) {
    std::vector<float> p(group * a.s_pad);  // per query head: scores, then probabilities, of the visible slots
    std::vector<int64_t> seen(a.s_pad);     // which slots those are, in slot order
    for (int64_t i = i0; i < i1; ++i) job(a, i, nv, group, p, seen);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ra_v0, m) {
  m.def("row_attention(Tensor q, Tensor keys, Tensor values, Tensor? mask) -> Tensor");
}
TORCH_LIBRARY_IMPL(ra_v0, CPU, m) { m.impl("row_attention", &row_attention); }
