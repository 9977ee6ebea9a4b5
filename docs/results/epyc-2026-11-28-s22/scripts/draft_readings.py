# measure_draft's readings (greedy, the calibration's candidates and order), each printed: the paired median
# difference, the forwards' priced difference, the head's own seconds per step in that run.
import json, statistics, sys, torch
from pathlib import Path
from eaglespec.engine import calibrate as C
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
from eaglespec.spec.proposer import EagleProposer
allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"))
t = load_target()
opts = DraftOptions(tree="auto")
p = build_proposer(t, DraftOptions(tree="chain", depth=1)); head = p.head
costs, _ = C.calibration_for(t, head, Path(sys.argv[1]), opts)
cands = {c.label: c for c in C.calibration_candidates(opts)}
only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(cands)
batches = [int(x) for x in (sys.argv[3].split(",") if len(sys.argv) > 3 else ["1", "8"])]
prompt = list(range(5, 21))
with torch.inference_mode():
    for rep in range(3):
        for label in only:
            tree = cands[label]
            if not tree.drafts: continue
            for b in batches:
                if rep == 0 and b == batches[0]:
                    C._step_times(t, EagleProposer(head, tree), 1, C.SHORT_STEPS, prompt)
                times, plain, st = C._paired_steps(t, EagleProposer(head, tree), b, C.LONG_STEPS, prompt)
                ctx = len(prompt) + C.LONG_STEPS // 2
                priced = costs.verify_cost(b, tree.num_nodes, ctx) - costs.verify_cost(b, 1, ctx)
                d = statistics.median(x - y for x, y in zip(times, plain))
                print(f"rep {rep} {label:14s} b{b}: tree {statistics.median(times)*1e3:6.2f} plain {statistics.median(plain)*1e3:6.2f} "
                      f"diff {d*1e3:6.2f} priced {priced*1e3:5.2f} -> {1e3*(d-priced):6.2f}  head {1e3*st.draft_s/max(st.target_forwards,1):5.2f}", flush=True)
