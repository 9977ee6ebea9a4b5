# in-engine target forward and step times and whole-request walls, vanilla and the chain of 1 alternating per request in one process. Usage: eng_fwd.py FIRST N (MT-bench first turns c[FIRST:FIRST+3] of each category, the first N)
import sys, time, statistics, torch, collections
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests, proposer
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
torch.set_num_threads(2)
t = load_target(); m = t.model
reqs = mt_bench_requests(t.tokenizer, int(sys.argv[2]) if len(sys.argv) > 2 else 6, first=int(sys.argv[1]) if len(sys.argv) > 1 else 3, temperature=0.0)
ev = Engine(t, None, max_batch_size=1); ec = Engine(t, proposer(t, "chain1"), max_batch_size=1)
times = collections.defaultdict(list); cur = [""]
fwd = m.forward
def timed(tokens, *a, **k):
    t0 = time.perf_counter(); r = fwd(tokens, *a, **k)
    if not k.get("prefill"): times[(cur[0], tokens.shape[1])].append(time.perf_counter() - t0)
    return r
m.forward = timed
steps = collections.defaultdict(list)
for e, name in ((ev, "van"), (ec, "c1")):
    st = e._step
    def ts(seqs, st=st, name=name):
        t0 = time.perf_counter(); r = st(seqs); steps[name].append(time.perf_counter() - t0); return r
    e._step = ts
with torch.inference_mode():
    ev.generate(reqs[:1]); ec.generate(reqs[:1]); times.clear(); steps.clear()
    for r in reqs:
        for e, name in ((ev, "van"), (ec, "c1")):
            cur[0] = name; e.generate([r])
for k, v in times.items(): print(k, len(v), f"{statistics.median(v)*1e3:.3f} mean {statistics.mean(v)*1e3:.3f}")
for k, v in steps.items(): print(k, len(v), f"step median {statistics.median(v)*1e3:.3f} mean {statistics.mean(v)*1e3:.3f}")
walls = collections.defaultdict(float)
with torch.inference_mode():
    for r in reqs:
        for e, name in ((ev, "van"), (ec, "c1")):
            a = time.perf_counter(); e.generate([r]); walls[name] += time.perf_counter() - a
print({k: round(v, 3) for k, v in walls.items()}, "ratio", walls["van"] / walls["c1"])
