// Attention of a few new queries over a KV cache, each query computed on its own in a fixed order.
//
// Why by hand: decoding and verification must give a token the same attention output whether it is decoded
// alone or verified among N tree tokens, or greedy speculative output drifts from vanilla output (packed
// kernels round activations, which amplifies a last-bit difference). torch's CPU attention kernels block the
// queries and sum in an order that depends on how many there are, so the runtime ran them in float64 (the
// rounding then vanished in the cast back), which costs a float64 copy of the keys and values every layer.
// Here every (batch row, query head, query) gets its scores as dot products summed in one fixed order over
// the visible slots only, compacted, and its softmax and weighted sum over values run in slot order over
// them, so the float32 result depends on nothing but the query and the keys and values it sees, in order:
// not on the number of queries, the tree layout, gaps left by other branches or the cache length.
//
// What the queries share is memory traffic, never arithmetic: one job takes a few queries of one batch row
// against one KV head (its group of query heads), and where their compacted slot lists agree (the context
// every tree token sees) each block of key rows and each chunk of value rows is read from L2 once and used
// from L1 by every query of the job. A query's sums are the same instructions in the same order either way
// (a job's accumulators go to memory between value chunks and come back unchanged), so how queries are
// grouped into jobs (which depends on the batch, the query count and the threads) never changes a result.
//
// Keys and values in float16 (a cache of half the bytes: decoding reads every cached key and value of every layer
// each step, at batch 4 over 200 tokens of the default model half as many bytes as its int4 weights) are
// converted to float32 a block of rows at a time into the thread's scratch, once for all of a job's queries, and
// the arithmetic then runs on those rows exactly as on float32 ones: the conversion is exact, so the same
// invariance holds.
//
// Shapes: q [B, H, T, D] float32; keys, values [B, Hkv, S, D] float32 or both float16; each with its last
// dimension contiguous and any other strides (views of the cache and of a projection are read in place); mask
// bool [B or 1, 1, T, S] (true = may attend) or absent (every slot visible); H a multiple of Hkv, D a multiple of
// 16. Returns [B, T, H, D] float32.
#include <immintrin.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Optional.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "layer_parts.h"

namespace {

// exp(x) for x <= 0 (scores minus their max), Cephes-style: x = n ln2 + r, |r| <= ln2 / 2, a degree-6
// polynomial for e^r, then scaled by 2^n; lane by lane, so a value never depends on its neighbours.
__attribute__((always_inline)) inline __m512 exp_nonpositive(__m512 x) {
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
__attribute__((always_inline)) inline __m512 sum16(const __m512* a) {
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

inline __mmask16 first_lanes(int64_t m) { return m >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << m) - 1); }

constexpr int64_t kValueChunk = 32;  // value rows a job reads once for all its queries (8 KB at D = 64)
constexpr int64_t kMaxPerJob = 16;   // queries in one job

// Where one call's tensors live, and their shapes (see the header).
struct Args {
  const float* qp;
  const void *kp, *vp;  // float or float16 (uint16_t bits), per the job's KV type
  const int64_t* rows;  // the cache row of batch row b (null: b)
  float* op;
  const bool* mp;
  int64_t h, t, d, hkv, s, s_pad, qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2, m_b, m_t, per_job;
  float scale;
};

// A thread's working memory, sized for a job of `per_job` queries.
struct Scratch {
  std::vector<int32_t> seen;  // [query][s_pad]: the visible slots, in slot order
  std::vector<float> p;       // [query][head][s_pad]: scores, then probabilities, of those slots
  std::vector<float> acc;     // [query][head][d]: the weighted sums between value chunks
  std::vector<__m512> q;      // [query][head][d / 16]: the scaled queries
};

// Rows idx[0..m) (slot indices, strides in elements) of a float32 or float16 cache view, as float32 row
// pointers: float32 rows are read in place; float16 rows are converted into `tmp` ([m][d]) first (exact).
template <typename KV>
__attribute__((always_inline)) inline void stage_rows(const KV* base, int64_t stride, const int32_t* idx, int64_t m,
                                                      int64_t d, float* tmp, const float** out);
template <>
inline void stage_rows<float>(const float* base, int64_t stride, const int32_t* idx, int64_t m, int64_t, float*,
                              const float** out) {
  for (int64_t l = 0; l < m; ++l) out[l] = base + idx[l] * stride;
}
template <>
inline void stage_rows<uint16_t>(const uint16_t* base, int64_t stride, const int32_t* idx, int64_t m, int64_t d,
                                 float* tmp, const float** out) {
  for (int64_t l = 0; l < m; ++l) {
    const uint16_t* src = base + idx[l] * stride;
    float* dst = tmp + l * d;
    for (int64_t c = 0; c < d; c += 16)
      _mm512_storeu_ps(dst + c, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c))));
    out[l] = dst;
  }
}

