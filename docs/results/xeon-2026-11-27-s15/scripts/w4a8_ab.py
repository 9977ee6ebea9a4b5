# The model's 121 packed linears (30 layers' qkv/o/gate-up/down + lm_head, random int4) at 1/2/4/8 rows with
# w4a8 builds given as torch.ops namespaces (variants.py writes them: w4_old = the session's starting kernel, w4_acc2 = two integer
# accumulators a row; "eaglespec" = the project's own), alternating per round; outputs asserted equal.
# Usage: w4a8_ab.py ROUNDS NAME[,NAME...]
# (Session 19 ran it with ROWS=1,4,5,6,8 and VARIANTS_DIR=docs/results/epyc-2026-11-27-s19/scripts, the folder its
# variants.py writes NAME.cpp into; both default to what session 15 ran.)
import os, statistics, sys, time, torch
sys.path.insert(0, os.path.dirname(__file__))
from build import HERE, build
from eaglespec.runtime import cpu_kernels, w4a8
assert cpu_kernels.available()
names = sys.argv[2].split(",")
ROWS = [int(r) for r in os.environ.get("ROWS", "1,2,4,8").split(",")]
for n in names:
    if n != "eaglespec":
        build(n, os.environ.get("VARIANTS_DIR", HERE))
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
for rows in ROWS:
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
