# silu_mul of [rows, 1536] halves: le_g16 (variants.py: split from 17 rows, as before) against the project build
# (from 5 rows); same values asserted. Run variants.py first.
import sys, statistics, time, torch
sys.path.insert(0, __import__("os").path.dirname(__file__))
from build import build
build("le_g16")
from eaglespec.runtime import cpu_kernels
assert cpu_kernels.available()
torch.set_num_threads(2)
res = {}
for rows in (1, 4, 8, 16):
    x = torch.randn(rows, 2 * 1536)
    g, u = x[:, :1536], x[:, 1536:]
    assert torch.equal(torch.ops.eaglespec.silu_mul(g, u), torch.ops.le_g16.silu_mul(g, u))
    for i in range(300):
        for name, op in (("grain16", torch.ops.le_g16.silu_mul), ("grain4", torch.ops.eaglespec.silu_mul)):
            a = time.perf_counter(); op(g, u); res.setdefault((rows, name), []).append(time.perf_counter() - a)
for k, v in res.items(): print(k, f"{statistics.median(v[20:])*1e6:.1f} us")
