# Where verify(1, N) goes on this CPU: the whole forward (logits at every token, 128-token prefix) against its
# parts: the 121 packed linears alone (w4a8_mm on the model's own weights), the lm_head + rescoring, attention.
import statistics, sys, time, torch
from eaglespec.runtime.loading import load_target
from eaglespec.runtime.quant import PackedLinear
torch.set_num_threads(2)
t = load_target(None)
m = t.model
lins = [mod for mod in m.modules() if isinstance(mod, PackedLinear)]
print("packed linears", len(lins), "lm_head packed", m.lm_head_packed is not None)
P = 128
cache = m.new_cache(1, P + 16)
ids = torch.randint(0, 49152, (1, P + 8))
with torch.inference_mode():
    m(ids[:, :P], torch.arange(P)[None], cache, prefill=True)
    cache.lengths[0] = P
def med(fn, reps=40):
    for _ in range(3): fn()
    v = []
    for _ in range(reps):
        a = time.perf_counter(); fn(); v.append(time.perf_counter() - a)
    return statistics.median(v) * 1e3
res = {}
with torch.inference_mode():
    for rnd in range(3):
        for n in (1, 2, 4, 8):
            fwd = lambda: m(ids[:, P:P + n], torch.arange(P, P + n)[None], cache, logits_at="all")
            xs = [torch.randn(n, l.in_features) for l in lins]
            linf = lambda: [l(x) for l, x in zip(lins, xs)]
            h = torch.randn(1, n, 576)
            lmh = lambda: m.output_logits(h)
            res.setdefault(("fwd", n), []).append(med(fwd))
            res.setdefault(("linears", n), []).append(med(linf))
            res.setdefault(("lm_head+rescore", n), []).append(med(lmh))
for k in ("fwd", "linears", "lm_head+rescore"):
    print(k.ljust(16), "  ".join(f"N={n} {statistics.median(res[(k, n)]):6.2f}" for n in (1, 2, 4, 8)))
