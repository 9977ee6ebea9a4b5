# End-to-end A/B of the rotary/SwiGLU kernels (kernels/layer_elementwise.cpp) against torch's operators, one
# process, eager, greedy, 8 MT-bench first turns outside the matrix. Usage: B REPS
import sys, torch
import torch.nn.functional as F
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests, kernel_ab
import eaglespec.runtime.model as M
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
B, reps = int(sys.argv[1]), int(sys.argv[2])
t = load_target()
new_rot, new_silu = M.apply_rotary, M.silu_mul
old_rot = lambda x, c, s: torch.addcmul(x * c, x.roll(x.shape[-1] // 2, dims=-1), s)
old_silu = lambda g, u: F.silu(g) * u
def select(name):
    M.apply_rotary, M.silu_mul = (new_rot, new_silu) if name == "new" else (old_rot, old_silu)
reqs = mt_bench_requests(t.tokenizer, 8, first=3)
kernel_ab(t, ["vanilla", "chain1"], B, reqs, reps, select)
