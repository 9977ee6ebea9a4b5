# A paused (none) step of the auto arm against vanilla's step: median step, propose and commit microseconds by the
# step's tree label, one process, arms rotating per group.
# python paused_cost.py QUESTIONS PER_CATEGORY TEMPERATURE ARM...
# ARM: as in eaglespec.measure.ab.arm_engine (vanilla | chain<D> | auto[:ATTR=VALUE,...])
import sys, statistics, time, torch
from eaglespec.measure.ab import arm_engine, first_turn_requests, rotate_arms
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
path, per_cat, temp = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]); specs = sys.argv[4:]
target = load_target(None)
reqs = first_turn_requests(target.tokenizer, path, per_cat, temp)
arms = {s: arm_engine(target, s, 1) for s in specs}
rec = {}
for s, eng in arms.items():
    cur = {}
    p = eng.proposer
    if p is not None:
        for name in ("propose", "commit"):
            f = getattr(p, name)
            def g(*a, f=f, name=name, cur=cur, **k):
                t = time.perf_counter(); out = f(*a, **k); cur[name] = time.perf_counter() - t; return out
            setattr(p, name, g)
    step = eng._step
    def step_(seqs, step=step, s=s, cur=cur, p=p):
        cur.clear(); t0 = time.perf_counter(); out = step(seqs); dt = time.perf_counter() - t0
        label = p.step_label if p is not None else "vanilla"
        rec.setdefault((s, label), []).append((dt, cur.get("propose", 0), cur.get("commit", 0))); return out
    eng._step = step_
with torch.inference_mode():
    tot = rotate_arms(arms, reqs, 1, 1)
base = tot["vanilla"]
for s, t in tot.items():
    print(f"{s:28s} wall {base.wall_s / t.wall_s:.3f}x rounds {dict(t.rounds)}")
for (s, l), v in sorted(rec.items()):
    med = lambda i: 1e6 * statistics.median(x[i] for x in v)
    mean = lambda i: 1e6 * sum(x[i] for x in v) / len(v)
    print(f"  {s:28s} {l:8s} steps {len(v):6d}  step median {med(0):7.1f} mean {mean(0):7.1f} us  propose {med(1):6.1f} / {mean(1):6.1f}  commit {med(2):6.1f} / {mean(2):6.1f} us (median / mean)")
