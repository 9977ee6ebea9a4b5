# Writes the kernels this session compared against, each under its own torch.ops namespace, next to this script
# for build.py: the kernels as they were before the session (ra_v0 = row_attention.cpp, w4_old = w4a8.cpp, read
# from git at BASE), the w4a8 variants tried (w4_acc2 / w4_acc4 / w4_il1: one change each to w4_old; the kept one,
# rows interleaved with two chains a row, is the project's own build, run as "eaglespec"), and le_g16 (the
# project's layer_elementwise.cpp with SwiGLU rows split from 17 rows, as before). Usage: python variants.py
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
BASE = "286ff6b"  # main before session 15


def from_git(path: str, name: str) -> str:
    """The kernel source at BASE, its ops registered under ``name`` instead of ``eaglespec``."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASE}:{path}"], check=True, capture_output=True,
                         text=True).stdout
    for macro in ("TORCH_LIBRARY", "TORCH_LIBRARY_FRAGMENT", "TORCH_LIBRARY_IMPL"):
        src = src.replace(f"{macro}(eaglespec, ", f"{macro}({name}, ")
    return src


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

(HERE / "ra_v0.cpp").write_text(from_git("eaglespec/runtime/kernels/row_attention.cpp", "ra_v0"))
old = from_git("eaglespec/runtime/kernels/w4a8.cpp", "w4_old")
(HERE / "w4_old.cpp").write_text(old)
assert OLD_SUMS in old
for name, sums in SUMS.items():
    (HERE / f"{name}.cpp").write_text(old.replace(OLD_SUMS, sums).replace("(w4_old, ", f"({name}, "))
le = (ROOT / "eaglespec/runtime/kernels/layer_elementwise.cpp").read_text()
le = le.replace("for_items(rows, 4, [&](int64_t r) { silu_mul_row", "for_items(rows, 16, [&](int64_t r) { silu_mul_row")
le = le.replace("TORCH_LIBRARY_FRAGMENT(eaglespec, m)", "TORCH_LIBRARY_FRAGMENT(le_g16, m)")
(HERE / "le_g16.cpp").write_text(le.replace("TORCH_LIBRARY_IMPL(eaglespec, CPU, m)", "TORCH_LIBRARY_IMPL(le_g16, CPU, m)"))
print("wrote", ", ".join(["ra_v0", "w4_old", *SUMS, "le_g16"]))
