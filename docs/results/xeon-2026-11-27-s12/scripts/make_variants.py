# Writes the kernel copies the A/B scripts build, each under its own op namespace, into DIR (default
# /work/runs/s12): pf/w4a8_pf0.cpp (no prefetch: w4a8.cpp at c09360d), pf/w4a8_pf{8,16,32}g.cpp (prefetch 8 / 16 /
# 32 groups ahead, cc9ad90), pf/w4a8_pfcur.cpp / pf/w4a8_pfr8.cpp (kMaxRows 6 / 8, cc9ad90), ra/old.cpp and
# ra/new.cpp (row_attention at c09360d, and the same with key and value rows prefetched: not kept).
import pathlib, subprocess, sys
out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/work/runs/s12")
(out / "pf").mkdir(parents=True, exist_ok=True); (out / "ra").mkdir(parents=True, exist_ok=True)
show = lambda rev, path: subprocess.run(["git", "show", f"{rev}:{path}"], check=True, capture_output=True, text=True).stdout
def ns(src, name):
    return (src.replace("TORCH_LIBRARY(eaglespec,", f"TORCH_LIBRARY({name},")
               .replace("TORCH_LIBRARY_FRAGMENT(eaglespec,", f"TORCH_LIBRARY_FRAGMENT({name},")
               .replace("TORCH_LIBRARY_IMPL(eaglespec,", f"TORCH_LIBRARY_IMPL({name},"))
old, pf = show("c09360d", "eaglespec/runtime/kernels/w4a8.cpp"), show("cc9ad90", "eaglespec/runtime/kernels/w4a8.cpp")
(out / "pf/w4a8_pf0.cpp").write_text(ns(old, "pf0"))
for g in (8, 16, 32):
    (out / f"pf/w4a8_pf{g}g.cpp").write_text(ns(pf.replace("kPrefetchGroups = 16;", f"kPrefetchGroups = {g};"), f"pf{g}g"))
(out / "pf/w4a8_pfcur.cpp").write_text(ns(pf, "pfcur"))
(out / "pf/w4a8_pfr8.cpp").write_text(ns(pf.replace("kMaxRows = 6;", "kMaxRows = 8;"), "pfr8"))
ra = show("c09360d", "eaglespec/runtime/kernels/row_attention.cpp")
(out / "ra/old.cpp").write_text(ns(ra, "raold"))
s = ra.replace("""      for (int64_t l = 0; l < 16; ++l) {
        if (l >= m) { acc[l] = _mm512_setzero_ps(); continue; }""", """      for (int64_t l = 0; l < 16; ++l) {
        if (g == 0 && j + 16 + l < n) {
          const char* ahead = reinterpret_cast<const char*>(kb + seen[j + 16 + l] * a.ks2);
          for (int64_t c = 0; c < nv; ++c) _mm_prefetch(ahead + 64 * c, _MM_HINT_T0);
        }
        if (l >= m) { acc[l] = _mm512_setzero_ps(); continue; }""").replace("""  for (int64_t j = 0; j < n; ++j) {
    const float* vr = vb + seen[j] * a.vs2;""", """  for (int64_t j = 0; j < n; ++j) {
    if (j + 8 < n) {
      const char* ahead = reinterpret_cast<const char*>(vb + seen[j + 8] * a.vs2);
      for (int64_t c = 0; c < nv; ++c) _mm_prefetch(ahead + 64 * c, _MM_HINT_T0);
    }
    const float* vr = vb + seen[j] * a.vs2;""").replace("""  for (int64_t g = 0; g < group; ++g) {
    float* pg = &p[g * a.s_pad];
    __m512 total""", """  for (int64_t j = 0; j < std::min<int64_t>(n, 8); ++j) {
    const char* first = reinterpret_cast<const char*>(vb + seen[j] * a.vs2);
    for (int64_t c = 0; c < nv; ++c) _mm_prefetch(first + 64 * c, _MM_HINT_T0);
  }
  for (int64_t g = 0; g < group; ++g) {
    float* pg = &p[g * a.s_pad];
    __m512 total""")
assert s.count("_mm_prefetch") == 3
(out / "ra/new.cpp").write_text(ns(s, "ranew"))
print("wrote", out)
