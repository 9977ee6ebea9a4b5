# What a call of eaglespec::layer_step from Python costs before any of its work: a call whose first check fails
# (x in float64) against one of eaglespec::rms_norm failing the same way (the exception's cost is the same), so the
# difference is parsing layer_step's 24 arguments (4 lists of tensors); and cache.k[i], cache.v[i], as the
# per-layer call indexed them. 20000 calls a timing, three rounds, on the default int4 target.   python call_cost.py
import time, torch
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
m = load_target(None).model
from eaglespec.runtime import model as mm
w = m.layer_steps[0]
cache = m.new_cache(1, 300)
x = torch.randn(1, 1, 576).double()  # fails the first check (float32) right away
cos = torch.randn(1, 1, 1, 64); sin = cos
rows = torch.zeros(1, dtype=torch.long); slots = torch.zeros(1, 1, dtype=torch.long)
def t(f, n=20000):
    t0 = time.perf_counter()
    for _ in range(n):
        try: f()
        except RuntimeError: pass
    return (time.perf_counter() - t0) / n * 1e6
with torch.inference_mode():
    for _ in range(3):
        a = t(lambda: torch.ops.eaglespec.layer_step(x, None, *w, cos, sin, cache.k[0], cache.v[0], rows, slots, 0, 1, None, 9, 3, 1e-5))
        b = t(lambda: torch.ops.eaglespec.rms_norm(x, cos, 1e-5))
        c = t(lambda: (cache.k[0], cache.v[0]))
        print(f"layer_step failing call {a:.2f} us, rms_norm failing call {b:.2f} us, cache.k[i]+v[i] {c:.2f} us")
