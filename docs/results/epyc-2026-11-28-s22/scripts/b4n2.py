# verify(4, n) and verify(1, n) over a 128-token prefix, in rounds (min of 15): is the 8-row forward bimodal per process?
import time, torch
from eaglespec.engine import calibrate as C
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
t = load_target()
with torch.inference_mode():
    at = C.measure_forwards(t.model, (1, 4), (1, 2, 4), (128,))[128]
print(" ".join(f"b{b}n{n} {s*1e3:.2f}" for (b, n), s in sorted(at.items())))
