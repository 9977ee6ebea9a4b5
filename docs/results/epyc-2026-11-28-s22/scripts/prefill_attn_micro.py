# One layer's prefill attention (T tokens from an empty cache, 9 query heads over 3 kv heads, head dim 64): as
# prompt forwards run it now (float64 flash, rounded to float32), eaglespec::row_attention (float32, each query
# alone), float32 flash; median of 5 after a warm-up (ms), and the largest difference from the float64 result.
import statistics, sys, time, torch
import torch.nn.functional as F
from eaglespec.runtime import cpu_kernels, model as M
torch.set_num_threads(2)
assert cpu_kernels.available()
T = int(sys.argv[1])
q = torch.randn(1, T, 9, 64); k = torch.randn(1, 3, T, 64); v = torch.randn(1, 3, T, 64)
def tm(f):
    f(); ts = []
    for _ in range(5):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return statistics.median(ts) * 1e3
with torch.inference_mode():
    arms = {"float64 flash (now)": lambda: M.attention(q, k, v, None, True, torch.float64),
            "row_attention": lambda: M.attention(q, k, v, None, True, None, exact_rows=True),
            "float32 flash": lambda: M.attention(q, k, v, None, True, None)}
    ref = arms["float64 flash (now)"]()
    for name, f in arms.items():
        print(f"T={T} {name:22s} {tm(f):8.2f} ms  max |diff| {(f() - ref).abs().max().item():.2e}")
