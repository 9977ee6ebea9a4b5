# Eager end-to-end A/B of row_attention builds (old vs prefetching), swapped in-process at model.py's call site.
import sys
import torch
from torch.utils.cpp_extension import load
from eaglespec.runtime.loading import load_target
from common import kernel_ab, mt_bench_requests
torch.set_num_threads(2)
B = int(sys.argv[1]); N = int(sys.argv[2]); REPS = int(sys.argv[3]); KINDS = sys.argv[4].split(","); LEN = int(sys.argv[5]) if len(sys.argv) > 5 else 128
F = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]
for n in ("old", "new"):
    load(name=f"ra{n}", sources=[f"/work/runs/s12/ra/{n}.cpp"], extra_cflags=F, extra_ldflags=["-fopenmp"], is_python_module=False)
t = load_target()
OPS = {"old": torch.ops.raold.row_attention, "new": torch.ops.ranew.row_attention}
g = torch.Generator().manual_seed(0)
for (Bq, H, HKV, D, T, S) in [(1, 9, 3, 64, 1, 37), (2, 9, 3, 64, 5, 100), (3, 8, 2, 128, 4, 70), (1, 12, 1, 64, 3, 50), (1, 4, 4, 32, 3, 17), (1, 9, 3, 64, 8, 264)]:
    q = torch.randn(Bq, H, T, D, generator=g); kc = torch.randn(Bq, HKV, S + 9, D, generator=g)[:, :, 3:S + 3]; vc = torch.randn(Bq, HKV, S, D, generator=g)
    for mask in (None, torch.rand(Bq, 1, T, S, generator=g) > 0.3):
        assert torch.equal(OPS["old"](q, kc, vc, mask), OPS["new"](q, kc, vc, mask))
print("bit-identical", flush=True)
cur = ["new"]
import eaglespec.runtime.model as M
real = torch.ops.eaglespec
class EaglespecNS:
    def __getattr__(self, name): return OPS[cur[0]] if name == "row_attention" else getattr(real, name)
ops_shim = type("O", (), {"__getattr__": lambda self, n: EaglespecNS() if n == "eaglespec" else getattr(torch.ops, n)})()
torch_shim = type("T", (), {"__getattr__": lambda self, n: ops_shim if n == "ops" else getattr(torch, n)})()
M.torch = torch_shim
reqs = mt_bench_requests(t.tokenizer, N, first=3, per_category=2, tokens=LEN)
kernel_ab(t, KINDS, B, reqs, REPS, lambda name: cur.__setitem__(0, name))
