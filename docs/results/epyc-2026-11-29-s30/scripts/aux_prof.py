# The ops of a batch-4 decode forward without and with the head's feature layers kept, 200 forwards each under
# torch.profiler (at main before session 30: the kernel returned one tensor a kept layer, torch.cat joined them): python aux_prof.py
import torch
from torch.profiler import profile, ProfilerActivity
from common import batch4_decode
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.spec.speculative import DraftOptions
t, forward = batch4_decode()
hi = build_calibrated_proposer(t, DraftOptions()).hidden_indices
print("hidden_indices", hi)
for h in ((), hi):
    with torch.inference_mode():
        for _ in range(20): forward(h)
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(200): forward(h)
    print("hidden", h)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
