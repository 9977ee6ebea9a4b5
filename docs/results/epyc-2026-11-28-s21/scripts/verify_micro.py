# sampled verification at batch 1 and 4 (chain of 1 and 2, plain step): eaglespec::verify_chain_sampled against the
# torch rule (the kernel off; the sampling kernel on, as before), alternating in rounds, medians of 200 calls a round; greedy chain for scale
import statistics, sys, time, torch
from eaglespec.runtime import cpu_kernels
from eaglespec.spec import verify as V
from eaglespec.spec.sampling import process_logits
from eaglespec.spec.tree import DraftTree
assert cpu_kernels.available()
torch.set_num_threads(2)
from eaglespec.runtime import allocator
allocator.tune()  # as every command does
print("cpu:", cpu_kernels.cpuinfo("model name"), "torch", torch.__version__)
g = torch.Generator().manual_seed(0)
def med(f, n=200):
    ts = []
    for _ in range(n):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return statistics.median(ts) * 1e6
def case(B, N):
    logits = torch.randn(B, N, 49152, generator=g) * 3
    p = process_logits(logits, 1.0)
    q = torch.zeros(B, N, 49152); q[..., :8192] = torch.softmax(torch.randn(B, N, 8192, generator=g) * 3, -1)
    tok = torch.randint(0, 8192, (B, N), generator=g)
    tree = DraftTree(tokens=tok, parents=torch.arange(-1, N - 1).expand(B, N), depth=torch.arange(N).expand(B, N),
                     valid=torch.ones(B, N, dtype=torch.bool), draft_logp=torch.zeros(B, N), draft_q=q,
                     max_depth=N - 1, chain=True)
    u, us = torch.rand(B, N, generator=g), torch.rand(B, generator=g)
    return tree, p, u, us, logits
real = V._chain_kernel_serves
for B in (1, 4):
    for N in (1, 2, 3):
        tree, p, u, us, logits = case(B, N)
        res = {"kernel": [], "torch": []}
        for rnd in range(5):
            for name in ("kernel", "torch") if rnd % 2 == 0 else ("torch", "kernel"):
                V._chain_kernel_serves = real if name == "kernel" else (lambda *a: False)
                res[name].append(med(lambda: V.verify_sampling(tree, p, u, us, N > 1, max_depth=N - 1)))
        V._chain_kernel_serves = real
        gr = med(lambda: V.verify_greedy(tree, logits, max_depth=N - 1))
        print(f"B={B} N={N}: sampled verify torch {min(res['torch']):.0f}-{max(res['torch']):.0f} us, kernel "
              f"{min(res['kernel']):.0f}-{max(res['kernel']):.0f} us (5 rounds); greedy {gr:.0f} us", flush=True)
