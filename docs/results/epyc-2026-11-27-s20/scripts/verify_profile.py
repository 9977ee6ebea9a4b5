# Where a verify forward's time goes at 1 and 8 tokens (256-token prefix, logits at every token, batch 1): torch profiler,
# 30 forwards each after 10 warm-up ones. Usage: verify_profile.py
import sys, torch
from torch.profiler import profile, ProfilerActivity
from eaglespec.runtime.loading import load_target
torch.set_num_threads(2)
t = load_target(None); m = t.model
P = 256
cache = m.new_cache(1, P + 16)
ids = torch.randint(0, 49152, (1, P + 8))
with torch.inference_mode():
    m(ids[:, :P], torch.arange(P)[None], cache, prefill=True)
    cache.lengths[0] = P
    for n in (1, 8):
        fwd = lambda: m(ids[:, P:P + n], torch.arange(P, P + n)[None], cache, logits_at="all")
        for _ in range(10): fwd()
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(30): fwd()
        print("N =", n)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
