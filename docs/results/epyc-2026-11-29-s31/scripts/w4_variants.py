# Session 19's two bit-identical variants of the int4 x int8 tile loop (w4_chunk: from 5 rows a tile's rows summed
# in two chunks of at most 4 over the same unpacked weights; w4_il1: one integer chain a row from 5 rows), applied to
# the kernel as it is now, against it (w4_main: the source unchanged, built the same way), in one process:
#   python w4_variants.py [ROUNDS]
# The model's 121 packed linears (30 layers' qkv / o / gate-up / down and the lm_head; random int4 weights, seeded)
# at 1-8 rows, every variant in turn each round (order reversed every other round), medians after 2 rounds;
# outputs asserted equal to w4_main's at every row count.
import statistics, sys, time

import torch

from common import build, replace_once, source
from eaglespec.runtime import allocator, cpu_kernels, w4a8

SUMS = '''    __m512i s0[MR], s1[MR];
    for (int r = 0; r < MR; ++r) s0[r] = s1[r] = _mm512_setzero_si512();
    for (int c = 0; c < 8; c += 2) {
      for (int r = 0; r < MR; ++r) {
        const int32_t* x4 = reinterpret_cast<const int32_t*>(xq + r * k + g * kGroup);
        s0[r] = _mm512_dpbusd_epi32(s0[r], w[c], _mm512_set1_epi32(x4[c]));
        s1[r] = _mm512_dpbusd_epi32(s1[r], w[c + 1], _mm512_set1_epi32(x4[c + 1]));
      }
    }
    for (int r = 0; r < MR; ++r) {
      const __m512i isum = _mm512_add_epi32(s0[r], s1[r]);
      const __m512 f = _mm512_mul_ps(sc, _mm512_set1_ps(xd[r * groups + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), f, acc[r]);
      acc[r] = _mm512_fmadd_ps(ze, _mm512_set1_ps(xs[r * groups + g]), acc[r]);
    }
'''
CHUNK = '''    constexpr int kChunk = MR > 4 ? (MR + 1) / 2 : MR;
    for (int r0 = 0; r0 < MR; r0 += kChunk) {
      const int rn = MR - r0 < kChunk ? MR - r0 : kChunk;
      __m512i s0[kChunk], s1[kChunk];
      for (int r = 0; r < kChunk; ++r) s0[r] = s1[r] = _mm512_setzero_si512();
      for (int c = 0; c < 8; c += 2) {
        for (int r = 0; r < kChunk; ++r) {
          if (r >= rn) break;
          const int32_t* x4 = reinterpret_cast<const int32_t*>(xq + (r0 + r) * k + g * kGroup);
          s0[r] = _mm512_dpbusd_epi32(s0[r], w[c], _mm512_set1_epi32(x4[c]));
          s1[r] = _mm512_dpbusd_epi32(s1[r], w[c + 1], _mm512_set1_epi32(x4[c + 1]));
        }
      }
      for (int r = 0; r < kChunk; ++r) {
        if (r >= rn) break;
        const __m512i isum = _mm512_add_epi32(s0[r], s1[r]);
        const __m512 f = _mm512_mul_ps(sc, _mm512_set1_ps(xd[(r0 + r) * groups + g]));
        acc[r0 + r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), f, acc[r0 + r]);
        acc[r0 + r] = _mm512_fmadd_ps(ze, _mm512_set1_ps(xs[(r0 + r) * groups + g]), acc[r0 + r]);
      }
    }
'''
IL1 = '''    constexpr int kChains = MR > 4 ? 1 : 2;
    __m512i s[kChains][MR];
    for (int h = 0; h < kChains; ++h)
      for (int r = 0; r < MR; ++r) s[h][r] = _mm512_setzero_si512();
    for (int c = 0; c < 8; c += kChains)
      for (int h = 0; h < kChains; ++h)
        for (int r = 0; r < MR; ++r) {
          const int32_t* x4 = reinterpret_cast<const int32_t*>(xq + r * k + g * kGroup);
          s[h][r] = _mm512_dpbusd_epi32(s[h][r], w[c + h], _mm512_set1_epi32(x4[c + h]));
        }
    for (int r = 0; r < MR; ++r) {
      const __m512i isum = kChains == 1 ? s[0][r] : _mm512_add_epi32(s[0][r], s[kChains - 1][r]);
      const __m512 f = _mm512_mul_ps(sc, _mm512_set1_ps(xd[r * groups + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), f, acc[r]);
      acc[r] = _mm512_fmadd_ps(ze, _mm512_set1_ps(xs[r * groups + g]), acc[r]);
    }
'''
allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__, "| 2 threads")
src = source("w4a8.cpp")
ops = {"w4_main": build("w4_main", src).w4a8_mm, "w4_chunk": build("w4_chunk", replace_once(src, SUMS, CHUNK)).w4a8_mm,
       "w4_il1": build("w4_il1", replace_once(src, SUMS, IL1)).w4a8_mm}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
g = torch.Generator().manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
ws = []
for n, k in shapes:
    sc = torch.rand(n, k // 32, generator=g) * 0.02
    ws.append(w4a8.pack(torch.randint(0, 16, (n, k), generator=g), sc, -8 * sc))
res: dict = {}
ROWS = (1, 2, 4, 5, 6, 7, 8)
for rows in ROWS:
    xs = [torch.randn(rows, k, generator=g) for _, k in shapes]
    ref = [ops["w4_main"](x, *w) for x, w in zip(xs, ws)]
    for name, op in ops.items():
        assert all(torch.equal(a, op(x, *w)) for a, x, w in zip(ref, xs, ws)), (name, rows)
    for r in range(rounds):
        for name, op in (list(ops.items()) if r % 2 == 0 else list(ops.items())[::-1]):
            t0 = time.perf_counter()
            for x, w in zip(xs, ws):
                op(x, *w)
            res.setdefault((rows, name), []).append(time.perf_counter() - t0)
print(f"outputs identical at every row count; ms for the 121 linears, medians of {rounds - 2} rounds")
print("rows | " + " | ".join(ops) + " | chunk / main | il1 / main")
for rows in ROWS:
    m = {n: statistics.median(res[(rows, n)][2:]) * 1e3 for n in ops}
    print(rows, *(f"{m[n]:.3f}" for n in ops), f"{m['w4_chunk'] / m['w4_main']:.3f}", f"{m['w4_il1'] / m['w4_main']:.3f}",
          sep=" | ")
