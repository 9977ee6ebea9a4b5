# Session 19's two bit-identical variants of the int4 x int8 tile loop (w4_chunk: from 5 rows a tile's rows summed
# in two chunks of at most 4 over the same unpacked weights; w4_il1: one integer chain a row from 5 rows), applied to
# the kernel as it is now, against it (w4_main: the source unchanged, built the same way), in one process:
#   python w4_variants.py [ROUNDS]
# The model's 121 packed linears (30 layers' qkv / o / gate-up / down and the lm_head; random int4 weights, seeded)
# at 1-8 rows, every variant in turn each round (order reversed every other round), medians after 2 rounds;
# outputs asserted equal to w4_main's at every row count.
import ast, statistics, sys, time
from pathlib import Path

import torch

from common import build, replace_once, source
from eaglespec.runtime import allocator, cpu_kernels, w4a8

# The loop and both variants as session 19 wrote them (its variants.py, read as data: running it writes files).
S19 = Path(__file__).resolve().parents[2] / "epyc-2026-11-27-s19" / "scripts" / "variants.py"
CONST = {t.id: ast.literal_eval(node.value) for node in ast.parse(S19.read_text()).body
         if isinstance(node, ast.Assign) for t in node.targets if t.id in ("SUMS", "VARIANTS")}
SUMS, CHUNK, IL1 = CONST["SUMS"], CONST["VARIANTS"]["w4_chunk"], CONST["VARIANTS"]["w4_il1"]
allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__, "| 2 threads")
src = source("w4a8.cpp")
ops = {"w4_main": build("w4_main", src).w4a8_mm, "w4_chunk": build("w4_chunk", replace_once(src, SUMS, CHUNK)).w4a8_mm,
       "w4_il1": build("w4_il1", replace_once(src, SUMS, IL1)).w4a8_mm}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
g = torch.Generator().manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
ws = []
for n, k in shapes:
    sc = torch.rand(n, k // 32, generator=g) * 0.02
    ws.append(w4a8.pack(torch.randint(0, 16, (n, k), generator=g), sc, -8 * sc))
res: dict = {}
ROWS = (1, 2, 4, 5, 6, 7, 8)
for rows in ROWS:
    xs = [torch.randn(rows, k, generator=g) for _, k in shapes]
    ref = [ops["w4_main"](x, *w) for x, w in zip(xs, ws)]
    for name, op in ops.items():
        assert all(torch.equal(a, op(x, *w)) for a, x, w in zip(ref, xs, ws)), (name, rows)
    for r in range(rounds):
        for name, op in (list(ops.items()) if r % 2 == 0 else list(ops.items())[::-1]):
            t0 = time.perf_counter()
            for x, w in zip(xs, ws):
                op(x, *w)
            res.setdefault((rows, name), []).append(time.perf_counter() - t0)
print(f"outputs identical at every row count; ms for the 121 linears, medians of {rounds - 2} rounds")
print("rows | " + " | ".join(ops) + " | chunk / main | il1 / main")
for rows in ROWS:
    m = {n: statistics.median(res[(rows, n)][2:]) * 1e3 for n in ops}
    print(rows, *(f"{m[n]:.3f}" for n in ops), f"{m['w4_chunk'] / m['w4_main']:.3f}", f"{m['w4_il1'] / m['w4_main']:.3f}",
          sep=" | ")
