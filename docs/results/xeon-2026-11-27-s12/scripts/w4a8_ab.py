import time, statistics, torch, sys
from torch.utils.cpp_extension import load
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
F = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]
PFS = sys.argv[1].split(","); REPS = int(sys.argv[2]); NS = [int(x) for x in sys.argv[3].split(",")]
for pf in PFS:
    load(name=f"pf{pf}", sources=[f"/work/runs/s12/pf/w4a8_pf{pf}.cpp"], extra_cflags=F, extra_ldflags=["-fopenmp"], is_python_module=False)
m = load_target().model
mods = [x for x in m.modules() if getattr(x, "w4_q", None) is not None]
print(len(mods), "packed linears", sum(l.w4_q.numel() for l in mods) / 1e6, "MB of nibbles")
ops = {pf: getattr(torch.ops, f"pf{pf}").w4a8_mm for pf in PFS}
xs = {n: {id(l): torch.randn(n, l.w4_q.shape[1] * 32) for l in mods} for n in NS}
for n in NS:
    for l in mods[:8]:
        a = [ops[pf](xs[n][id(l)], l.w4_q, l.w4_scale, l.w4_offset) for pf in PFS]
        assert all(torch.equal(a[0], b) for b in a[1:])
def run(op, n):
    t0 = time.perf_counter()
    for l in mods: op(xs[n][id(l)], l.w4_q, l.w4_scale, l.w4_offset)
    return time.perf_counter() - t0
res = {(pf, n): [] for pf in PFS for n in NS}
for rep in range(REPS):
    for n in NS:
        order = PFS if rep % 2 == 0 else PFS[::-1]
        for pf in order:
            res[pf, n].append(run(ops[pf], n))
for pf in PFS:
    print(f"pf={pf:>6}: " + " ".join(f"{n}:{1e3*min(res[pf, n]):.2f}/{1e3*statistics.median(res[pf, n]):.2f}" for n in NS), flush=True)
