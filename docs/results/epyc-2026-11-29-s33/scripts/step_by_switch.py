# each arm's decode step time keyed by (this step's tree, the previous step's tree), one process, arms rotating
import sys, time, collections, torch
from eaglespec.measure.ab import arm_engine, first_turn_requests, rotate_arms
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"))
target = load_target(None)
reqs = first_turn_requests(target.tokenizer, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
names = sys.argv[5:]
arms = {n: arm_engine(target, n, 1) for n in names}
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
    tot = rotate_arms(arms, reqs, 1, int(sys.argv[4]))
for n in names:
    print(n, " ".join(f"{k[0]}{'' if k[1] else '(switched)'}:{c[0]}x{1e3 * c[1] / c[0]:.3f}" for k, c in sorted(tab[n].items(), key=str)))
