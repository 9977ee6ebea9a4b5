# medians of verify(b, N) forwards (256-token prefix, logits for all) in one process: N=1 and 8 at b1, N=1, 2 at b4
import statistics, sys, time, torch
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
t = load_target(); m = t.model
P = 256
out = []
with torch.inference_mode():
    for b, ns in ((1, (1, 8)), (4, (1, 2))):
        cache = m.new_cache(b, P + 9); rows = torch.arange(b)
        m(torch.randint(0, 49152, (b, P)), torch.arange(P).expand(b, -1), cache, rows=rows, prefill=True)
        cache.advance(rows, torch.full((b,), P))
        res = {}
        arms = {}
        for n in ns:
            toks = torch.randint(0, 49152, (b, n)); pos = (P + torch.arange(n)).expand(b, -1)
            mask = None if n == 1 else torch.tril(torch.ones(n, n, dtype=torch.bool)).expand(b, n, n)
            arms[n] = (lambda toks=toks, pos=pos, mask=mask: m(toks, pos, cache, rows=rows, block_mask=mask, logits_at="all"))
        for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 100):
            for n, f in arms.items():
                a = time.perf_counter(); f(); res.setdefault(n, []).append(time.perf_counter() - a)
        out += [f"b{b} N={n} {statistics.median(v[5:])*1e3:.2f}" for n, v in res.items()]
print(sys.argv[2] if len(sys.argv) > 2 else "", " | ".join(out))
