# The target forward's wall time in vanilla's steps (no hidden_indices) and in paused auto steps (the head's
# hidden_indices), arms rotating per group, plus the rest of the step.
# python fwd_hidden.py QUESTIONS PER_CATEGORY TEMPERATURE ARM...
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
fw, st = {}, {}
model = target.model
orig = type(model).__call__
def call(self, *a, **k):
    t = time.perf_counter(); out = orig(self, *a, **k)
    fw.setdefault((bool(k.get("hidden_indices")), a[0].shape[1]), []).append(time.perf_counter() - t); return out
type(model).__call__ = call
for s, eng in arms.items():
    step = eng._step
    def step_(seqs, step=step, s=s):
        t0 = time.perf_counter(); out = step(seqs); st.setdefault(s, []).append(time.perf_counter() - t0); return out
    eng._step = step_
with torch.inference_mode():
    tot = rotate_arms(arms, reqs, 1, 1)
base = tot["vanilla"]
for s, t in tot.items():
    v = st[s]; print(f"{s:28s} wall {base.wall_s / t.wall_s:.3f}x rounds {dict(t.rounds)} step median {1e6*statistics.median(v):.1f} mean {1e6*sum(v)/len(v):.1f} us")
for (h, n), v in sorted(fw.items()):
    if len(v) > 50:
        print(f"  forward hidden={h!s:5s} tokens {n:3d}: {len(v):6d} calls median {1e6*statistics.median(v):.1f} mean {1e6*sum(v)/len(v):.1f} us")
