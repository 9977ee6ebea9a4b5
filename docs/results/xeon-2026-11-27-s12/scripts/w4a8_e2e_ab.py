# Eager end-to-end A/B of the w4a8 kernel builds: old (no prefetch, op pf0) vs the package's (prefetch), same
# process, swapped at runtime/w4a8.mm. Usage: w4a8_e2e_ab.py BATCH N_PROMPTS ROUNDS KINDS (e.g. 1 8 4 vanilla,chain,auto)
import sys
import torch
from torch.utils.cpp_extension import load
import eaglespec.runtime.w4a8 as W
from eaglespec.runtime.loading import load_target
from common import kernel_ab, mt_bench_requests
torch.set_num_threads(2)
B, N, REPS, KINDS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
F = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]
load(name="pf0", sources=["/work/runs/s12/pf/w4a8_pf0.cpp"], extra_cflags=F, extra_ldflags=["-fopenmp"], is_python_module=False)
t = load_target()
OPS = {"old": torch.ops.pf0.w4a8_mm, "new": torch.ops.eaglespec.w4a8_mm}
cur = ["new"]
W.mm = lambda x, wq, s, o: OPS[cur[0]](x.float(), wq, s, o)
reqs = mt_bench_requests(t.tokenizer, N, first=3, per_category=2)  # not the matrix's first 3 per category
kernel_ab(t, KINDS, B, reqs, REPS, lambda name: cur.__setitem__(0, name))
