# Where the calibration's chain price comes from at batch 1 (T=0): verify(1, n) timed as calibrate does
# (n after n) and in interleaved rounds; paired tree/plain steps at the calibration's prompt (16 tokens, 20 steps)
# and at a realistic one (150 tokens, 128 steps).
import statistics, sys, time, torch
from eaglespec.engine import calibrate as C
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
from eaglespec.spec.strategies import Chain
from eaglespec.spec.proposer import EagleProposer
allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "torch", torch.__version__)
t = load_target()
p = build_proposer(t, DraftOptions(tree="chain", depth=1))
head = p.head
def make(tree): return EagleProposer(head, tree)
dev = t.model.device
with torch.inference_mode():
    for rep in range(2):
        seq = C.measure_verify(t.model, (1,), (1, 2, 4, 8))
        print("sequential", {k[1]: round(v * 1e3, 2) for k, v in seq.items()}, "v2/v1 %.3f" % (seq[(1, 2)] / seq[(1, 1)]))
    for L, steps in ((16, 20), (150, 128)):
        prompt = list(range(5, 5 + L))
        for depth in (1, 2):
            rs = []
            for rep in range(3):
                tr, pl, _ = C._paired_steps(t, make(Chain(depth)), 1, steps, prompt)
                rs.append((statistics.median(tr) / statistics.median(pl), statistics.median(a - b for a, b in zip(tr, pl)) * 1e3, statistics.median(pl) * 1e3))
            print(f"prompt {L} steps {steps} chain{depth}: ratio " + " ".join("%.3f" % r[0] for r in rs) + "  diff ms " + " ".join("%.2f" % r[1] for r in rs) + "  plain ms " + " ".join("%.2f" % r[2] for r in rs))
