import statistics, time, torch
from eaglespec.runtime import allocator, cpu_kernels
assert cpu_kernels.available()
allocator.tune(); torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
S = 264
k = torch.randn(1, 3, S, 64, generator=g).half(); v = torch.randn(1, 3, S, 64, generator=g).half()
res = {}
for r in range(40):
    for N in (1, 2, 4, 8):
        q = torch.randn(1, 9, N, 64, generator=g)
        mask = torch.ones(1, 1, N, S, dtype=torch.bool); mask[..., 256 + N:] = False
        mask[0, 0, :, 256:256 + N] = torch.ones(N, N, dtype=torch.bool).tril()
        t0 = time.perf_counter()
        for _ in range(30): torch.ops.eaglespec.row_attention(q, k, v, mask)
        if r >= 5: res.setdefault(N, []).append(time.perf_counter() - t0)
for N, ts in res.items(): print(N, f"{statistics.median(ts)*1e3:.3f} ms for 30 layers")
