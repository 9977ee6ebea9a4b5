# Writes the kernel variants this session compared (each a copy of a baseline with one change, registered under
# its own torch.ops namespace) next to this script, for build.py: w4_acc2 / w4_acc4 / w4_il / w4_il1 from
# w4_old.cpp (the w4a8 kernel at the session's start), le_g16 from the project's layer_elementwise.cpp with the
# SwiGLU rows split from 17 rows as before. Usage: python variants.py
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
OLD_SUMS = '''    for (int r = 0; r < MR; ++r) {
      const int32_t* x4 = reinterpret_cast<const int32_t*>(xq + r * k + g * kGroup);
      __m512i isum = _mm512_setzero_si512();
      for (int c = 0; c < 8; ++c) isum = _mm512_dpbusd_epi32(isum, w[c], _mm512_set1_epi32(x4[c]));
'''
ROW_HEAD = '''    for (int r = 0; r < MR; ++r) {
      const int32_t* x4 = reinterpret_cast<const int32_t*>(xq + r * k + g * kGroup);
'''
SUMS = {
    "w4_acc2": ROW_HEAD + '''      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int c = 0; c < 8; c += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[c], _mm512_set1_epi32(x4[c]));
        s1 = _mm512_dpbusd_epi32(s1, w[c + 1], _mm512_set1_epi32(x4[c + 1]));
      }
      const __m512i isum = _mm512_add_epi32(s0, s1);
''',
    "w4_acc4": ROW_HEAD + '''      __m512i s[4];
      for (int h = 0; h < 4; ++h) s[h] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[h], _mm512_set1_epi32(x4[h]));
      for (int h = 0; h < 4; ++h) s[h] = _mm512_dpbusd_epi32(s[h], w[4 + h], _mm512_set1_epi32(x4[4 + h]));
      const __m512i isum = _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]));
''',
    "w4_il": '''    __m512i s0[MR], s1[MR];
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
''',
    "w4_il1": '''    constexpr int kChains = MR >= 4 ? 1 : 2;
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
''',
}

old = (HERE / "w4_old.cpp").read_text()
assert OLD_SUMS in old
for name, sums in SUMS.items():
    (HERE / f"{name}.cpp").write_text(old.replace(OLD_SUMS, sums).replace("(w4_old, ", f"({name}, "))
le = (ROOT / "eaglespec/runtime/kernels/layer_elementwise.cpp").read_text()
le = le.replace("for_items(rows, 4, [&](int64_t r) { silu_mul_row", "for_items(rows, 16, [&](int64_t r) { silu_mul_row")
le = le.replace("TORCH_LIBRARY_FRAGMENT(eaglespec, m)", "TORCH_LIBRARY_FRAGMENT(le_g16, m)")
(HERE / "le_g16.cpp").write_text(le.replace("TORCH_LIBRARY_IMPL(eaglespec, CPU, m)", "TORCH_LIBRARY_IMPL(le_g16, CPU, m)"))
print("wrote", ", ".join([*SUMS, "le_g16"]))
