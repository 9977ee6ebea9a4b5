# measure_draft's two readings before calibration version 15 (the drafting seconds, and the floor from the side-by-side step ratio) for the chain of 1 at batch 1, N rounds; reads the latest cached calibration. Usage: draft_diag.py N
import sys, statistics, time, torch, json, glob, os
from eaglespec.runtime.loading import load_target
from eaglespec.engine import calibrate as cal
from eaglespec.spec.speculative import DraftOptions, build_proposer
from eaglespec.spec.strategies import Chain
torch.set_num_threads(2)
t = load_target()
path = max(glob.glob(os.path.expanduser("~/.cache/eaglespec/calibration/*.json")), key=os.path.getmtime)
costs = cal._from_json(json.load(open(path)))
print("plain priced", costs.verify_cost(1, 1, 96) * 1e3, "chain1 verify priced", costs.verify_cost(1, 2, 96) * 1e3, "draft", costs.draft_cost(1, "chain1") * 1e3)
mk = lambda tree: build_proposer(t, DraftOptions(tree="chain", depth=1))
prompt = list(range(5, 5 + 64))
with torch.inference_mode():
    cal._step_times(t, mk(None), 1, cal.SHORT_STEPS, prompt)
    for rep in range(int(sys.argv[1])):
        _, short = cal._step_times(t, mk(None), 1, cal.SHORT_STEPS, prompt)
        times, long = cal._step_times(t, mk(None), 1, cal.LONG_STEPS, prompt)
        fw = long.target_forwards - short.target_forwards
        absolute = (long.draft_s - short.draft_s) / fw
        plain, _ = cal._step_times(t, None, 1, cal.LONG_STEPS, prompt)
        ratio = statistics.median(times) / statistics.median(plain)
        rb = ratio * costs.verify_cost(1, 1, 96) - costs.verify_cost(1, 2, 96)
        q = lambda xs, f: sorted(xs)[int(f * (len(xs) - 1))]
        print(f"q25 ratio {q(times, .25)/q(plain, .25):.3f} q10 {q(times, .1)/q(plain, .1):.3f} n {len(times)} {len(plain)}")
        print(f"abs {absolute*1e3:.3f} ratio {ratio:.3f} ratio-based {rb*1e3:.3f} | tree med {statistics.median(times)*1e3:.3f} min {min(times)*1e3:.3f} plain med {statistics.median(plain)*1e3:.3f} min {min(plain)*1e3:.3f} fw {fw}")
