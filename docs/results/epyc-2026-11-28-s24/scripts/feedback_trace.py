# Every step the step-cost feedback timed, with its label and calibrated price: where the measured / priced ratios
# of plain and drafting steps come from. Spec-Bench first turns (2 a category), 128 tokens, greedy, batch 1, the
# machine's own calibration, the default `--tree auto`. Prints the ratios by label and by the step's place (the
# first step of a label after another label, or a later one), and writes every step to OUT.jsonl.
# Usage: feedback_trace.py SPEC_BENCH_JSONL OUT.jsonl
import json, os, statistics, sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import setup
from eaglespec.config import GenerationConfig
from eaglespec.engine.generate import Engine, Request

t, prompts, proposer = setup(sys.argv[1], per_category=2, tune_allocator=False)
d = proposer.dispatcher
log = []
orig = d.observe_step


def observe_step(b, s):
    priced = d.step.step_s / d.step.factor
    log.append({"batch": b, "label": d.step.label, "measured_s": s, "priced_s": priced, "factor": d.step.factor})
    orig(b, s)


d.observe_step = observe_step
engine = Engine(t, proposer, max_batch_size=1)
with torch.inference_mode():
    engine.generate([Request(prompts[0], GenerationConfig(16, ignore_eos=True))])  # warm-up
    log.clear()
    for p in prompts:
        for _ in engine.generate([Request(p, GenerationConfig(128, ignore_eos=True))]):
            pass
with open(sys.argv[2], "w") as f:
    for r in log:
        f.write(json.dumps(r) + "\n")
groups = defaultdict(list)
last = None
for r in log:
    place = "first" if r["label"] != last else "later"
    groups[(r["label"], place)].append(r["measured_s"] / r["priced_s"])
    last = r["label"]
for (label, place), v in sorted(groups.items()):
    print(f"{label:8s} {place:5s} steps {len(v):5d}  ratio median {statistics.median(v):.3f}  mean {statistics.fmean(v):.3f}")
