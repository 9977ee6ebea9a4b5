# verify(b, n) forwards (256-token prefix, logits for every token) with the old row_attention (ra_v0 build of
# the previous source) and the new one, alternating per call; medians.
import statistics, sys, time, torch
sys.path.insert(0, __import__("os").path.dirname(__file__))
from build import build
build("ra_v0")
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
t = load_target(); m = t.model
new_op = torch.ops.eaglespec.row_attention
old_op = torch.ops.ra_v0.row_attention
P, R = 256, int(sys.argv[1]) if len(sys.argv) > 1 else 40
res = {}
with torch.inference_mode():
    for b in (1, 4):
        cache = m.new_cache(b, P + 9); rows = torch.arange(b)
        m(torch.randint(0, 49152, (b, P)), torch.arange(P).expand(b, -1), cache, rows=rows, prefill=True)
        cache.advance(rows, torch.full((b,), P))
        arms = {}
        for n in (1, 2, 4, 8):
            toks = torch.randint(0, 49152, (b, n)); pos = (P + torch.arange(n)).expand(b, -1)
            mask = None if n == 1 else torch.tril(torch.ones(n, n, dtype=torch.bool)).expand(b, n, n)
            arms[n] = (lambda toks=toks, pos=pos, mask=mask: m(toks, pos, cache, rows=rows, block_mask=mask, logits_at="all").logits)
        for i in range(R):
            for n, f in arms.items():
                for name, op in ((("old", old_op), ("new", new_op)) if i % 2 else (("new", new_op), ("old", old_op))):
                    torch.ops.eaglespec.row_attention = op
                    a = time.perf_counter(); out = f(); dt = time.perf_counter() - a
                    if i >= 3: res.setdefault((b, n, name), []).append(dt)
        for name in ("old", "new"):
            base = statistics.median(res[(b, 1, name)])
            print(f"b{b} {name}: " + "  ".join(f"N={n} {statistics.median(res[(b, n, name)])*1e3:.2f} ms (x{statistics.median(res[(b, n, name)])/base:.3f})" for n in (1, 2, 4, 8)))
