# torch.profiler self time per op of a 1-token and an 8-token forward (256-token prefix), and the difference. Usage: prof2.py [BATCH]
import statistics, time, torch, sys
from torch.profiler import profile, ProfilerActivity
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
t = load_target(); m = t.model
P = 256
tot = {}
with torch.inference_mode():
    b = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    cache = m.new_cache(b, P + 9); rows = torch.arange(b)
    m(torch.randint(0, 49152, (b, P)), torch.arange(P).expand(b, -1), cache, rows=rows, prefill=True)
    cache.advance(rows, torch.full((b,), P))
    arms = {}
    for n in (1, 8):
        toks = torch.randint(0, 49152, (b, n)); pos = (P + torch.arange(n)).expand(b, -1)
        mask = None if n == 1 else torch.tril(torch.ones(n, n, dtype=torch.bool)).expand(b, n, n)
        arms[n] = (lambda toks=toks, pos=pos, mask=mask: m(toks, pos, cache, rows=rows, block_mask=mask, logits_at="all"))
    for i in range(10):
        for f in arms.values(): f()
    for n, f in arms.items():
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(30): f()
        tot[n] = {e.key: e.self_cpu_time_total / 30 for e in p.key_averages()}
keys = sorted(set(tot[1]) | set(tot[8]), key=lambda k: -(tot[8].get(k, 0) - tot[1].get(k, 0)))
print(f"{'op':32s} {'N=1 us':>9s} {'N=8 us':>9s} {'diff':>9s}")
for k in keys[:20]:
    print(f"{k:32s} {tot[1].get(k,0):9.0f} {tot[8].get(k,0):9.0f} {tot[8].get(k,0)-tot[1].get(k,0):9.0f}")
print(f"{'TOTAL':32s} {sum(tot[1].values()):9.0f} {sum(tot[8].values()):9.0f}")
