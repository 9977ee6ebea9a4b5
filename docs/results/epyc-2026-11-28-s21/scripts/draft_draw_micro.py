# The shipped head's sampled children (EagleProposer.children, one node a row, T=1) at batch 1 and 4:
# eaglespec::draft_draw against the torch rule (the proposer's cpu_kernels stubbed off), alternating in rounds,
# medians of 200 calls a round; the greedy child (an argmax) for scale. Includes the head's logits (the same in
# every arm).
import statistics, time, types, torch
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec import proposer as P
from eaglespec.spec.speculative import DraftOptions, build_proposer
allocator.tune()
torch.set_num_threads(2)
assert cpu_kernels.available()
print("cpu:", cpu_kernels.cpuinfo("model name"), "torch", torch.__version__)
t = load_target()
p = build_proposer(t, DraftOptions(tree="chain", depth=1))
off = types.SimpleNamespace(serves=lambda *a: False)
def med(f, n=200):
    ts = []
    for _ in range(n):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return statistics.median(ts) * 1e6
with torch.inference_mode():
    for B in (1, 4):
        o = torch.randn(B, 1, p.head.config.hidden_size).to(p.head.dtype)
        res = {"kernel": [], "torch": []}
        for rnd in range(5):
            for name in ("kernel", "torch") if rnd % 2 == 0 else ("torch", "kernel"):
                P.cpu_kernels = cpu_kernels if name == "kernel" else off
                p._step_temperature = torch.ones(B)
                p._step_generators = [torch.Generator().manual_seed(i) for i in range(B)]
                res[name].append(med(lambda: p.children(o, 1)))
        P.cpu_kernels = cpu_kernels
        p._step_temperature = p._step_generators = None
        greedy = med(lambda: p.children(o, 1))
        print(f"B={B}: sampled children torch {min(res['torch']):.0f}-{max(res['torch']):.0f} us, kernel "
              f"{min(res['kernel']):.0f}-{max(res['kernel']):.0f} us (5 rounds); greedy {greedy:.0f} us", flush=True)
