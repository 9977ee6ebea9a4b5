# Where verify(N) goes: full forward vs layers only vs logits vs the layers' matmuls alone, batch 1, 256 context.
import statistics, time
import torch
from common import target_with_context
from eaglespec.runtime import cpu_kernels
print("cpu:", cpu_kernels.cpuinfo("model name"))
P = 256
m, cache, g = target_with_context(P)
mm = torch.ops.eaglespec.w4a8_mm
trip = []
for st in m.layer_steps:
    an, mn, wqkv, bqkv, wo, bo, w13, b13, w2, b2 = st
    trip += [wqkv, wo, w13, w2]
xs = {}
def mats(N):
    for (wq, sc, ze) in trip:
        k = wq.shape[1] * 32
        x = xs.get((N, k))
        if x is None:
            x = xs[(N, k)] = torch.randn(N, k, generator=g)
        mm(x, wq, sc, ze)
lm = m.lm_head_packed
def run(N):
    toks = torch.randint(0, 49152, (1, N), generator=g); pos = torch.arange(P, P + N)[None]
    h = torch.randn(1, N, 576, generator=g)
    return {
        "forward+logits": lambda: m(toks, pos, cache, logits_at="all").logits.argmax(-1).tolist(),
        "forward (no logits)": lambda: m(toks, pos, cache).hidden.sum().item(),
        "output_logits": lambda: m.output_logits(h).argmax(-1).tolist(),
        "lm_head fast only": lambda: lm(h, False).sum().item(),
        "layer matmuls": lambda: mats(N),
    }
res = {}
with torch.inference_mode():
    fns = {N: run(N) for N in (1, 2, 4, 8)}
    for r in range(30):
        for N, d in fns.items():
            for name, f in d.items():
                t0 = time.perf_counter(); f(); dt = time.perf_counter() - t0
                if r >= 5: res.setdefault((N, name), []).append(dt)
names = list(fns[1])
print("| N | " + " | ".join(names) + " |")
for N in fns:
    print(f"| {N} | " + " | ".join(f"{statistics.median(res[(N, n)])*1e3:.3f}" for n in names) + " |")
