# Session 19's variants.py rerun on main at the start of session 24 (BASE below; the kernel's integer sums unchanged since),
# timed with session 15's w4a8_ab.py (VARIANTS_DIR = this folder). Each variant is the
# project's kernel at BASE with one change and its ops registered under its own torch.ops namespace:
#   w4_chunk: from 5 rows, a tile's rows summed in two chunks of at most 4 (two chains a row, as at 4 rows) over the
#             same unpacked weights, so the integer accumulators never outnumber the 32 vector registers;
#   w4_il1:   one integer chain a row from 5 rows (session 15's w4_il1 shape).
# Both bit-identical to the project's kernel (integer sums are exact; each row's float accumulation keeps its
# order). Usage: python variants.py
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
BASE = "467c8f1"  # main at the start of session 24

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
  }'''
VARIANTS = {
    "w4_chunk": '''    constexpr int kChunk = MR > 4 ? (MR + 1) / 2 : MR;
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
  }''',
    "w4_il1": '''    constexpr int kChains = MR > 4 ? 1 : 2;
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
  }''',
}

src = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASE}:eaglespec/runtime/kernels/w4a8.cpp"], check=True,
                     capture_output=True, text=True).stdout
assert SUMS in src
for name, body in VARIANTS.items():
    out = src.replace(SUMS, body)
    for macro in ("TORCH_LIBRARY", "TORCH_LIBRARY_IMPL"):
        out = out.replace(f"{macro}(eaglespec, ", f"{macro}({name}, ")
    (HERE / f"{name}.cpp").write_text(out)
