# What the one-call decoder layer saves by (1) reading q through its strides instead of copying the transposed
# projection, and (2) adding the residual inside the int4 matmul (w4a8_mm_add) instead of a separate add, each
# timed against the form it replaces in one process (both forms are still callable), 2 threads, arms
# alternating, medians of 60 rounds after 10:   python fuse_ab.py
# Shapes are the default model's (9 query heads over 3 KV heads of 64, hidden 576, MLP 1536, 30 layers);
# attention over a float16 cache of 256 slots (batch 1) or 200 (batch 4); random int4 weights.
import statistics, time

import torch

from eaglespec.runtime import allocator, cpu_kernels, w4a8

allocator.tune()
torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
assert cpu_kernels.available(), cpu_kernels.unavailable_reason()
ops = torch.ops.eaglespec
g = torch.Generator().manual_seed(0)


def ab(arms, rounds=70, warm=10):
    ts = {name: [] for name in arms}
    for r in range(rounds):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            t0 = time.perf_counter()
            arms[name]()
            if r >= warm:
                ts[name].append(time.perf_counter() - t0)
    return [statistics.median(ts[name]) * 1e3 for name in arms]


print("\n1. row_attention of the projection's q view, 30 layers (ms)\n"
      "| batch | queries | context | q copied | q in place | saved |\n|---|---|---|---|---|---|")
for B, T, S in [(1, 1, 256), (1, 2, 256), (1, 4, 256), (1, 8, 256), (4, 1, 200), (4, 2, 200)]:
    k = [torch.randn(B, 3, S, 64, generator=g).half() for _ in range(30)]
    v = [torch.randn(B, 3, S, 64, generator=g).half() for _ in range(30)]
    qkv = torch.randn(B, T, 15, 64, generator=g)  # q, k, v heads of one projection, as layer_step views it
    view = qkv.narrow(2, 0, 9).transpose(1, 2)
    assert torch.equal(ops.row_attention(view, k[0], v[0], None), ops.row_attention(view.contiguous(), k[0], v[0], None))
    a, b = ab({"copy": lambda: [ops.row_attention(view.contiguous(), k[i], v[i], None) for i in range(30)],
               "view": lambda: [ops.row_attention(view, k[i], v[i], None) for i in range(30)]})
    print(f"| {B} | {T} | {S} | {a:.3f} | {b:.3f} | {a - b:.3f} |")

print("\n2. the two residual adds of 30 layers (o_proj 576 -> 576, down 1536 -> 576) (ms)\n"
      "| rows | matmul, then add | matmul_add | saved |\n|---|---|---|---|")
weights = []
for _ in range(30):
    for k_in in (576, 1536):
        q = torch.randint(0, 16, (576, k_in), generator=g)
        scale = (torch.rand(576, k_in // 32, generator=g) * 0.02 + 1e-3).half().float()
        weights.append(w4a8.pack(q, scale, -8 * scale))
for rows in (1, 2, 4, 8, 16):
    xs = [torch.randn(rows, w[0].shape[1] * 32, generator=g) for w in weights]
    res = torch.randn(rows, 576, generator=g)
    assert torch.equal(res + ops.w4a8_mm(xs[0], *weights[0]), ops.w4a8_mm_add(xs[0], *weights[0], res))
    a, b = ab({"add": lambda: [res + ops.w4a8_mm(x, *w) for x, w in zip(xs, weights)],
               "fused": lambda: [ops.w4a8_mm_add(x, *w, res) for x, w in zip(xs, weights)]})
    print(f"| {rows} | {a:.3f} | {b:.3f} | {a - b:.3f} |")