// The scores of one block of 16 compacted slots (rows kr) for one query's G heads: products summed over the
// head dimension lane by lane, then across lanes by sum16; stored to p, and the running maxima updated.
template <int NV, int G>
__attribute__((always_inline)) inline void score_block(const float* const* kr, const __m512* qv, int64_t nv,
                                                       int64_t group, float* p, int64_t s_pad, __mmask16 on,
                                                       __m512* best) {
#pragma GCC unroll 8
  for (int64_t g = 0; g < group; ++g) {
    const __m512* qg = qv + g * nv;
    __m512 acc[16];
#pragma GCC unroll 16
    for (int l = 0; l < 16; ++l) {
      acc[l] = _mm512_mul_ps(qg[0], _mm512_loadu_ps(kr[l]));
#pragma GCC unroll 8
      for (int64_t c = 1; c < nv; ++c) acc[l] = _mm512_fmadd_ps(qg[c], _mm512_loadu_ps(kr[l] + 16 * c), acc[l]);
    }
    const __m512 sc = sum16(acc);
    _mm512_mask_storeu_ps(p + g * s_pad, on, sc);
    best[g] = _mm512_mask_max_ps(best[g], on, best[g], sc);
  }
}

// o[g] += p[g][j] * v_j for compacted j in [j0, j1), in order, for one query's G heads (vr[j - j0]: the value
// row of compacted slot j); the sums start from and return to `acc` ([G][D]).
template <int NV, int G>
__attribute__((always_inline)) inline void value_range(const float* const* vr, const float* p, int64_t s_pad,
                                                       int64_t j0, int64_t j1, int64_t nv, int64_t group, float* acc) {
  constexpr int kNV = NV > 0 ? NV : 32, kG = G > 0 ? G : 16;
  __m512 o[kG * kNV];
  for (int64_t k = 0; k < group * nv; ++k) o[k] = _mm512_loadu_ps(acc + 16 * k);
  for (int64_t j = j0; j < j1; ++j) {
    const float* row = vr[j - j0];
    __m512 w[kG];
#pragma GCC unroll 8
    for (int64_t g = 0; g < group; ++g) w[g] = _mm512_set1_ps(p[g * s_pad + j]);
#pragma GCC unroll 8
    for (int64_t c = 0; c < nv; ++c) {
      const __m512 vc = _mm512_loadu_ps(row + 16 * c);
#pragma GCC unroll 8
      for (int64_t g = 0; g < group; ++g) o[g * nv + c] = _mm512_fmadd_ps(w[g], vc, o[g * nv + c]);
    }
  }
  for (int64_t k = 0; k < group * nv; ++k) _mm512_storeu_ps(acc + 16 * k, o[k]);
}

