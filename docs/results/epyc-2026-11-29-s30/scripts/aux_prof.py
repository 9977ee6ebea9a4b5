# The ops of a batch-4 decode forward without and with the head's feature layers kept, 200 forwards each under
# torch.profiler (at main before session 30: the kernel returned one tensor a kept layer, torch.cat joined them): python aux_prof.py
import torch, sys
from torch.profiler import profile, ProfilerActivity
from eaglespec.runtime import allocator
from eaglespec.runtime.kvcache import HostRows
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
t = load_target(None); m = t.model
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.spec.speculative import DraftOptions
hi = build_calibrated_proposer(t, DraftOptions()).hidden_indices
print("hidden_indices", hi)
B, ctx = 4, 300
g = torch.Generator().manual_seed(0)
cache = m.new_cache(B, 8192)
with torch.inference_mode():
    m(torch.randint(0, 1000, (B, ctx), generator=g), torch.arange(ctx).expand(B, ctx), cache, prefill=True)
cache.lengths[:] = ctx
rows = torch.arange(B); tok = torch.full((B, 1), 5); pos = torch.full((B, 1), ctx)
host = HostRows(tuple(range(B)), (ctx,) * B, ctx)
for h in ((), hi):
    with torch.inference_mode():
        for _ in range(20): m(tok, pos, cache, rows=rows, logits_at="all", hidden_indices=h, host=host)
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(200): m(tok, pos, cache, rows=rows, logits_at="all", hidden_indices=h, host=host)
    print("hidden", h)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
