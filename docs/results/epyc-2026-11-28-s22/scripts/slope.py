# verify(1, n) at several prefixes, timed in interleaved rounds (one cache per prefix), min over rounds.
import time, torch
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"))
t = load_target(); m = t.model; dev = m.device
P = (16, 128, 320, 512); N = (1, 2, 8)
fw = {}
with torch.inference_mode():
    for b in (1, 4):
        for p in P:
            cache = m.new_cache(b, p + 40); rows = torch.arange(b)
            toks = torch.randint(0, m.args.vocab_size, (b, p))
            m(toks, torch.arange(p).expand(b, -1), cache, rows=rows, prefill=True)
            cache.advance(rows, torch.full((b,), p))
            for n in N:
                tk = torch.randint(0, m.args.vocab_size, (b, n)); pos = (p + torch.arange(n)).expand(b, -1)
                mask = torch.tril(torch.ones(n, n, dtype=torch.bool)).expand(b, n, n) if n > 1 else None
                fw[(b, p, n)] = (lambda tk=tk, pos=pos, cache=cache, rows=rows, mask=mask:
                                 m(tk, pos, cache, rows=rows, block_mask=mask, logits_at="all"))
    best = {k: 1e9 for k in fw}
    for r in range(15):
        for k, f in fw.items():
            a = time.perf_counter(); f(); best[k] = min(best[k], time.perf_counter() - a)
for b in (1, 4):
    for n in N:
        print(f"b{b} n{n}: " + "  ".join(f"p{p} {best[(b, p, n)] * 1e3:.2f}" for p in P))
