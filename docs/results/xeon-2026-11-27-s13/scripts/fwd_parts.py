# An 8-token verify forward at batch 1 (128-token prefix) without logits, with logits + torch's or our selection,
# and without logits + each selection over a random [1, 8, 49152]: medians of 55 alternating rounds.
import statistics, time, torch
import eaglespec.runtime.logits as L
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
t = load_target(); m = t.model
own = L._own_kernel
res = {}
with torch.inference_mode():
    b, n = 1, 8
    cache = m.new_cache(b, 128 + 9); rows = torch.arange(b)
    m(torch.randint(0, 49152, (b, 128)), torch.arange(128).expand(b, -1), cache, rows=rows, prefill=True)
    cache.advance(rows, torch.full((b,), 128))
    toks = torch.randint(0, 49152, (b, n)); pos = (128 + torch.arange(n)).expand(b, -1)
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool)).expand(b, n, n)
    x = torch.randn(1, 8, 49152)
    arms = {
      "nologits": lambda: m(toks, pos, cache, rows=rows, block_mask=mask),
      "old": lambda: L.argmax(m(toks, pos, cache, rows=rows, block_mask=mask, logits_at="all").logits),
      "new": lambda: L.argmax(m(toks, pos, cache, rows=rows, block_mask=mask, logits_at="all").logits),
      "nologits+torchtopk": lambda: (m(toks, pos, cache, rows=rows, block_mask=mask), x.topk(32, -1), x.argmax(-1)),
      "nologits+ourtopk": lambda: (m(toks, pos, cache, rows=rows, block_mask=mask), torch.ops.eaglespec.topk_rows(x, 32), torch.ops.eaglespec.argmax_rows(x)),
    }
    for i in range(60):
        for k, f in arms.items():
            L._own_kernel = (lambda x: False) if k == "old" else own
            a = time.perf_counter(); f(); res.setdefault(k, []).append(time.perf_counter() - a)
for k, v in res.items(): print(f"{k:20s} {statistics.median(v[5:])*1e3:.2f} ms")
