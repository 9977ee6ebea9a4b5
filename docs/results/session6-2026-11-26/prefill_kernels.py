"""The 30 layers' projections of the default model at prompt sizes: w4a8, torch int4, dense float32, dense bfloat16
(random weights, median of 5 per shape, 2 threads). python docs/results/session6-2026-11-26/prefill_kernels.py"""
import time, torch, statistics
import torch.nn.functional as F
from eaglespec.runtime.quant import PackedLinear, KernelPlan
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
def t(fn, reps=5):
    fn(); ts=[]
    for _ in range(reps):
        a=time.perf_counter(); fn(); ts.append(time.perf_counter()-a)
    return statistics.median(ts)*1e3
for rows in (8, 16, 32, 64, 128, 256, 512):
    tot = {"w4a8": 0, "torch_int4": 0, "dense_f32": 0, "dense_bf16": 0}
    for n, k in shapes:
        w = torch.randn(n, k, generator=g) * 0.02
        x = torch.randn(rows, k, generator=g)
        a = PackedLinear.from_float(w, "int4", plan=KernelPlan({"int4": [(1 << 30, "packed")]}), kernel="w4a8")
        b = PackedLinear.from_float(w, "int4", plan=KernelPlan({"int4": [(1 << 30, "packed")]}), kernel="torch")
        wb = w.to(torch.bfloat16)
        tot["w4a8"] += t(lambda: a(x, True)); tot["torch_int4"] += t(lambda: b(x, True))
        tot["dense_f32"] += t(lambda: F.linear(x, w)); tot["dense_bf16"] += t(lambda: F.linear(x.to(torch.bfloat16), wb).float())
    print(rows, {k: round(v * 30, 2) for k, v in tot.items()}, "ms for 30 layers", flush=True)
