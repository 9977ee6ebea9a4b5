# Two ideas for eaglespec::row_attention, measured before building either (python attn_variants.py):
#   v1  the scores' horizontal sums (sum16: 15 adds and 30 shuffles per 16 slots and query head) replaced by a
#       vertical add tree of the same 15 adds and no shuffle: what keys stored transposed per 16-slot block could
#       save at most (its results are wrong; only its time is read)
#   v2  a decode step at batch 1 (3 KV heads, 3 jobs on 2 threads: one thread takes two) split into one job per
#       query head when there are fewer jobs than twice the threads (results checked bit-identical to v0)
# Each is the repository's kernel source with a renamed namespace and op library (xattn1, xattn2; v0 = the source
# unchanged, built the same way), built with the flags of eaglespec/runtime/cpu_kernels.py. Timing as
# docs/results/epyc-2026-11-28-s29/scripts/attn_cost.py: 9 query heads over 3 KV heads of 64, a float16 cache of
# 256 slots of context plus the N causal new tokens, 30 calls a round, the arms in turn within each round, medians
# of 40 rounds after 5.
import statistics, time

import torch

from common import build, replace_once, source
from eaglespec.runtime import allocator, cpu_kernels

SRC = source("row_attention.cpp")


def v1(s: str) -> str:
    return replace_once(s, "const __m512 sc = sum16(acc);", """__m512 t8[8];
    for (int i = 0; i < 8; ++i) t8[i] = _mm512_add_ps(acc[2 * i], acc[2 * i + 1]);
    for (int i = 0; i < 4; ++i) t8[i] = _mm512_add_ps(t8[2 * i], t8[2 * i + 1]);
    const __m512 sc = _mm512_add_ps(_mm512_add_ps(t8[0], t8[1]), _mm512_add_ps(t8[2], t8[3]));""")


def v2(s: str) -> str:
    for old, new in [
        ("int64_t h, t, d, hkv, s, s_pad, qs0,", "int64_t h, t, d, hkv, hsplit, hfull, s, s_pad, qs0,"),
        ("  const int64_t bi = job / (a.hkv * chunks), kvh = (job / chunks) % a.hkv, t0 = (job % chunks) * a.per_job;",
         "  const int64_t bi = job / (a.hkv * a.hsplit * chunks), kvh = (job / (chunks * a.hsplit)) % a.hkv;\n"
         "  const int64_t hsub = (job / chunks) % a.hsplit, t0 = (job % chunks) * a.per_job;\n"
         "  const int64_t h0 = kvh * a.hfull + hsub * group;"),
        ("(kvh * group + g) * a.qs1", "(h0 + g) * a.qs1"),
        ("* a.h + kvh * group + g) * a.d", "* a.h + h0 + g) * a.d"),
        ("  const int64_t chunks = (t + a.per_job - 1) / a.per_job;\n  const JobFn",
         "  const int64_t chunks = (t + a.per_job - 1) / a.per_job;\n  a.hfull = group;\n"
         "  a.hsplit = pairs * chunks < want ? group : 1;\n  const int64_t gj = group / a.hsplit;\n  const JobFn"),
        ("pick_job<uint16_t>(nv, group) : pick_job<float>(nv, group)", "pick_job<uint16_t>(nv, gj) : pick_job<float>(nv, gj)"),
        ("at::parallel_for(0, pairs * chunks, 1,", "at::parallel_for(0, pairs * a.hsplit * chunks, 1,"),
        ("job(a, i, nv, group, w);", "job(a, i, nv, gj, w);"),
    ]:
        s = replace_once(s, old, new)
    return s


allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__, "| 2 threads")
ops = {"v0": build("xattn0", SRC).row_attention, "v1": build("xattn1", v1(SRC)).row_attention,
       "v2": build("xattn2", v2(SRC)).row_attention}
g = torch.Generator().manual_seed(1)
for B, H, Hkv, N, S in [(1, 9, 3, 1, 264), (1, 9, 3, 8, 264), (2, 9, 3, 1, 100), (1, 8, 2, 1, 50), (1, 9, 3, 3, 40)]:
    k, v = (torch.randn(B, Hkv, S, 64, generator=g).half() for _ in range(2))
    q = torch.randn(B, H, N, 64, generator=g)
    assert torch.equal(ops["v0"](q, k, v, None), ops["v2"](q, k, v, None)), (B, H, Hkv, N, S)
print("v2 bit-identical to v0 on 5 shapes")
S = 264
k, v = (torch.randn(1, 3, S, 64, generator=g).half() for _ in range(2))
res: dict = {}
for r in range(45):
    for N in (1, 2, 4, 8):
        q = torch.randn(1, 9, N, 64, generator=g)
        mask = torch.ones(1, 1, N, S, dtype=torch.bool); mask[..., 256 + N:] = False
        mask[0, 0, :, 256:256 + N] = torch.ones(N, N, dtype=torch.bool).tril()
        for name, op in ops.items():
            t0 = time.perf_counter()
            for _ in range(30):
                op(q, k, v, mask)
            if r >= 5:
                res.setdefault((N, name), []).append(time.perf_counter() - t0)
print("N | v0 (as shipped) | v1 (no shuffles: bound) | v2 (heads split) | ms for 30 layers")
for N in (1, 2, 4, 8):
    print(N, *(f"{statistics.median(res[(N, n)]) * 1e3:.3f}" for n in ops), sep=" | ")
