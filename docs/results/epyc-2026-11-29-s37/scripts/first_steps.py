# Per-step measured / priced ratios of the auto arm's first requests in a fresh process (after a bench-like
# 8-token warm-up): is a tree's first use slow?
# python first_steps.py QUESTIONS N [ARM]   (the first N questions, T=0, batch 1; ARM default auto)
# ARM: as in eaglespec.measure.ab.arm_engine (vanilla | chain<D> | auto[:ATTR=VALUE,...])
import sys, statistics, torch
from dataclasses import replace
from eaglespec.measure.ab import arm_engine, first_turn_requests
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
from eaglespec.spec import costmodel
allocator.tune(); torch.set_num_threads(2)
path, n = sys.argv[1], int(sys.argv[2]); arm = sys.argv[3] if len(sys.argv) > 3 else "auto"
target = load_target(None)
reqs = first_turn_requests(target.tokenizer, path, 1000, 0.0)[:n]
log = []
orig = costmodel.StepCostFeedback.observe
def obs(self, batch, label, m, p, context=None):
    log.append((label, m / p)); return orig(self, batch, label, m, p, context)
costmodel.StepCostFeedback.observe = obs
eng = arm_engine(target, arm, 1)
with torch.inference_mode():
    eng.generate([replace(reqs[0], config=replace(reqs[0].config, max_new_tokens=8))])
    print("warm-up", [(l, round(r, 2)) for l, r in log]); log.clear()
    for i, r in enumerate(reqs):
        eng.generate([r])
        by = {}
        for l, x in log: by.setdefault(l, []).append(x)
        print(i, {l: (len(v), round(statistics.median(v), 2), [round(x, 2) for x in v[:12]]) for l, v in by.items()})
        log.clear()
