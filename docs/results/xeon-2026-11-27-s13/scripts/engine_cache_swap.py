# Three identical vanilla engines; then the fastest and slowest swap KV caches: does the speed follow the cache?
import statistics, torch
from engine_placebo import alternate, mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=1.0)
engs = {k: Engine(t, None, max_batch_size=1) for k in ("A", "B", "C")}
medians = lambda res: {k: round(statistics.median(v), 1) for k, v in res.items()}  # noqa: E731
with torch.inference_mode():
    for e in engs.values(): e.generate(reqs)
    for k, e in engs.items(): print(k, "cache k at", hex(e.cache.k.data_ptr()), "v at", hex(e.cache.v.data_ptr()), tuple(e.cache.k.shape))
    r = medians(alternate(engs, reqs, 3)); print("before swap", r)
    fast, slow = max(r, key=r.get), min(r, key=r.get)
    engs[fast].cache, engs[slow].cache = engs[slow].cache, engs[fast].cache
    print(f"after swapping {fast}<->{slow} caches", medians(alternate(engs, reqs, 3)))
