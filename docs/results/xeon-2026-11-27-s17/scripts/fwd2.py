# b1, 256-token prefix: N=1 plain (logits last) vs N=2 with aux (hidden_indices) logits all; medians, alternating. Usage: fwd2.py REPS
import statistics, sys, time, torch
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
t = load_target(); m = t.model
from eaglespec.spec.speculative import DraftOptions, build_proposer
p = build_proposer(t, DraftOptions(tree="chain", depth=1))
hid = p.head.hidden_indices
P = 256
with torch.inference_mode():
    cache = m.new_cache(1, P + 9); rows = torch.arange(1)
    m(torch.randint(0, 49152, (1, P)), torch.arange(P).expand(1, -1), cache, rows=rows, prefill=True)
    cache.advance(rows, torch.full((1,), P))
    arms = {}
    for n in (1, 2, 3):
        toks = torch.randint(0, 49152, (1, n)); pos = (P + torch.arange(n)).expand(1, -1)
        mask = None if n == 1 else torch.tril(torch.ones(n, n, dtype=torch.bool)).expand(1, n, n)
        arms[f"n{n}"] = (lambda toks=toks, pos=pos, mask=mask: m(toks, pos, cache, rows=rows, block_mask=mask, logits_at="all"))
        arms[f"n{n}aux"] = (lambda toks=toks, pos=pos, mask=mask: m(toks, pos, cache, rows=rows, block_mask=mask, logits_at="all", hidden_indices=hid))
        arms[f"n{n}nolog"] = (lambda toks=toks, pos=pos, mask=mask: m(toks, pos, cache, rows=rows, block_mask=mask, logits_at=None))
    res = {}
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 100):
        for n, f in arms.items():
            a = time.perf_counter(); f(); res.setdefault(n, []).append(time.perf_counter() - a)
    print(" | ".join(f"{n} {statistics.median(v[5:])*1e3:.3f}" for n, v in res.items()))
