# row_attention micro: 30 layers' K/V (256-slot prefix + 8), T = 1/2/4/8 queries, builds compared alternating.
# Usage: micro2.py THREADS ra_v0,eaglespec [PREFIX]   (ra_v0 = the kernel before session 15)
import statistics, time, torch, sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from build import build
names = sys.argv[2].split(",")
for n in names:
    if n != "eaglespec":  # the project's own build
        build(n)
from eaglespec.runtime import cpu_kernels
assert cpu_kernels.available()
torch.set_num_threads(int(sys.argv[1]))
S0 = int(sys.argv[3]) if len(sys.argv) > 3 else 256
B, H, Hkv, D = 1, 9, 3, 64
S = S0 + 8
L = 30
g = torch.Generator().manual_seed(0)
ks = [torch.randn(B, Hkv, S, D, generator=g) for _ in range(L)]
vs = [torch.randn(B, Hkv, S, D, generator=g) for _ in range(L)]
res = {}
for T in (1, 2, 4, 8):
    q = torch.randn(B, T, H, D, generator=g).transpose(1, 2)
    mask = torch.ones(B, 1, T, S, dtype=torch.bool)
    mask[..., S0:] = False
    mask[0, 0, :, S0:S0 + T] = torch.tril(torch.ones(T, T, dtype=torch.bool))
    res[T] = (q, mask)
# identity across T: query i of T=8 must equal the same query decoded alone with its own mask
q8, m8 = res[8]
for n in names:
    op = getattr(torch.ops, n).row_attention
    full = op(q8, ks[0], vs[0], m8)
    for i in range(8):
        one = op(q8[:, :, i:i+1].contiguous(), ks[0], vs[0], m8[:, :, i:i+1])
        assert torch.equal(one[:, 0], full[:, i]), (n, i)
    ref = torch.nn.functional.scaled_dot_product_attention(q8.double(), ks[0].double().repeat_interleave(3, 1), vs[0].double().repeat_interleave(3, 1), attn_mask=m8).transpose(1, 2)
    print(n, "max err vs f64", (full.double() - ref).abs().max().item())
times = {}
for r in range(40):
    for n in names:
        op = getattr(torch.ops, n).row_attention
        for T, (q, mask) in res.items():
            a = time.perf_counter()
            for l in range(L):
                op(q, ks[l], vs[l], mask)
            times.setdefault((n, T), []).append(time.perf_counter() - a)
for (n, T), v in times.items():
    m = statistics.median(v[3:]) / L * 1e6
    print(f"{n} T={T}: {m:.1f} us/call, {m / T:.1f} us/query, {m*1e3/T/H/S0:.2f} ns/head-slot")
