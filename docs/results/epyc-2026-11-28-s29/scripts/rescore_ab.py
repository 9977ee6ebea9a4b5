# rescore_rows_ (one pass: top-k and the candidates' float32 dot products) against the torch form it replaces, in
# one process: full target forwards with logits at every position, batch 1 over 256 tokens of context, N = 1..8,
# arms alternating every round (medians of 40 rounds after 8); logits compared (argmax equal, max difference).
import statistics, time, torch
from common import target_with_context
from eaglespec.runtime import cpu_kernels, logits as L, model as model_mod
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
P = 256
m, cache, g = target_with_context(P)
new = model_mod.rescored_logits
def old(hidden, fast, weight, top=L.RESCORE_TOP):  # the torch form (before session 29)
    approx = fast(hidden).float()
    cand = L.topk_indices(approx, top)
    rows = weight[cand].float()
    exact = (hidden.float().unsqueeze(-2) * rows).sum(-1)
    return approx.scatter_(-1, cand, exact)
arms = {"torch": old, "kernel": new}
with torch.inference_mode():
    setups = {N: (torch.randint(0, 49152, (1, N), generator=g), torch.arange(P, P + N)[None]) for N in (1, 2, 4, 8)}
    for N, (t, p) in setups.items():
        outs = {}
        for name, f in arms.items():
            model_mod.rescored_logits = f
            outs[name] = m(t, p, cache, logits_at="all").logits
        print(f"N={N}: argmax equal {torch.equal(outs['torch'].argmax(-1), outs['kernel'].argmax(-1))}, "
              f"max |difference| {(outs['torch'] - outs['kernel']).abs().max().item():.2e}")
    ts = {}
    for r in range(48):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            model_mod.rescored_logits = arms[name]
            for N, (t, p) in setups.items():
                t0 = time.perf_counter()
                m(t, p, cache, logits_at="all").logits.argmax(-1).tolist()
                if r >= 8:
                    ts.setdefault((name, N), []).append(time.perf_counter() - t0)
print("| N | torch (ms) | kernel (ms) | saved (ms) |\n|---|---|---|---|")
for N in setups:
    a, b = (statistics.median(ts[(n, N)]) * 1e3 for n in arms)
    print(f"| {N} | {a:.3f} | {b:.3f} | {a - b:.3f} |")
for n in arms:
    print(f"{n}: forward(8) / forward(1) = {statistics.median(ts[(n, 8)]) / statistics.median(ts[(n, 1)]):.2f}, "
          f"forward(4) / forward(1) = {statistics.median(ts[(n, 4)]) / statistics.median(ts[(n, 1)]):.2f}")
