import json, sys, torch
from torch.profiler import profile, ProfilerActivity
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
t = load_target(); m = t.model
L = int(sys.argv[1])
toks = torch.randint(0, m.args.vocab_size, (1, L))
with torch.inference_mode():
    cache = m.new_cache(1, L + 8); rows = torch.arange(1)
    m(toks, torch.arange(L).expand(1, -1), cache, rows=rows, prefill=True)
    cache = m.new_cache(1, L + 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        m(toks, torch.arange(L).expand(1, -1), cache, rows=rows, prefill=True)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
