import statistics, time, torch, sys
import eaglespec.runtime.model as M
import eaglespec.runtime.cpu_kernels as CK
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
t = load_target(); m = t.model
old_ek = M._eager_kernel
def fast_ek(*tensors):
    if not CK._state.get("ok") or torch.compiler.is_compiling():
        return False
    for x in tensors:
        if x.dtype is not torch.float32 or not x.is_cpu or x.requires_grad:
            return False
    return True
P = 256
with torch.inference_mode():
    b = 1
    cache = m.new_cache(b, P + 9); rows = torch.arange(b)
    m(torch.randint(0, 49152, (b, P)), torch.arange(P).expand(b, -1), cache, rows=rows, prefill=True)
    cache.advance(rows, torch.full((b,), P))
    toks = torch.randint(0, 49152, (b, 1)); pos = (P + torch.arange(1)).expand(b, -1)
    f = lambda: m(toks, pos, cache, rows=rows, logits_at="all").logits
    res = {}
    for i in range(300):
        for name, ek in ((("old", old_ek), ("fast", fast_ek)) if i % 2 else (("fast", fast_ek), ("old", old_ek))):
            M._eager_kernel = ek
            a = time.perf_counter(); f(); res.setdefault(name, []).append(time.perf_counter() - a)
for k, v in res.items(): print(k, f"{statistics.median(v[10:])*1e3:.3f} ms")
