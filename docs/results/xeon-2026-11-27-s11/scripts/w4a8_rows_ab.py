import time, statistics, torch, sys
from torch.utils.cpp_extension import load
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
F = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]
for R in (6, 8, 9):
    load(name=f"ab{R}", sources=[f"/work/runs/s11/ab/w4a8_{R}.cpp"], extra_cflags=F, extra_ldflags=["-fopenmp"], is_python_module=False, build_directory=None)
m = load_target().model
mods = [x for x in m.modules() if getattr(x, "w4_q", None) is not None]
ops = {R: getattr(torch.ops, f"ab{R}").w4a8_mm for R in (6, 8, 9)}
xs = {n: {id(l): torch.randn(n, l.w4_q.shape[1] * 32) for l in mods} for n in range(1, 9)}
# identical results
for n in (7, 8):
    for l in mods[:5]:
        a = ops[6](xs[n][id(l)], l.w4_q, l.w4_scale, l.w4_offset); b = ops[8](xs[n][id(l)], l.w4_q, l.w4_scale, l.w4_offset); c = ops[9](xs[n][id(l)], l.w4_q, l.w4_scale, l.w4_offset)
        assert torch.equal(a, b) and torch.equal(a, c)
def run(op, n):
    t0 = time.perf_counter()
    for l in mods: op(xs[n][id(l)], l.w4_q, l.w4_scale, l.w4_offset)
    return time.perf_counter() - t0
res = {(R, n): [] for R in (6, 8, 9) for n in range(1, 9)}
for rep in range(25):
    for n in range(1, 9):
        for R in ((6, 8, 9) if rep % 2 == 0 else (9, 8, 6)):
            res[R, n].append(run(ops[R], n))
for R in (6, 8, 9):
    print(f"kMaxRows={R}: " + " ".join(f"{n}:{1e3*min(res[R, n]):.2f}/{1e3*statistics.median(res[R, n]):.2f}" for n in range(1, 9)), flush=True)
