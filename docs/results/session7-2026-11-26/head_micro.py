import time, logging, statistics
import torch
logging.basicConfig(level=logging.WARNING)
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import SHIPPED_HEAD_DIR, load_draft_head
from eaglespec.spec.compiled_head import CompiledHeadStep
torch.set_num_threads(2)
t = load_target(None, "auto", "cpu")
head = load_draft_head(SHIPPED_HEAD_DIR, t)
step = CompiledHeadStep(head)
F_ = head.config.feature_size
def args(T):
    cache = head.new_cache(1, 600)
    cache.lengths[0] = 300
    return (torch.randn(1, T, F_), torch.randint(0, 49152, (1, T)), torch.tensor([[300 + i for i in range(T)]]), cache, torch.tensor([0]))
with torch.inference_mode():
    for T in (1, 2):
        a = args(T)
        for _ in range(3): step(*a)
        def tm(f, n=200):
            ts = []
            for _ in range(n):
                t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
            return statistics.median(ts) * 1e3
        c = tm(lambda: step(*a))
        e = tm(lambda: head(head.fuse(a[0]), a[1], a[2], a[3], rows=a[4]))
        o = head(head.fuse(a[0]), a[1], a[2], a[3], rows=a[4])
        lg = tm(lambda: torch.log_softmax(head.logits(o[:, -1:]).float(), -1).topk(1, -1))
        fu = tm(lambda: head.fuse(a[0]))
        print(f"T={T}: compiled {c:.3f} ms, eager forward {e:.3f} ms (fuse alone {fu:.3f}), logits+topk {lg:.3f} ms")
