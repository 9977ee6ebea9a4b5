# Compiled verify forwards at batch 1: 1 and 2 tokens with the dynamic-T graph, then 2 tokens with T marked static
# (a graph specialized for 2 tokens), alternating; medians (ms). Usage: R
import sys, statistics, time, torch
import eaglespec.runtime.compiled as C
from eaglespec.runtime.loading import load_target
import eaglespec.runtime.logits as L
torch.set_num_threads(2)
R = int(sys.argv[1]) if len(sys.argv) > 1 else 40
t = load_target(compile=True); m = t.model
orig = C.CompiledStep.__call__
static = {"on": False}
def call(self, tokens, positions, cache, **kw):
    if static["on"]:
        torch._dynamo.mark_static(tokens, 1)
    return orig(self, tokens, positions, cache, **kw)
C.CompiledStep.__call__ = call
res = {}
with torch.inference_mode():
    b = 1
    cache = m.new_cache(b, 300); rows = torch.arange(b)
    m(torch.randint(0, 49152, (b, 128)), torch.arange(128).expand(b, -1), cache, rows=rows, prefill=True)
    cache.advance(rows, torch.full((b,), 128))
    def fwd(n):
        toks = torch.randint(0, 49152, (b, n)); pos = (128 + torch.arange(n)).expand(b, -1)
        mask = torch.tril(torch.ones(n, n, dtype=torch.bool)).expand(b, n, n) if n > 1 else None
        return L.argmax(m(toks, pos, cache, rows=rows, block_mask=mask, logits_at="all").logits)
    arms = {"n1": (1, False), "n2 dynamic": (2, False), "n2 static": (2, True)}
    for name, (n, st) in arms.items():
        static["on"] = st; t0 = time.perf_counter(); fwd(n); fwd(n); print(name, "first calls %.1f s" % (time.perf_counter() - t0), flush=True)
    for i in range(R):
        for name, (n, st) in arms.items():
            static["on"] = st
            a = time.perf_counter(); fwd(n); res.setdefault(name, []).append(time.perf_counter() - a)
for k, v in res.items(): print(f"{k:12s} {statistics.median(v)*1e3:.2f} ms")