// One job: queries [t0, t0 + nq) of batch row bi against KV head kvh, with its G query heads. NV (vectors of
// 16 per head) and G are compile-time where a shape is instantiated (0 = read at run time), so the per-query
// accumulators stay in registers. KV: float or uint16_t (float16 bits), the cache's element type.
template <int NV, int G, typename KV>
void attend_job(const Args& a, int64_t job, int64_t nv_rt, int64_t group_rt, Scratch& w) {
  const int64_t nv = NV > 0 ? NV : nv_rt, group = G > 0 ? G : group_rt;
  constexpr int kG = G > 0 ? G : 16;
  const int64_t chunks = (a.t + a.per_job - 1) / a.per_job;
  const int64_t bi = job / (a.hkv * chunks), kvh = (job / chunks) % a.hkv, t0 = (job % chunks) * a.per_job;
  const int64_t nq = std::min(a.per_job, a.t - t0);
  const int64_t row = a.rows != nullptr ? a.rows[bi] : bi;
  const KV* kb = static_cast<const KV*>(a.kp) + row * a.ks0 + kvh * a.ks1;
  const KV* vb = static_cast<const KV*>(a.vp) + row * a.vs0 + kvh * a.vs1;
  const int64_t hd = group * a.d;  // one query's accumulators
  int64_t n[kMaxPerJob];           // visible slots per query
  int64_t shared = a.s;            // compacted positions every query of the job agrees on
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t ti = t0 + qi;
    for (int64_t g = 0; g < group; ++g) {
      const float* qrow = a.qp + bi * a.qs0 + (kvh * group + g) * a.qs1 + ti * a.qs2;
      for (int64_t c = 0; c < nv; ++c)
        w.q[(qi * group + g) * nv + c] = _mm512_mul_ps(_mm512_loadu_ps(qrow + 16 * c), _mm512_set1_ps(a.scale));
    }
    // Only the visible slots, compacted: every sum below then runs over the same sequence of numbers
    // whether a token is verified at slot 52 of a tree with a gap before it or decoded at slot 51.
    const bool* mrow = a.mp ? a.mp + bi * a.m_b + ti * a.m_t : nullptr;
    int32_t* sp = w.seen.data() + qi * a.s_pad;
    int64_t cnt = 0;
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t j = 0; j < a.s; j += 16, idx = _mm512_add_epi32(idx, _mm512_set1_epi32(16))) {
      __mmask16 on = first_lanes(a.s - j);
      if (mrow != nullptr) on = _mm_mask_cmpneq_epi8_mask(on, _mm_maskz_loadu_epi8(on, mrow + j), _mm_setzero_si128());
      _mm512_mask_compressstoreu_epi32(sp + cnt, on, idx);
      cnt += __builtin_popcount(on);
    }
    n[qi] = cnt;
    if (qi == 0) {
      shared = cnt;
    } else {  // the common prefix of this query's list with the first query's
      const int32_t* s0 = w.seen.data();
      int64_t k = 0;
      const int64_t lim = std::min(shared, cnt);
      while (k < lim && s0[k] == sp[k]) ++k;
      shared = k;
    }
  }
  __m512 best[kMaxPerJob * kG];
  for (int64_t k = 0; k < nq * group; ++k) best[k] = _mm512_set1_ps(-INFINITY);
  // Scores: blocks of 16 compacted slots inside the shared prefix are read once for every query; the rest
  // of each query's list on its own. Either way a block is the same 16 slots in the same lanes.
  const int64_t shared_blocks = shared / 16 * 16;
  const float* kr[kValueChunk];  // the rows of a key block, then of a value chunk
  float* tmp = nullptr;          // float16 rows converted: [kValueChunk][d]
  if constexpr (std::is_same_v<KV, uint16_t>) {
    // The thread's own, 64-byte aligned and kept across calls: in a vector made per call the 8-query float16
    // call ran ~9% slower (1.68 against 1.54 ms, 30 layers over 256 slots, 2-core EPYC).
    thread_local std::vector<float> rows;
    if (rows.size() < static_cast<size_t>(kValueChunk * a.d + 16)) rows.resize(kValueChunk * a.d + 16);
    tmp = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(rows.data()) + 63) & ~uintptr_t(63));
  }
  for (int64_t j = 0; j < shared_blocks; j += 16) {
    stage_rows<KV>(kb, a.ks2, w.seen.data() + j, 16, a.d, tmp, kr);
    for (int64_t qi = 0; qi < nq; ++qi)
      score_block<NV, G>(kr, &w.q[qi * group * nv], nv, group, &w.p[qi * group * a.s_pad + j], a.s_pad, 0xFFFF,
                         &best[qi * group]);
  }
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int32_t* sp = w.seen.data() + qi * a.s_pad;
    for (int64_t j = shared_blocks; j < n[qi]; j += 16) {
      const int64_t m = std::min<int64_t>(16, n[qi] - j);
      stage_rows<KV>(kb, a.ks2, sp + j, m, a.d, tmp, kr);
      for (int64_t l = m; l < 16; ++l) kr[l] = kr[m - 1];  // past the end: repeats, masked off
      score_block<NV, G>(kr, &w.q[qi * group * nv], nv, group, &w.p[qi * group * a.s_pad + j], a.s_pad,
                         first_lanes(m), &best[qi * group]);
    }
  }
  // Softmax of each (query, head) over its visible slots, in blocks of 16 compacted slots.
  float inv[kMaxPerJob * kG];
  for (int64_t k = 0; k < nq * group; ++k) {
    const int64_t cnt = n[k / group];
    float* pk = &w.p[k * a.s_pad];
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(best[k]));
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < cnt; j += 16) {
      const __mmask16 on = first_lanes(cnt - j);
      const __m512 e = _mm512_maskz_mov_ps(on, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(on, pk + j), mx)));
      _mm512_mask_storeu_ps(pk + j, on, e);
      total = _mm512_add_ps(total, e);
    }
    inv[k] = cnt > 0 ? 1.0f / _mm512_reduce_add_ps(total) : 0.0f;  // nothing visible: zeros (never for a token)
  }
  // Weighted sums over values, slot by slot: shared value rows a chunk at a time for every query, then each
  // query's own tail.
  std::fill(w.acc.begin(), w.acc.begin() + nq * hd, 0.0f);
  const float** vr = kr;
  for (int64_t j = 0; j < shared; j += kValueChunk) {
    const int64_t j1 = std::min(shared, j + kValueChunk);
    stage_rows<KV>(vb, a.vs2, w.seen.data() + j, j1 - j, a.d, tmp, vr);
    for (int64_t qi = 0; qi < nq; ++qi)
      value_range<NV, G>(vr, &w.p[qi * group * a.s_pad], a.s_pad, j, j1, nv, group, &w.acc[qi * hd]);
  }
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int32_t* sp = w.seen.data() + qi * a.s_pad;
    for (int64_t j = shared; j < n[qi]; j += kValueChunk) {
      const int64_t j1 = std::min(n[qi], j + kValueChunk);
      stage_rows<KV>(vb, a.vs2, sp + j, j1 - j, a.d, tmp, vr);
      value_range<NV, G>(vr, &w.p[qi * group * a.s_pad], a.s_pad, j, j1, nv, group, &w.acc[qi * hd]);
    }
    for (int64_t g = 0; g < group; ++g) {
      float* orow = a.op + ((bi * a.t + t0 + qi) * a.h + kvh * group + g) * a.d;
      const float* src = &w.acc[qi * hd + g * a.d];
      const __m512 s = _mm512_set1_ps(inv[qi * group + g]);
      for (int64_t c = 0; c < nv; ++c) _mm512_storeu_ps(orow + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(src + 16 * c), s));
    }
  }
}

