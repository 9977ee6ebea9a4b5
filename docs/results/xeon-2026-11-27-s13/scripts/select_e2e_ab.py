# End-to-end A/B of the selection kernels (kernels/select.cpp) against torch's topk/argmax, one process, eager,
# greedy: "old" = torch's selection, "new" = ours (runtime.logits._own_kernel switched). Usage: B REPS
import sys, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests, kernel_ab
import eaglespec.runtime.logits as L
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
B, reps = int(sys.argv[1]), int(sys.argv[2])
t = load_target()
own = L._own_kernel
def select(name):
    L._own_kernel = own if name == "new" else (lambda x: False)
reqs = mt_bench_requests(t.tokenizer, 8, first=3)
kernel_ab(t, ["vanilla", "chain1", "chain3"], B, reqs, reps, select)
