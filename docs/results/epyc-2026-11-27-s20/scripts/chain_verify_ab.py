# Sampled verification of chains of 1 and 2 (N = 2, 3 nodes) at batch 1 and 4, vocabulary 49152: the chain shortcut
# ('fast', tree flagged as a chain) against the tree walk ('walk', the same tree unflagged), alternating, medians of 8
# rounds of 50 calls, in microseconds. Usage: chain_verify_ab.py   (also with MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ set)
import time, torch, dataclasses, statistics
from eaglespec.spec.sampling import process_logits
from eaglespec.spec.verify import verify_sampling
from eaglespec.spec.tree import DraftTree
from eaglespec.runtime import cpu_kernels
torch.set_num_threads(2)
cpu_kernels.available()
V = 49152
g = torch.Generator().manual_seed(0)
def chain(B, N, sampled, is_chain):
    tokens = torch.randint(0, V, (B, N), generator=g)
    parents = torch.arange(-1, N - 1).expand(B, N)
    depth = torch.arange(N).expand(B, N)
    q = torch.softmax(torch.randn(B, N, V, generator=g) * 3, -1) if sampled else None
    return DraftTree(tokens, parents, depth, torch.ones(B, N, dtype=torch.bool), torch.zeros(B, N), q, max_depth=N - 1, chain=is_chain)
def once(fn, n=50):
    t = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - t) / n * 1e6
with torch.inference_mode():
    for N in (2, 3):
        for B in (1, 4):
            fast = chain(B, N, True, True)
            walk = dataclasses.replace(fast, chain=False)
            probs = process_logits(torch.randn(B, N, V, generator=g) * 3, 1.0)
            u = torch.rand(B, 8, generator=g)
            res = {"fast": [], "walk": []}
            for r in range(8):
                for name, tr in (("fast", fast), ("walk", walk)):
                    res[name].append(once(lambda: verify_sampling(tr, probs, u[:, :N], u[:, -1], True, max_depth=N - 1)))
            print(N, B, {k: round(statistics.median(v)) for k, v in res.items()})