using JobFn = void (*)(const Args&, int64_t, int64_t, int64_t, Scratch&);

// Head dims 64 and 128 with up to 8 query heads per KV head (Llama, Qwen, SmolLM shapes) run compiled for
// their shape; anything else runs the same code with its sizes read at run time.
template <typename KV>
JobFn pick_job(int64_t nv, int64_t group) {
  static constexpr JobFn d64[9] = {nullptr, attend_job<4, 1, KV>, attend_job<4, 2, KV>, attend_job<4, 3, KV>,
                                   attend_job<4, 4, KV>, attend_job<4, 5, KV>, attend_job<4, 6, KV>,
                                   attend_job<4, 7, KV>, attend_job<4, 8, KV>};
  static constexpr JobFn d128[9] = {nullptr, attend_job<8, 1, KV>, attend_job<8, 2, KV>, attend_job<8, 3, KV>,
                                    attend_job<8, 4, KV>, attend_job<8, 5, KV>, attend_job<8, 6, KV>,
                                    attend_job<8, 7, KV>, attend_job<8, 8, KV>};
  if (group >= 1 && group <= 8 && nv == 4) return d64[group];
  if (group >= 1 && group <= 8 && nv == 8) return d128[group];
  return attend_job<0, 0, KV>;
}

}  // namespace

