# each arm's decode step time keyed by (this step's tree, the previous step's tree), one process, arms rotating
import collections
import time

import torch

from arms import from_argv
from eaglespec.measure.ab import rotate_arms
reqs, passes, arms = from_argv()
names = list(arms)
tab = {n: collections.defaultdict(lambda: [0, 0.0]) for n in names}
for n, eng in arms.items():
    step, prop = eng._step, eng.proposer
    st = {"prev": None}
    def step_(seqs, _step=step, _n=n, _st=st, _p=prop):
        t0 = time.perf_counter(); out = _step(seqs); dt = time.perf_counter() - t0
        lab = getattr(_p, "step_label", "vanilla") if _p is not None else "vanilla"
        c = tab[_n][(lab, _st["prev"] == lab)]; c[0] += 1; c[1] += dt
        _st["prev"] = lab
        return out
    eng._step = step_
with torch.inference_mode():
    tot = rotate_arms(arms, reqs, 1, passes)
for n in names:
    print(n, " ".join(f"{k[0]}{'' if k[1] else '(switched)'}:{c[0]}x{1e3 * c[1] / c[0]:.3f}" for k, c in sorted(tab[n].items(), key=str)))
