# a fixed chain's drafting step time by how many draft tokens the round before accepted (what the next draft
# forward must ingest), one process, arms rotating
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
    state = {"prev": None, "k": None}
    commit = prop.commit if prop is not None else None
    def step_(seqs, _step=step, _n=n, _st=state):
        t0 = time.perf_counter(); out = _step(seqs); dt = time.perf_counter() - t0
        key = _st["prev"]
        c = tab[_n][key]; c[0] += 1; c[1] += dt
        _st["prev"] = _st["k"]
        return out
    eng._step = step_
    if commit is not None:
        def commit_(rows, tree, verdict, out, n_accepted=None, _c=commit, _st=state):
            _st["k"] = (n_accepted if n_accepted is not None else verdict.n_accepted.tolist())[0]
            return _c(rows, tree, verdict, out, n_accepted)
        prop.commit = commit_
with torch.inference_mode():
    tot = rotate_arms(arms, reqs, 1, passes)
for n in names:
    print(n, {k: (c[0], round(1e3 * c[1] / c[0], 3)) for k, c in sorted(tab[n].items(), key=lambda x: str(x[0]))})
