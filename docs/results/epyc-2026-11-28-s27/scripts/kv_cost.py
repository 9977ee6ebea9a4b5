# What a float16 KV cache saves (`--kv-dtype`), on the default int4 (w4a8) target, in one process, 2 threads:
#   python kv_cost.py
# 1. The attention kernel alone (eaglespec::row_attention), 30 layers of 9 query heads over 3 KV heads, keys and
#    values of random values in float32 and float16, alternating, medians of 55 rounds after 5 (the first
#    lines: the float16 result equals the float32 call on the same values, bit for bit).
# 2. Whole target forwards of N tokens (logits at every position, their argmax read back) after a prefix of
#    random tokens, both cache dtypes alternating, medians of 50 after 10.
import statistics, time

import torch

from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.kvcache import HostRows
from eaglespec.runtime.loading import load_target

allocator.tune()
torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
assert cpu_kernels.available(), cpu_kernels.unavailable_reason()
op = torch.ops.eaglespec.row_attention
torch.manual_seed(0)
for B, S, T in [(2, 77, 1), (3, 300, 5), (1, 40, 8)]:
    k, v, q = torch.randn(B, 3, S, 64).half(), torch.randn(B, 3, S, 64).half(), torch.randn(B, 9, T, 64)
    m = torch.rand(B, 1, T, S) > 0.3
    print(f"bit-identical B={B} S={S} T={T}:", torch.equal(op(q, k, v, m), op(q, k.float(), v.float(), m)))
print("\n1. row_attention, 30 layers (ms)\n| batch | context | queries | float32 | float16 | float32 / float16 |\n|---|---|---|---|---|---|")
for B, S, T in [(1, 256, 1), (1, 256, 8), (4, 200, 1), (4, 200, 2), (1, 1024, 1), (4, 1024, 1)]:
    data = {dt: (torch.randn(30, B, 3, S, 64).to(dt), torch.randn(30, B, 3, S, 64).to(dt)) for dt in (torch.float32, torch.float16)}
    q = torch.randn(B, 9, T, 64)
    ts = {dt: [] for dt in data}
    for r in range(60):
        for dt in (list(data) if r % 2 == 0 else list(data)[::-1]):
            k, v = data[dt]
            t0 = time.perf_counter()
            for i in range(30):
                op(q, k[i], v[i], None)
            if r >= 5:
                ts[dt].append(time.perf_counter() - t0)
    a, b = (statistics.median(ts[dt]) * 1e3 for dt in data)
    print(f"| {B} | {S} | {T} | {a:.3f} | {b:.3f} | {a / b:.2f}x |")

target = load_target(None)
m = target.model
g = torch.Generator().manual_seed(0)


def prefilled(B, P, dt):
    m.kv_dtype = dt
    cache = m.new_cache(B, P + 16)
    toks = torch.randint(0, m.args.vocab_size, (B, P), generator=g)
    m(toks, torch.arange(P).expand(B, P), cache, rows=torch.arange(B), prefill=True, logits_at=None)
    cache.advance(torch.arange(B), torch.full((B,), P))
    return cache


print("\n2. target forward of N tokens (ms)\n| batch | context | N | float32 cache | float16 cache | float32 / float16 |\n|---|---|---|---|---|---|")
with torch.inference_mode():
    for B, P, ns in ((1, 256, (1, 2, 4, 8)), (4, 200, (1, 2)), (1, 1024, (1, 2)), (4, 1024, (1,))):
        caches = {dt: prefilled(B, P, dt) for dt in (torch.float32, torch.float16)}
        for N in ns:
            ts = {dt: [] for dt in caches}
            for it in range(60):
                for dt in (list(caches) if it % 2 else list(caches)[::-1]):
                    tok = torch.randint(0, m.args.vocab_size, (B, N), generator=g)
                    t0 = time.perf_counter()
                    out = m(tok, (P + torch.arange(N)).expand(B, N), caches[dt], rows=torch.arange(B), logits_at="all",
                            host=HostRows(tuple(range(B)), (P,) * B, P + N))
                    out.logits.argmax(-1).tolist()
                    if it >= 10:
                        ts[dt].append(time.perf_counter() - t0)
            a, b = (statistics.median(ts[dt]) * 1e3 for dt in caches)
            print(f"| {B} | {P} | {N} | {a:.2f} | {b:.2f} | {a / b:.3f}x |")
