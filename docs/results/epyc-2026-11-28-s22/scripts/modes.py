# Per process: whole forwards verify(1, n) (min of 15 rounds) and the 210 decoder linears' w4a8 matmuls alone at
# 1 / 2 / 4 rows (min of 15 rounds): which part of a 2-token forward is slow in a slow process?
import time, torch
from eaglespec.engine import calibrate as C
from eaglespec.runtime import allocator, w4a8
from eaglespec.runtime.loading import load_target
from eaglespec.runtime.quant import PackedLinear
allocator.tune(); torch.set_num_threads(2)
t = load_target()
lins = [m for n, m in t.model.named_modules() if isinstance(m, PackedLinear) and m.kernel == "w4a8" and "layers" in n]
xs = {r: {m.in_features: torch.randn(r, m.in_features) for m in lins} for r in (1, 2, 4)}
def mms(r):
    def run():
        for m in lins:
            b = m._buffers
            w4a8.mm(xs[r][m.in_features], b["w4_q"], b["w4_scale"], b["w4_offset"])
    return run
with torch.inference_mode():
    at = C.measure_forwards(t.model, (1,), (1, 2, 4), (128,))[128]
    mm = C._time_rounds({r: mms(r) for r in (1, 2, 4)}, rounds=15, max_rounds=15)
print("fwd " + " ".join(f"n{n} {s*1e3:.2f}" for (b, n), s in sorted(at.items())) + " | mm " + " ".join(f"r{r} {s*1e3:.2f}" for r, s in mm.items()), len(lins))
