import statistics, time, torch
from eaglespec.runtime import allocator, cpu_kernels, logits as L
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
m = load_target(None).model
W = m.lm_head_weight; print("lm_head weight", W.dtype, tuple(W.shape), type(m.lm_head_packed).__name__)
g = torch.Generator().manual_seed(0)
res = {}
with torch.inference_mode():
  for r in range(40):
    for N in (1, 8):
        h = torch.randn(1, N, 576, generator=g)
        T = {}
        t0 = time.perf_counter(); approx = m.lm_head_packed(h, False).float(); T["fast"] = time.perf_counter() - t0
        t0 = time.perf_counter(); cand = L.topk_indices(approx, 32); T["topk"] = time.perf_counter() - t0
        t0 = time.perf_counter(); rows = W[cand].float(); T["gather"] = time.perf_counter() - t0
        t0 = time.perf_counter(); ex = (h.float().unsqueeze(-2) * rows).sum(-1); T["dot"] = time.perf_counter() - t0
        t0 = time.perf_counter(); approx.scatter_(-1, cand, ex); T["scatter"] = time.perf_counter() - t0
        t0 = time.perf_counter(); L.argmax(approx).tolist(); T["argmax"] = time.perf_counter() - t0
        t0 = time.perf_counter(); m.output_logits(h); T["output_logits"] = time.perf_counter() - t0
        if r >= 5:
            for k, v in T.items(): res.setdefault((N, k), []).append(v)
for k, v in res.items(): print(k, f"{statistics.median(v)*1e3:.3f} ms")
