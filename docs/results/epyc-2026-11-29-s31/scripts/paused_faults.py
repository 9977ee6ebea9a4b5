# Why a paused step costs more than a plain one beyond the proposer's own work: per decode step, the wall time of
# the target forward and the minor page faults of the whole step (getrusage), for three engines run on the same
# requests in one process, in turn per group (order rotating):
#   vanilla       no proposer
#   paused        `--tree auto` held paused (margin 100, no probe): every step plain, its pairs recorded as the
#                 engine records them (the step's feature tensor kept until the draft cache catches up)
#   paused-flush  the same, with the recorded steps written into the proposer's buffer at every step, so no step's
#                 tensors outlive it (``_flush_lag_run`` after each record)
# Usage: python paused_faults.py QUESTIONS PER_CATEGORY BATCH TEMPERATURE PASSES
import resource, statistics, sys, time

import torch

from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine
from eaglespec.measure.ab import first_turn_requests
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions

allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__, "| 2 threads")
path, per_cat, batch, temp, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
target = load_target(None)
reqs = first_turn_requests(target.tokenizer, path, per_cat, temp)
groups = [reqs[i:i + batch] for i in range(0, len(reqs), batch)]


def held_paused():
    prop = build_calibrated_proposer(target, DraftOptions())
    d = prop.dispatcher
    d.margin, d.keep_margin, d.probe_every, d.max_probe_every = 100.0, None, 10**6, 10**6
    return prop


flushing = held_paused()
record = flushing._record_paused


def record_and_flush(*a, **k):
    record(*a, **k)
    flushing._flush_lag_run()


flushing._record_paused = record_and_flush
arms = {"vanilla": Engine(target, None, max_batch_size=batch), "paused": Engine(target, held_paused(), max_batch_size=batch),
        "paused-flush": Engine(target, flushing, max_batch_size=batch)}
arm = ["warm-up"]
fwd: dict = {}
forward = target.model.forward


def timed_forward(*a, **k):
    t0 = time.perf_counter()
    out = forward(*a, **k)
    if not k.get("prefill") and arm[0] != "warm-up":
        fwd.setdefault(arm[0], []).append(time.perf_counter() - t0)
    return out


target.model.forward = timed_forward
steps: dict = {}
faults: dict = {}
with torch.inference_mode():
    for p in range(passes):
        for g, group in enumerate(groups):
            k = p * len(groups) + g
            order = list(arms)[k % 3:] + list(arms)[:k % 3]
            for a in order:
                arm[0] = a if k else "warm-up"
                eng = arms[a]
                for i, r in enumerate(group):
                    eng.submit(i, r)
                while not eng.idle:
                    prefill = bool(eng.waiting)
                    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
                    eng.step()
                    t1, f1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    if not prefill and k:
                        steps.setdefault(a, []).append(t1 - t0)
                        faults.setdefault(a, []).append(f1 - f0)
print(f"{len(reqs)} prompts, batch {batch}, T={temp}, {passes} passes (the first group a warm-up, left out)")
print("arm | decode steps | step median ms | forward median ms | forward mean ms | minor faults a step (mean) | steps with any")
for a in arms:
    print(a, len(steps[a]), f"{statistics.median(steps[a]) * 1e3:.3f}", f"{statistics.median(fwd[a]) * 1e3:.3f}",
          f"{statistics.mean(fwd[a]) * 1e3:.3f}", f"{statistics.mean(faults[a]):.1f}",
          f"{sum(f > 0 for f in faults[a]) / len(faults[a]):.2f}", sep=" | ")
