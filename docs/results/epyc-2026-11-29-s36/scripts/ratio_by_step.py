"""A chain's decode step against a plain engine's, stepped in turns (`eaglespec.engine.calibrate._paired_steps`),
by step index into the request: the median ratio and the two engines' median step in ms per window of steps, on a
prompt of PROMPT consecutive token ids, or (PROMPT a dataset file) on the first turn of its first question.

    python ratio_by_step.py DEPTH STEPS PROMPT [WINDOW]
"""
import statistics
import sys

import torch

from eaglespec.engine import calibrate
from eaglespec.measure.ab import first_turn_requests
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer

allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
depth, steps = int(sys.argv[1]), int(sys.argv[2])
window = int(sys.argv[4]) if len(sys.argv) > 4 else 32
target = load_target(None)
prompt = list(range(5, 5 + int(sys.argv[3]))) if sys.argv[3].isdigit() else \
    first_turn_requests(target.tokenizer, sys.argv[3], 1, 0.0)[0].prompt_ids
length = len(prompt)
with torch.inference_mode():
    calibrate._paired_steps(target, build_proposer(target, DraftOptions(tree="chain", depth=depth)), 1, 8, prompt)
    tree, plain, stats = calibrate._paired_steps(
        target, build_proposer(target, DraftOptions(tree="chain", depth=depth)), 1, steps, prompt)
print(f"chain{depth}, {steps} steps from a {length}-token prompt; accepted draft tokens a step "
      f"{sum(stats.accepted_per_position) / max(stats.target_forwards, 1):.2f}")
for i in range(0, len(tree), window):
    t, p = tree[i:i + window], plain[i:i + window]
    print(f"steps {i + 3:>4}-{i + 2 + len(t):<4} ratio {statistics.median(a / b for a, b in zip(t, p)):.3f}  "
          f"tree {1e3 * statistics.median(t):.2f} ms  plain {1e3 * statistics.median(p):.2f} ms")
