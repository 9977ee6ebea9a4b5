# One sampled plain step's verification (process_logits + verify_sampling of a one-node tree, vocabulary 49152,
# batch 1) and its parts, in microseconds; then torch profiles. Usage: sample_micro.py
import time, torch
from torch.profiler import profile, ProfilerActivity
from eaglespec.spec.sampling import process_logits, sample_from_probs
from eaglespec.spec.verify import verify_sampling
from eaglespec.spec.strategies import NoDraft
from eaglespec.runtime import cpu_kernels
torch.set_num_threads(2)
cpu_kernels.available()
V = 49152
logits = torch.randn(1, 1, V) * 3
tree, _ = NoDraft().draft(None, torch.zeros(1, dtype=torch.long))
u = torch.rand(1, 8)
def step():
    probs = process_logits(logits, 1.0, 0, 1.0)
    return verify_sampling(tree, probs, u[:, :1], u[:, -1], sampled_children=False, max_depth=0)
with torch.inference_mode():
    for _ in range(20): step()
    a = time.perf_counter()
    for _ in range(200): step()
    print("one-node sampled verify: %.1f us" % ((time.perf_counter() - a) / 200 * 1e6))
    a = time.perf_counter()
    for _ in range(200): process_logits(logits, 1.0, 0, 1.0)
    print("process_logits: %.1f us" % ((time.perf_counter() - a) / 200 * 1e6))
    p = process_logits(logits, 1.0, 0, 1.0)[:, 0]
    a = time.perf_counter()
    for _ in range(200): sample_from_probs(p, u[:, 0])
    print("sample_from_probs: %.1f us" % ((time.perf_counter() - a) / 200 * 1e6))
    with profile(activities=[ProfilerActivity.CPU]) as pr:
        for _ in range(50): step()
    print(pr.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    import eaglespec.spec.verify as vm
    orig = vm.sample_from_probs
    vm.sample_from_probs = lambda p, u: torch.zeros(p.shape[0], dtype=torch.long)
    a = time.perf_counter()
    for _ in range(200): step()
    print("verify without sampling: %.1f us" % ((time.perf_counter() - a) / 200 * 1e6))
    vm.sample_from_probs = orig
    with profile(activities=[ProfilerActivity.CPU]) as pr:
        for _ in range(50): sample_from_probs(p, u[:, 0])
    print(pr.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
