# the version-15 floor (steps less their forwards, tree run beside a plain run) for the chain of 1 at batch 1, N rounds, with the forwards' difference. Usage: draft_diag2.py N
import sys, statistics, torch
from eaglespec.runtime.loading import load_target
from eaglespec.engine import calibrate as cal
from eaglespec.spec.speculative import DraftOptions, build_proposer
torch.set_num_threads(2)
t = load_target()
mk = lambda: build_proposer(t, DraftOptions(tree="chain", depth=1))
prompt = list(range(5, 5 + 64))
with torch.inference_mode():
    cal._step_times(t, mk(), 1, cal.SHORT_STEPS, prompt)
    for rep in range(int(sys.argv[1])):
        _, short = cal._step_times(t, mk(), 1, cal.SHORT_STEPS, prompt)
        tf = []; times, long = cal._step_times(t, mk(), 1, cal.LONG_STEPS, prompt, forwards=tf)
        absolute = (long.draft_s - short.draft_s) / (long.target_forwards - short.target_forwards)
        pf = []; plain, _ = cal._step_times(t, None, 1, cal.LONG_STEPS, prompt, forwards=pf)
        tnf = statistics.median(a - b for a, b in zip(times, tf)); pnf = statistics.median(a - b for a, b in zip(plain, pf))
        q = lambda xs: sorted(xs)[(len(xs) - 1) // 4]
        print(f"fwd q25 diff {(q(tf) - q(pf))*1e3:.3f} min diff {(min(tf) - min(pf))*1e3:.3f} n {len(tf)} {len(pf)}")
        print(f"abs {absolute*1e3:.3f} beyond {(tnf - pnf)*1e3:.3f} (tree nf {tnf*1e3:.3f} plain nf {pnf*1e3:.3f}) | tree fwd med {statistics.median(tf)*1e3:.3f} plain fwd med {statistics.median(pf)*1e3:.3f}")
