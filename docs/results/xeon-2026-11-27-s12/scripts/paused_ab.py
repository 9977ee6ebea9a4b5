# Per-step A/B: vanilla vs a proposer that stays paused (tree none) vs auto; alternated, one process.
import sys, time, collections, statistics, torch
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions
from eaglespec.engine.generate import Engine
from common import mt_bench_requests, proposer
torch.set_num_threads(2)
comp = sys.argv[1] == "1"; B = int(sys.argv[2]); N = int(sys.argv[3]); T = float(sys.argv[4]); REPS = int(sys.argv[5])
KINDS = sys.argv[6].split(',')
t = load_target(compile=comp)
reqs = mt_bench_requests(t.tokenizer, N, temperature=T)
from eaglespec.engine.generate import NO_DRAFT
class Dummy:
    def __init__(self, hi): self.hidden_indices = hi; self.max_tree_nodes = 1
    def reserve(self, *a): pass
    def release(self, *a): pass
    def prefill(self, *a, **k): pass
    def propose(self, rows, pending, prefix, host=None): return NO_DRAFT.draft(None, pending)[0]
    def commit(self, *a, **k): pass
def mkprop(kind):
    if kind == "vanilla": return None
    if kind == "dummy": return Dummy(())
    if kind == "dummyhi": return Dummy((2, 15, 27))
    if kind == "auto":
        from eaglespec.engine.calibrate import build_calibrated_proposer
        return build_calibrated_proposer(t, DraftOptions())
    return proposer(t, kind)
engs = {k: Engine(t, mkprop(k), max_batch_size=B) for k in KINDS}
res = collections.defaultdict(list)
for k, eng in engs.items():
    with torch.inference_mode(): eng.generate(reqs[:B])
for rep in range(REPS):
    order = list(engs.items()); order = order[rep % len(order):] + order[:rep % len(order)]
    for k, eng in order:
        steps = []
        ostep = eng._step
        def s(seqs, ostep=ostep, steps=steps):
            t0 = time.perf_counter(); r = ostep(seqs); steps.append(time.perf_counter() - t0); return r
        eng._step = s
        ph = collections.defaultdict(float)
        wrapped = []
        def wrap(obj, name):
            orig = getattr(obj, name)
            def w(*a, **kw):
                t0 = time.perf_counter(); r = orig(*a, **kw); ph[name] += time.perf_counter() - t0; return r
            setattr(obj, name, w); wrapped.append((obj, name))
        wrap(t, "__call__") if False else None
        if eng.proposer is not None:
            wrap(eng.proposer, "propose"); wrap(eng.proposer, "commit")
        wrap(eng, "_verify")
        with torch.inference_mode():
            t0 = time.perf_counter(); outs = eng.generate(reqs); tot = time.perf_counter() - t0
        eng._step = ostep
        for obj, name in wrapped: delattr(obj, name)
        ntok = sum(len(o.token_ids) for o in outs)
        res[k].append((ntok / tot, 1e3 * statistics.median(steps), 1e3 * statistics.mean(steps), len(steps)))
        print(f"rep{rep} {k:8s} {ntok/tot:6.1f} tok/s  step med {1e3*statistics.median(steps):.3f} mean {1e3*statistics.mean(steps):.3f} n {len(steps)} | " + " ".join(f"{a} {1e3*v/len(steps):.3f}" for a, v in ph.items()), flush=True)
base = res[KINDS[0]]
for k in KINDS:
    r = [a[0] / b[0] for a, b in zip(res[k], base)]
    m = [a[1] / b[1] for a, b in zip(res[k], base)]
    print(f"{k:8s} tok/s ratio med {statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})  step-med ratio {statistics.median(m):.3f}")
