# The dispatcher's own calls in the engine, each timed: auto alone over the requests, one pass.
# python dispatcher_calls.py QUESTIONS PER_CATEGORY TEMPERATURE
import sys, time, collections, torch
from eaglespec.measure.ab import arm_engine, first_turn_requests, rotate_arms
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
target = load_target(None)
reqs = first_turn_requests(target.tokenizer, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
arms = {"auto": arm_engine(target, "auto", 1)}
d = arms["auto"].proposer.dispatcher
tot = collections.defaultdict(lambda: [0, 0.0])
for name in ("pick", "observe", "observe_step", "observe_look_back", "start_row", "end_row"):
    f = getattr(d, name)
    def w(*a, _f=f, _n=name, **k):
        t0 = time.perf_counter(); r = _f(*a, **k); tot[_n][0] += 1; tot[_n][1] += time.perf_counter() - t0; return r
    setattr(d, name, w)
with torch.inference_mode():
    rotate_arms(arms, reqs, 1, 1)
for k, (n, s) in tot.items():
    print(f"{k:20s} {n:6d} calls {1e3*s:8.1f} ms {1e6*s/max(n,1):7.1f} us a call")
