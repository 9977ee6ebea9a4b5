# Cost of drawing one node's children at batch 1 (draft vocabulary 8192, target 49152), 2 threads, medians of 300:
# top-1, the Gumbel race with q built by advanced indexing, and the parts (uniforms, logs, top-k, q, inverse CDF).
import time, statistics, torch
from eaglespec.spec.sampling import process_logits
torch.set_num_threads(2)
V, Vd = 49152, 8192
g = torch.Generator().manual_seed(0)
logits = torch.randn(1, 1, Vd) * 3
d2t = torch.randperm(V)[:Vd]
def greedy():
    lp, ids = torch.log_softmax(logits, -1).topk(1, -1); return ids
def sampled():
    logq = torch.log_softmax(logits / 1.0, -1)
    u = torch.rand(logq.shape[1:], generator=g).clamp_(1e-20, 1.0)
    ids = (logq + -torch.log(-torch.log(u))).topk(1, -1).indices
    q = torch.zeros(1, 1, V); q[..., d2t] = logq.exp()
    return ids, logq.gather(-1, ids), q
def tm(f, n=300):
    for _ in range(20): f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(ts)
with torch.inference_mode():
    print(f"children greedy {tm(greedy):.0f} us, sampled {tm(sampled):.0f} us")
    def parts():
        logq = torch.log_softmax(logits, -1)
        return logq
    logq = parts()
    print(f"log_softmax {tm(parts):.0f}")
    print(f"rand {tm(lambda: torch.rand(logq.shape[1:], generator=g)):.0f}")
    u = torch.rand(logq.shape[1:], generator=g)
    print(f"loglog {tm(lambda: -torch.log(-torch.log(u))):.0f}")
    print(f"topk {tm(lambda: (logq + u).topk(1, -1).indices):.0f}")
    def mkq():
        q = torch.zeros(1, 1, V); q[..., d2t] = logq.exp(); return q
    print(f"q {tm(mkq):.0f}")
    def mkq2():
        q = logq.new_zeros(1, 1, V); q.index_copy_(-1, d2t, logq.exp()); return q
    print(f"q index_copy {tm(mkq2):.0f}")
    def icdf():
        p = logq.exp(); c = p.cumsum(-1); uu = torch.rand(1, 1, 1, generator=g)
        return torch.searchsorted(c, uu * c[..., -1:]).clamp_(max=Vd - 1)
    print(f"inverse cdf {tm(icdf):.0f}")
    x = torch.randn(1, 2, V) * 3
    print(f"process_logits T=1 {tm(lambda: process_logits(x, 1.0, 0, 1.0)):.0f}")
    print(f"zeros {tm(lambda: torch.zeros(1, 1, V)):.0f}")
    e = logq.exp()
    print(f"exp {tm(lambda: logq.exp()):.0f}")
    buf = torch.zeros(1, 1, V)
    print(f"index_copy only {tm(lambda: buf.index_copy_(-1, d2t, e)):.0f}")
    ds = d2t.sort().values
    print(f"index_copy sorted {tm(lambda: buf.index_copy_(-1, ds, e)):.0f}")
    print(f"index_put sorted {tm(lambda: buf.__setitem__((Ellipsis, ds), e)):.0f}")
