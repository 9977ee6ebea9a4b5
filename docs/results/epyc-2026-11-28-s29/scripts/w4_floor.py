# w4a8 at 1 and 8 rows: a weight that stays in cache (compute) vs weights streamed from DRAM (a pool of 64 MB).
import statistics, time, torch
from eaglespec.runtime import allocator, cpu_kernels, w4a8
assert cpu_kernels.available()
allocator.tune(); torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
def mk(n, k):
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    return w4a8.pack(q, torch.rand(n, k // 32, generator=g) * 0.01, torch.rand(n, k // 32, generator=g) * 0.01)
K, N = 576, 3072
hot = mk(N, K)                      # 0.9 MB of nibbles
cold = [mk(N, K) for _ in range(70)]  # ~70 MB: each read once a round
mm = torch.ops.eaglespec.w4a8_mm
res = {}
with torch.inference_mode():
    for r in range(12):
        for m in (1, 2, 4, 8):
            x = torch.randn(m, K, generator=g)
            t0 = time.perf_counter()
            for _ in range(70): mm(x, *hot)
            t1 = time.perf_counter()
            for w in cold: mm(x, *w)
            t2 = time.perf_counter()
            if r >= 2:
                res.setdefault((m, "hot"), []).append(t1 - t0); res.setdefault((m, "cold"), []).append(t2 - t1)
gt = 70 * (N // 16) * (K // 32)
for m in (1, 2, 4, 8):
    h, c = statistics.median(res[(m, "hot")]), statistics.median(res[(m, "cold")])
    print(f"rows {m}: hot {h*1e3:.3f} ms  cold {c*1e3:.3f} ms  hot cycles/group-tile/core @2.6GHz {h*2.6e9*2/gt:.1f}  "
          f"dpbusd/cycle/core {8*m*gt/(h*2.6e9*2):.2f}")
