# Where a paused batch-4 step's proposer time goes: `--tree auto` (the machine's calibration) over MT-bench first
# turns (3 a category, 24) at batch 4, 128 tokens, T=0, timing the dispatcher's pick, the rest of propose() less
# the catch-ups, the catch-ups (look-back probes), and commit() (the paused step's record), against the step's
# forward. Usage: paused_split.py MT_BENCH_JSONL
import collections, os, sys, time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import setup
from eaglespec.config import GenerationConfig
from eaglespec.engine.generate import Engine, Request

t, prompts, p = setup(sys.argv[1], per_category=3)
d = p.dispatcher
spent = collections.Counter()
calls = collections.Counter()


def timed(name, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[name] += time.perf_counter() - t0
            calls[name] += 1
    return wrapper


d.pick = timed("pick", d.pick)
p._catch_up = timed("catch_up", p._catch_up)
p.propose = timed("propose", p.propose)
p.commit = timed("commit", p.commit)
p.observe_step_time = timed("observe_step_time", p.observe_step_time)
t.model.forward = timed("forward", t.model.forward)
engine = Engine(t, p, max_batch_size=4)
reqs = [Request(x, GenerationConfig(128, ignore_eos=True)) for x in prompts]
with torch.inference_mode():
    engine.generate(reqs[:4])  # warm-up
    spent.clear(); calls.clear()
    done = engine.generate(reqs)
rounds = collections.Counter()
for c in done:
    rounds.update(c.stats.tree_rounds)
steps = calls["propose"]
print("rounds by tree (summed over rows):", dict(rounds), "steps:", steps)
for k in ("forward", "propose", "pick", "catch_up", "commit", "observe_step_time"):
    print(f"{k:18s} calls {calls[k]:5d}  total {spent[k] * 1e3:8.1f} ms  per step {spent[k] / steps * 1e6:8.1f} us")
print(f"propose less pick and catch-ups: {(spent['propose'] - spent['pick'] - spent['catch_up']) / steps * 1e6:.1f} us a step")
