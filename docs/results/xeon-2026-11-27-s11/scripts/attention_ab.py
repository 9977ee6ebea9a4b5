import time, statistics, torch
from torch.utils.cpp_extension import load
torch.set_num_threads(2)
F = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]
for n in ("old", "new"):
    load(name=f"ra{n}", sources=[f"/work/runs/s11/ra/{n}.cpp"], extra_cflags=F, extra_ldflags=["-fopenmp"], is_python_module=False)
old, new = torch.ops.raold.row_attention, torch.ops.ranew.row_attention
g = torch.Generator().manual_seed(0)
# identity over shapes, masks, strides, the generic path
for (B, H, HKV, D, T, S) in [(1, 9, 3, 64, 1, 37), (2, 9, 3, 64, 5, 100), (3, 8, 2, 128, 4, 70), (1, 12, 1, 64, 3, 50), (2, 20, 2, 64, 2, 33), (1, 4, 4, 32, 3, 17), (1, 9, 3, 64, 8, 264)]:
    q = torch.randn(B, H, T, D, generator=g); kc = torch.randn(B, HKV, S + 9, D, generator=g)[:, :, 3:S + 3]; vc = torch.randn(B, HKV, S, D, generator=g)
    for mask in (None, torch.rand(B, 1, T, S, generator=g) > 0.3):
        a, b = old(q, kc, vc, mask), new(q, kc, vc, mask)
        assert torch.equal(a, b), (B, H, HKV, D, T, S)
print("bit-identical", flush=True)
L = 30
for S in (256, 512):
    for T in (1, 2, 4, 8):
        q = torch.randn(1, 9, T, 64); k = torch.randn(1, 3, S + T, 64); v = torch.randn(1, 3, S + T, 64)
        mask = torch.ones(1, 1, T, S + T, dtype=torch.bool)
        ts = {"old": [], "new": []}
        for r in range(30):
            for name, op in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
                t0 = time.perf_counter()
                for _ in range(L): op(q, k, v, mask)
                ts[name].append(time.perf_counter() - t0)
        print(f"S={S} T={T} 30 layers: old {1e3*statistics.median(ts['old']):.3f} new {1e3*statistics.median(ts['new']):.3f} ms", flush=True)
