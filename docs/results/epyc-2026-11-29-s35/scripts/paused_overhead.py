"""The host work of a paused decode step: a step's wall time less its target forward and verification (the
engine's `verify_s`), per step, for vanilla and for `--tree auto` kept paused throughout (`margin=100`: it never
drafts and never looks back), with and without quiet runs (`asked`: `quiet_run` answers 0, so every paused step
asks the dispatcher, as before session 35). Each request is decoded by the three engines in turn, in one process.

    PYTHONPATH=. python paused_overhead.py QUESTIONS PER_CATEGORY TEMPERATURE

Prints each arm's median and mean host microseconds a step over the requests and, per arm, the median and mean of
its per-request difference from vanilla's.
"""
import statistics
import sys
import time

import torch

from eaglespec.measure.ab import arm_engine, first_turn_requests
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target

allocator.tune()
torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
target = load_target(None)
reqs = first_turn_requests(target.tokenizer, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
paused = "auto:margin=100.0,keep_margin=None"  # (a sampled batch asks at least this margin too)
arms = {"vanilla": arm_engine(target, "vanilla", 1), "paused": arm_engine(target, paused, 1),
        "asked": arm_engine(target, paused, 1)}
arms["asked"].proposer.dispatcher.quiet_run = lambda: 0  # every paused step asks the dispatcher
walls = {}
for name, engine in arms.items():
    def timed(seqs, step=engine._step, name=name):
        t = time.perf_counter()
        out = step(seqs)
        walls[name] += time.perf_counter() - t
        return out
    engine._step = timed
for engine in arms.values():  # warm-up
    for r in reqs[:2]:
        walls.clear()
        walls.update(dict.fromkeys(arms, 0.0))
        engine.generate([r])
host = {name: [] for name in arms}
for r in reqs:
    for name, engine in arms.items():
        walls[name] = 0.0
        c = engine.generate([r])[0]
        steps = c.stats.new_tokens - 1  # every step commits one token: nothing is drafted
        host[name].append((walls[name] - c.stats.verify_s) / steps * 1e6)
for name, v in host.items():
    print(f"{name:8s} host us/step median {statistics.median(v):6.1f} mean {statistics.mean(v):6.1f}")
for name in ("paused", "asked"):
    d = [a - b for a, b in zip(host[name], host["vanilla"])]
    print(f"{name} - vanilla host us/step: median {statistics.median(d):.1f} mean {statistics.mean(d):.1f} "
          f"(n={len(d)})")
