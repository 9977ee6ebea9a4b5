# The cost of keeping the head's three feature layers in a batch-4 decode forward (300 tokens of context): forwards
# with hidden_indices=() and with (2, 16, 29) alternating, 800 each, the first 100 left out: python aux_keep.py
import statistics, time
import torch
from common import batch4_decode
_, forward = batch4_decode()
hi = (2, 16, 29)
T = {}
with torch.inference_mode():
    for it in range(800):
        for name, h in ((("aux", hi), ("none", ())) if it % 2 else (("none", ()), ("aux", hi))):
            t0 = time.perf_counter(); forward(h); T.setdefault(name, []).append(time.perf_counter() - t0)
for k, v in T.items(): print(k, f"median {statistics.median(v[100:])*1e6:.1f} us mean {statistics.mean(v[100:])*1e6:.1f}")
d = [a - b for a, b in zip(T["aux"][100:], T["none"][100:])]
print("paired median", statistics.median(d) * 1e6)
