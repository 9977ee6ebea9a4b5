# A paused step against a vanilla step, paired: python paused_step_ab.py QUESTIONS PER_CATEGORY BATCH TEMPERATURE PASSES
# Two engines in one process, vanilla and `--tree auto` held paused (never drafting, no probe: margin 100, waits 10**6),
# run on the same requests (first turns, 128 tokens, EOS ignored), the arms' order alternating per request; every
# decode step's wall time (Engine.step, the prefill step left out) is paired with the other arm's step of the same
# request and index (the same context length, one token a step), and the pairs' differences summarised.
# The first request of the first pass is a warm-up, left out. Phases (medians per arm over the same steps): the
# target forward, the verification, the proposer's calls (propose, commit, observe_step_time: the paused arm only).
import statistics, sys, time
import torch
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine
from eaglespec.measure.ab import first_turn_requests
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions

allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
path, per_cat, batch, temp, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
target = load_target(None)
reqs = first_turn_requests(target.tokenizer, path, per_cat, temp)
groups = [reqs[i:i + batch] for i in range(0, len(reqs), batch)]
prop = build_calibrated_proposer(target, DraftOptions())
d = prop.dispatcher
d.margin, d.keep_margin, d.probe_every, d.max_probe_every = 100.0, None, 10**6, 10**6
arms = {"vanilla": Engine(target, None, max_batch_size=batch), "paused": Engine(target, prop, max_batch_size=batch)}
phases, arm = {}, ["vanilla"]


def timed(obj, name, key, keep=lambda a, k: True):
    f = getattr(obj, name)

    def w(*a, **k):
        t0 = time.perf_counter()
        r = f(*a, **k)
        if keep(a, k):
            phases.setdefault((arm[0], key), []).append(time.perf_counter() - t0)
        return r
    setattr(obj, name, w)


timed(target.model, "forward", "forward", lambda a, k: not k.get("prefill"))
for a, e in arms.items():
    timed(e, "_verify", "verify", lambda a, k: True)
for n in ("propose", "commit", "observe_step_time"):
    timed(prop, n, n)


def step_times(eng, group):
    for i, r in enumerate(group):
        eng.submit(i, r)
    out = []
    while not eng.idle:
        t0 = time.perf_counter()
        prefill = bool(eng.waiting)
        eng.step()
        if not prefill:
            out.append(time.perf_counter() - t0)
        elif arm[0] != "warm-up":
            phases.setdefault((arm[0], "prefill step"), []).append(time.perf_counter() - t0)
    return out


diffs, times = [], {a: [] for a in arms}
with torch.inference_mode():
    for p in range(passes):
        for g, group in enumerate(groups):
            order = list(arms) if (p * len(groups) + g) % 2 == 0 else list(arms)[::-1]
            got = {}
            for a in order:
                arm[0] = a if not (p == 0 and g == 0) else "warm-up"
                got[a] = step_times(arms[a], group)
            if p == 0 and g == 0:
                continue  # warm-up
            n = min(len(v) for v in got.values())
            diffs += [got["paused"][i] - got["vanilla"][i] for i in range(n)]
            for a in arms:
                times[a] += got[a][:n]
rounds = prop.dispatcher.last.label if prop.dispatcher.last else None
med = {a: statistics.median(v) for a, v in times.items()}
print(f"{len(reqs)} prompts, batch {batch}, T={temp}, {passes} passes, {len(diffs)} paired steps; paused arm's choice: {rounds}")
for a in arms:
    print(f"{a:8s} step median {med[a] * 1e3:.3f} ms  mean {statistics.mean(times[a]) * 1e3:.3f} ms")
q = statistics.quantiles(diffs, n=4)
print(f"paused - vanilla, paired: median {statistics.median(diffs) * 1e6:+.1f} us  quartiles {q[0] * 1e6:+.1f} / "
      f"{q[2] * 1e6:+.1f} us  mean {statistics.mean(diffs) * 1e6:+.1f} us  "
      f"({statistics.median(diffs) / med['vanilla'] * 100:+.2f}% of vanilla's median step)")
for (a, k), v in sorted(phases.items()):
    if a != "warm-up":
        print(f"  {a:8s} {k:18s} median {statistics.median(v) * 1e6:7.1f} us  mean {statistics.mean(v) * 1e6:7.1f} us")
