# The cost of keeping the head's three feature layers in a batch-4 decode forward (300 tokens of context): forwards
# with hidden_indices=() and with (2, 16, 29) alternating, 800 each, the first 100 left out: python aux_keep.py
import statistics, time, sys
import torch
from eaglespec.runtime import allocator
from eaglespec.runtime.kvcache import HostRows
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
m = load_target(None).model
B, ctx = 4, 300
g = torch.Generator().manual_seed(0)
cache = m.new_cache(B, 8192)
with torch.inference_mode():
    m(torch.randint(0, 1000, (B, ctx), generator=g), torch.arange(ctx).expand(B, ctx), cache, prefill=True)
cache.lengths[:] = ctx
hi = (2, 16, 29)
rows = torch.arange(B)
tok = torch.full((B, 1), 5); pos = torch.full((B, 1), ctx)
T = {}
host = HostRows(tuple(range(B)), (ctx,) * B, ctx)
with torch.inference_mode():
    for it in range(800):
        for name, h in ((("aux", hi), ("none", ())) if it % 2 else (("none", ()), ("aux", hi))):
            t0 = time.perf_counter(); m(tok, pos, cache, rows=rows, logits_at="all", hidden_indices=h, host=host); T.setdefault(name, []).append(time.perf_counter() - t0)
for k, v in T.items(): print(k, f"median {statistics.median(v[100:])*1e6:.1f} us mean {statistics.mean(v[100:])*1e6:.1f}")
d = [a - b for a, b in zip(T["aux"][100:], T["none"][100:])]
print("paired median", statistics.median(d) * 1e6)
