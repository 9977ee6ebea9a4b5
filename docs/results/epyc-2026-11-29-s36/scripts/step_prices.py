"""Each arm's decode steps against the calibrated price of what they did, in one process (arms rotating per group,
eaglespec.measure.ab): measured / priced seconds (the price from `--tree auto`'s calibration, as its step-cost
feedback prices a step) by arm, tree and the step's situation: `steady` (the step before ran the same tree),
`switched` (it ran another), `caught-up` (this step also caught the draft cache up: auto does not time it), and
whether auto's feedback timed it. Medians, and means of the ratios.

    python step_prices.py QUESTIONS PER_CATEGORY TEMPERATURE PASSES ARM...
"""
import collections
import statistics
import sys
import time

import torch

from eaglespec.measure.ab import arm_engine, first_turn_requests, rotate_arms
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target

allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
path, per_cat, temp, passes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
target = load_target(None)
reqs = first_turn_requests(target.tokenizer, path, per_cat, temp)
arms = {n: arm_engine(target, n, 1) for n in sys.argv[5:]}
auto = next(e for n, e in arms.items() if n.startswith("auto"))
rows = collections.defaultdict(list)  # (arm, tree, situation) -> ratios


def price(label: str, context: float, paused: bool) -> float:
    d = auto.proposer.dispatcher
    costs = d._sampled_costs if temp > 0 and d._sampled_costs is not None else d.costs
    if label in ("none", "vanilla"):
        return costs.verify_cost(1, 1, context) + (costs.paused_cost(1) if paused else 0.0)
    return costs.verify_cost(1, int(label[5:]) + 1, context) + (costs.draft_cost(1, label) or 0.0)


for name, eng in arms.items():
    step, prop, state = eng._step, eng.proposer, {"prev": None}

    def step_(seqs, _step=step, _name=name, _prop=prop, _state=state):
        context = sum(s.length for s in seqs) / len(seqs)
        t0 = time.perf_counter()
        out = _step(seqs)
        dt = time.perf_counter() - t0
        label = getattr(_prop, "step_label", None) or "vanilla" if _prop is not None else "vanilla"
        caught = _prop is not None and label not in ("none", "vanilla") and getattr(_prop, "_caught", False)
        where = "caught-up" if caught else ("steady" if _state["prev"] == label else "switched")
        rows[(_name, label, where)].append(dt / price(label, context, _name.startswith("auto")))
        _state["prev"] = label
        return out
    eng._step = step_
    if prop is not None and hasattr(prop, "_catch_up"):
        catch = prop._catch_up
        propose = prop.propose

        def propose_(*a, _prop=prop, _propose=propose, **k):
            _prop._caught = False
            return _propose(*a, **k)

        def catch_(*a, _prop=prop, _catch=catch, **k):
            _prop._caught = True
            return _catch(*a, **k)
        prop.propose, prop._catch_up = propose_, catch_

with torch.inference_mode():
    rotate_arms(arms, reqs, 1, passes)
print(f"{'arm':<24} {'tree':<8} {'situation':<10} {'steps':>6} {'median':>7} {'mean':>7}")
for (name, label, where), rs in sorted(rows.items()):
    print(f"{name:<24} {label:<8} {where:<10} {len(rs):>6} {statistics.median(rs):>7.3f} {statistics.fmean(rs):>7.3f}")
fb = auto.proposer.dispatcher.feedback
if fb is not None:
    print("auto's price checks at the end:", [e for e in fb.snapshot() if e["batch"] == 1])
