# Three identical vanilla engines; then the fastest and slowest swap KV caches: does the speed follow the cache?
import sys, collections, statistics, time, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=1.0)
engs = {k: Engine(t, None, max_batch_size=1) for k in ("A", "B", "C")}
def rounds(n):
    res = collections.defaultdict(list)
    for rep in range(n):
        for k, e in (list(engs.items()) if rep % 2 == 0 else list(engs.items())[::-1]):
            t0 = time.perf_counter(); o = e.generate(reqs); dt = time.perf_counter() - t0
            res[k].append(sum(len(x.token_ids) for x in o) / dt)
    return {k: statistics.median(v) for k, v in res.items()}
with torch.inference_mode():
    for e in engs.values(): e.generate(reqs)
    for k, e in engs.items(): print(k, "cache k at", hex(e.cache.k.data_ptr()), "v at", hex(e.cache.v.data_ptr()), tuple(e.cache.k.shape))
    r = rounds(3); print("before swap", {k: round(v, 1) for k, v in r.items()})
    fast, slow = max(r, key=r.get), min(r, key=r.get)
    engs[fast].cache, engs[slow].cache = engs[slow].cache, engs[fast].cache
    r2 = rounds(3); print(f"after swapping {fast}<->{slow} caches", {k: round(v, 1) for k, v in r2.items()})
