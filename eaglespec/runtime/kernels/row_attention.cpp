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
  const bool* mp = nullptr;
  int64_t m_b = 0, m_t = 0;
  at::Tensor mc;
  if (mask.has_value()) {
    mc = mask->contiguous();
    TORCH_CHECK(mc.scalar_type() == at::kBool && mc.dim() == 4 && (mc.size(0) == 1 || mc.size(0) == b) &&
                mc.size(1) == 1 && mc.size(2) == t && mc.size(3) == s, "row_attention: mask must be bool [B|1, 1, T, S]");
    mp = mc.data_ptr<bool>();
    m_b = mc.size(0) == 1 ? 0 : t * s;
    m_t = s;
  }
  auto qc = q.contiguous();
  auto out = at::empty({b, t, h, d}, q.options());
  const float* qp = qc.data_ptr<float>();
  const float *kp = keys.data_ptr<float>(), *vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t ks0 = keys.stride(0), ks1 = keys.stride(1), ks2 = keys.stride(2);
  const int64_t vs0 = values.stride(0), vs1 = values.stride(1), vs2 = values.stride(2);
  const int64_t group = h / hkv, nv = d / 16;
  TORCH_CHECK(group <= 16, "row_attention: at most 16 query heads per KV head");
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t s_pad = (s + 15) / 16 * 16;

  // One job = one query token of one batch row against one KV head: its query heads (the group) share the
  // visible slots and read each key and value row once for all of them. Per (query head) the arithmetic is
  // the same as if it ran alone.
  at::parallel_for(0, b * hkv * t, 2, [&](int64_t i0, int64_t i1) {
    std::vector<float> p(group * s_pad);  // per query head: scores, then probabilities, of the visible slots
    std::vector<int64_t> seen(s_pad);     // which slots those are, in slot order
    std::vector<__m512> qv(group * nv), o(group * nv);
    std::vector<float> best(group), inv(group);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t bi = i / (hkv * t), kvh = (i / t) % hkv, ti = i % t;
      const float* kb = kp + bi * ks0 + kvh * ks1;
      const float* vb = vp + bi * vs0 + kvh * vs1;
      const bool* mrow = mp ? mp + bi * m_b + ti * m_t : nullptr;
      for (int64_t g = 0; g < group; ++g) {
        const float* qrow = qp + ((bi * h + kvh * group + g) * t + ti) * d;
        for (int64_t c = 0; c < nv; ++c)
          qv[g * nv + c] = _mm512_mul_ps(_mm512_loadu_ps(qrow + 16 * c), _mm512_set1_ps(scale));
      }
      // Only the visible slots, compacted: every sum below then runs over the same sequence of numbers
      // whether a token is verified at slot 52 of a tree with a gap before it or decoded at slot 51.
      int64_t n = 0;
      for (int64_t j = 0; j < s; ++j)
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
            const float* kr = kb + seen[j + l] * ks2;  // the block's 16 key rows stay in L1 across the group
            acc[l] = _mm512_mul_ps(qg[0], _mm512_loadu_ps(kr));
            for (int64_t c = 1; c < nv; ++c) acc[l] = _mm512_fmadd_ps(qg[c], _mm512_loadu_ps(kr + 16 * c), acc[l]);
          }
          const __m512 sc = sum16(acc);
          _mm512_mask_storeu_ps(&p[g * s_pad + j], on, sc);
          best[g] = std::max(best[g], _mm512_mask_reduce_max_ps(on, sc));
        }
      }
      if (n == 0) {  // nothing visible: zeros (never happens for a token, which sees itself)
        for (int64_t g = 0; g < group; ++g) {
          float* orow = op + ((bi * t + ti) * h + kvh * group + g) * d;
          for (int64_t c = 0; c < d; ++c) orow[c] = 0.0f;
        }
        continue;
      }
      for (int64_t g = 0; g < group; ++g) {
        float* pg = &p[g * s_pad];
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
        const float* vr = vb + seen[j] * vs2;
        for (int64_t c = 0; c < nv; ++c) {
          const __m512 vc = _mm512_loadu_ps(vr + 16 * c);  // each value row read once for the group
          for (int64_t g = 0; g < group; ++g)
            o[g * nv + c] = _mm512_fmadd_ps(_mm512_set1_ps(p[g * s_pad + j]), vc, o[g * nv + c]);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* orow = op + ((bi * t + ti) * h + kvh * group + g) * d;
        for (int64_t c = 0; c < nv; ++c)
          _mm512_storeu_ps(orow + 16 * c, _mm512_mul_ps(o[g * nv + c], _mm512_set1_ps(inv[g])));
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eaglespec, m) {
  m.def("row_attention(Tensor q, Tensor keys, Tensor values, Tensor? mask) -> Tensor");
}
TORCH_LIBRARY_IMPL(eaglespec, CPU, m) { m.impl("row_attention", &row_attention); }
