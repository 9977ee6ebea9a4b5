# the final version-15 floor (the chain-of-1 engine stepped in turns with a plain one: the median step difference,
# less the priced forward difference from the latest cached calibration) at batch B, N rounds. Usage: draft_diag3.py N [B]
import glob, json, os, statistics, sys, torch
from eaglespec.runtime.loading import load_target
from eaglespec.engine import calibrate as cal
from eaglespec.spec.speculative import DraftOptions, build_proposer
torch.set_num_threads(2)
t = load_target()
b = int(sys.argv[2]) if len(sys.argv) > 2 else 1
costs = cal._from_json(json.load(open(max(glob.glob(os.path.expanduser("~/.cache/eaglespec/calibration/*.json")), key=os.path.getmtime))))
mk = lambda: build_proposer(t, DraftOptions(tree="chain", depth=1))
prompt = list(range(5, 5 + 64))
ctx = len(prompt) + cal.LONG_STEPS // 2
priced = costs.verify_cost(b, 2, ctx) - costs.verify_cost(b, 1, ctx)
with torch.inference_mode():
    cal._step_times(t, mk(), 1, cal.SHORT_STEPS, prompt)
    for rep in range(int(sys.argv[1])):
        _, short = cal._step_times(t, mk(), b, cal.SHORT_STEPS, prompt)
        tree, plain, long = cal._paired_steps(t, mk(), b, cal.LONG_STEPS, prompt)
        absolute = (long.draft_s - short.draft_s) / (long.target_forwards - short.target_forwards)
        diff = statistics.median(x - y for x, y in zip(tree, plain))
        print(f"b{b} drafting {absolute*1e3:.3f} ms | paired floor {(diff - priced)*1e3:.3f} (step difference {diff*1e3:.3f}, "
              f"priced forwards' difference {priced*1e3:.3f}) | tree median {statistics.median(tree)*1e3:.3f} plain {statistics.median(plain)*1e3:.3f}")
