# Where auto's drafting step spends more than a fixed chain of 1's: the dispatcher's pick / observe /
# observe_step time per step, and step-time percentiles, one process, arms rotating per group.
# python pick_cost.py QUESTIONS PER_CATEGORY TEMPERATURE ARM...
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
steps, calls = {}, {}
def timed(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); out = f(*a, **k); calls.setdefault(key, []).append(time.perf_counter() - t); return out
    setattr(obj, name, g)
for s, eng in arms.items():
    step = eng._step
    def step_(seqs, step=step, s=s):
        t0 = time.perf_counter(); out = step(seqs); steps.setdefault(s, []).append(time.perf_counter() - t0); return out
    eng._step = step_
    p = eng.proposer
    if p is None: continue
    timed(p, "propose", (s, "propose")); timed(p, "commit", (s, "commit"))
    d = p.dispatcher
    for name in ("pick", "observe", "observe_step"):
        if hasattr(d, name): timed(d, name, (s, "dispatcher." + name))
with torch.inference_mode():
    tot = rotate_arms(arms, reqs, 1, 1)
base = tot["vanilla"]
for s, t in tot.items():
    v = sorted(steps[s]); n = len(v)
    print(f"{s:28s} wall {base.wall_s / t.wall_s:.3f}x rounds {dict(t.rounds)}  steps {n} mean {1e3*sum(v)/n:.3f} "
          f"median {1e3*v[n//2]:.3f} p90 {1e3*v[int(n*.9)]:.3f} p99 {1e3*v[int(n*.99)]:.3f} ms")
for (s, k), v in sorted(calls.items()):
    print(f"  {s:28s} {k:24s} calls {len(v):6d} total {1e3*sum(v):8.1f} ms  mean {1e6*sum(v)/len(v):7.1f} us  median {1e6*statistics.median(v):7.1f} us")
