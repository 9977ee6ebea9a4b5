# verify(b, n) forwards (logits at all n tokens, 128-token prefix, the greedy argmax included) with two builds of
# one runtime piece, alternating every call, medians of R calls each, then verify(n) / verify(1):
#   select:      torch's topk/argmax ("old") against kernels/select.cpp ("new")
#   elementwise: torch's rotary and SwiGLU operators ("old") against kernels/layer_elementwise.cpp ("new")
# and, for each (b, n), how many greedy tokens of the random-token input differ between the arms.
# Usage: verify_ab.py select|elementwise R
import sys, statistics, time, torch
import torch.nn.functional as F
import eaglespec.runtime.logits as L
import eaglespec.runtime.model as M
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
kind, R = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
t = load_target(); m = t.model
own, new_rot, new_silu = L._own_kernel, M.apply_rotary, M.silu_mul
old_rot = lambda x, c, s: torch.addcmul(x * c, x.roll(x.shape[-1] // 2, dims=-1), s)
old_silu = lambda g, u: F.silu(g) * u


def select(name):
    if kind == "select":
        L._own_kernel = own if name == "new" else (lambda x: False)
    else:
        M.apply_rotary, M.silu_mul = (new_rot, new_silu) if name == "new" else (old_rot, old_silu)


res = {}
with torch.inference_mode():
    for b in (1, 4):
        cache = m.new_cache(b, 128 + 9); rows = torch.arange(b)
        m(torch.randint(0, 49152, (b, 128)), torch.arange(128).expand(b, -1), cache, rows=rows, prefill=True)
        cache.advance(rows, torch.full((b,), 128))
        for n in (1, 2, 4, 8):
            toks = torch.randint(0, 49152, (b, n)); pos = (128 + torch.arange(n)).expand(b, -1)
            mask = torch.tril(torch.ones(n, n, dtype=torch.bool)).expand(b, n, n) if n > 1 else None
            fwd = lambda: L.argmax(m(toks, pos, cache, rows=rows, block_mask=mask, logits_at="all").logits)
            outs = {}
            for name in ("old", "new"):
                select(name); fwd(); outs[name] = fwd()
            print(b, n, "greedy tokens differing (random-token input):", int((outs["old"] != outs["new"]).sum()),
                  "of", outs["old"].numel())
            for i in range(R):
                for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
                    select(name)
                    a = time.perf_counter(); fwd(); res.setdefault((b, n, name), []).append(time.perf_counter() - a)
for b in (1, 4):
    for name in ("old", "new"):
        med = {n: statistics.median(res[(b, n, name)]) * 1e3 for n in (1, 2, 4, 8)}
        print(f"b{b} {name}: " + " ".join(f"n{n} {v:.2f}" for n, v in med.items()) + " ms | ratios " +
              " / ".join(f"{med[n] / med[1]:.2f}" for n in (2, 4, 8)))