void eaglespec_kernels::row_attention_rows(const Attend& in) {
  const int64_t b = in.b, h = in.h, t = in.t, d = in.d, hkv = in.hkv, s = in.s;
  TORCH_CHECK(hkv > 0 && h % hkv == 0 && d % 16 == 0 && d <= 512, "row_attention: needs H % Hkv == 0, D % 16 == 0");
  TORCH_CHECK(s < (int64_t{1} << 31), "row_attention: at most 2^31 - 1 slots");
  const int64_t group = h / hkv, nv = d / 16;
  TORCH_CHECK(group <= 16, "row_attention: at most 16 query heads per KV head");
  Args a{};
  a.qp = in.q, a.kp = in.k, a.vp = in.v, a.rows = in.rows, a.op = in.out;
  a.mp = in.mask, a.m_b = in.m_b, a.m_t = in.m_t;
  a.h = h, a.t = t, a.d = d, a.hkv = hkv, a.s = s;
  a.qs0 = in.q0, a.qs1 = in.q1, a.qs2 = in.q2;
  a.ks0 = in.k0, a.ks1 = in.k1, a.ks2 = in.k2;
  a.vs0 = in.v0, a.vs1 = in.v1, a.vs2 = in.v2;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.s_pad = (s + 15) / 16 * 16;
  // Queries per job: enough jobs to keep every thread busy twice over, otherwise as many queries as can
  // share each read (at most kMaxPerJob). The grouping changes no result (see the header).
  const int64_t want = 2 * at::get_num_threads(), pairs = b * hkv;
  const int64_t splits = std::min<int64_t>(t, std::max<int64_t>((want + pairs - 1) / pairs, (t + kMaxPerJob - 1) / kMaxPerJob));
  a.per_job = (t + splits - 1) / splits;
  const int64_t chunks = (t + a.per_job - 1) / a.per_job;
  const JobFn job = in.half ? pick_job<uint16_t>(nv, group) : pick_job<float>(nv, group);
  at::parallel_for(0, pairs * chunks, 1, [&](int64_t i0, int64_t i1) {
    Scratch w;
    w.seen.resize(a.per_job * a.s_pad);
    w.p.resize(a.per_job * group * a.s_pad);
    w.acc.resize(a.per_job * group * d);
    w.q.resize(a.per_job * group * nv);
    for (int64_t i = i0; i < i1; ++i) job(a, i, nv, group, w);
  });
}

namespace {

at::Tensor row_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                         const c10::optional<at::Tensor>& mask) {
  TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.dim() == 4, "row_attention: q, keys, values must be 4-D");
  const bool half = keys.scalar_type() == at::kHalf;
  TORCH_CHECK(q.scalar_type() == at::kFloat && (keys.scalar_type() == at::kFloat || half) &&
              values.scalar_type() == keys.scalar_type(),
              "row_attention: q float32, keys and values both float32 or both float16");
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = keys.size(1), s = keys.size(2);
  TORCH_CHECK(keys.size(0) == b && values.size(0) == b && values.size(1) == hkv && values.size(2) == s &&
              keys.size(3) == d && values.size(3) == d, "row_attention: keys/values do not match q");
  TORCH_CHECK(keys.stride(3) == 1 && values.stride(3) == 1, "row_attention: keys/values need a contiguous last dim");
  eaglespec_kernels::Attend a{};
  at::Tensor mc;
  if (mask.has_value()) {
    mc = mask->contiguous();
    TORCH_CHECK(mc.scalar_type() == at::kBool && mc.dim() == 4 && (mc.size(0) == 1 || mc.size(0) == b) &&
                mc.size(1) == 1 && mc.size(2) == t && mc.size(3) == s, "row_attention: mask must be bool [B|1, 1, T, S]");
    a.mask = mc.data_ptr<bool>();
    a.m_b = mc.size(0) == 1 ? 0 : t * s;
    a.m_t = s;
  }
  // q is read in place through its strides: the one-call layer passed a transposed view of its projection,
  // whose copy cost ~4 us a layer at 8 tokens (0.13 ms of a 9 ms verification forward, 2-core EPYC).
  auto qc = q.stride(3) == 1 ? q : q.contiguous();
  auto out = at::empty({b, t, h, d}, q.options());
  a.q = qc.data_ptr<float>(), a.q0 = qc.stride(0), a.q1 = qc.stride(1), a.q2 = qc.stride(2);
  a.k = keys.data_ptr(), a.v = values.data_ptr(), a.half = half;
  a.k0 = keys.stride(0), a.k1 = keys.stride(1), a.k2 = keys.stride(2);
  a.v0 = values.stride(0), a.v1 = values.stride(1), a.v2 = values.stride(2);
  a.out = out.data_ptr<float>();
  a.b = b, a.h = h, a.t = t, a.d = d, a.hkv = hkv, a.s = s;
  eaglespec_kernels::row_attention_rows(a);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eaglespec, m) {
  m.def("row_attention(Tensor q, Tensor keys, Tensor values, Tensor? mask) -> Tensor");
}
TORCH_LIBRARY_IMPL(eaglespec, CPU, m) { m.impl("row_attention", &row_attention); }
