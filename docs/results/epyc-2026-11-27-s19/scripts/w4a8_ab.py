# (Session 15's script; rows 1/4/5/6/8 here.) The model's 121 packed linears (30 layers' qkv/o/gate-up/down +
# lm_head, random int4) with w4a8 builds given as torch.ops namespaces: "eaglespec" = the project's own, w4_chunk
# and w4_il1 = this folder's variants (variants.py writes NAME.cpp, build.py builds it), alternating per round;
# outputs asserted equal.
# Usage: w4a8_ab.py ROUNDS NAME[,NAME...]
import statistics, sys, time, torch
sys.path.insert(0, __import__("os").path.dirname(__file__))
from build import build
from eaglespec.runtime import cpu_kernels, w4a8
assert cpu_kernels.available()
names = sys.argv[2].split(",")
for n in names:
    if n != "eaglespec":
        build(n)
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
ws = []
for n, k in shapes:
    q = torch.randint(0, 16, (n, k), generator=g)
    sc = torch.rand(n, k // 32, generator=g) * 0.02
    off = -8 * sc
    ws.append(w4a8.pack(q, sc, off))
res = {}
for rows in (1, 4, 5, 6, 8):
    xs = [torch.randn(rows, k, generator=g) for _, k in shapes]
    outs = {}
    for n in names:
        op = getattr(torch.ops, n).w4a8_mm
        outs[n] = [op(x, *w) for x, w in zip(xs, ws)]
    for n in names[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[names[0]], outs[n])), n
    for r in range(int(sys.argv[1])):
        for n in (names if r % 2 == 0 else names[::-1]):
            op = getattr(torch.ops, n).w4a8_mm
            a = time.perf_counter()
            for x, w in zip(xs, ws):
                op(x, *w)
            res.setdefault((rows, n), []).append(time.perf_counter() - a)
for (rows, n), v in res.items():
    print(f"rows {rows} {n:10s} {statistics.median(v[2:]) * 1e3:.2f} ms")
