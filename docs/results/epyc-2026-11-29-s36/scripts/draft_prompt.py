"""Does the calibration's prompt price the chains as the engine pays on real text? The calibration times a tree's
decode steps against a plain engine's, stepped in turns (`eaglespec.engine.calibrate._paired_steps`), on a
16-token prompt of consecutive token ids, 20 steps. This times the same pairs on that prompt and on the first turns
of real questions (through the chat template), for each chain, in rounds over the prompts, and prints the median
step ratio (tree step / plain step) and the draft tokens the tree's first request accepted a step.

    python draft_prompt.py QUESTIONS N_QUESTIONS ROUNDS [STEPS [LONG]]

STEPS: steps a reading (the calibration's 20 by default); LONG: also time a synthetic prompt of LONG consecutive
token ids (a long context over few steps).
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
path, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
steps = int(sys.argv[4]) if len(sys.argv) > 4 else calibrate.LONG_STEPS
long = int(sys.argv[5]) if len(sys.argv) > 5 else 0
target = load_target(None)
real = [r.prompt_ids for r in first_turn_requests(target.tokenizer, path, n, 0.0)][:n]
prompts = {"calibration": list(range(5, 5 + min(calibrate.PREFIX, calibrate.DRAFT_PROMPT))),
           **({f"synthetic ({long} tok)": list(range(5, 5 + long))} if long else {}),
           **{f"real{i} ({len(p)} tok)": p for i, p in enumerate(real)}}
ratios: dict[tuple[str, int], list[float]] = {}
accepted: dict[tuple[str, int], list[float]] = {}
with torch.inference_mode():
    for d in (1, 2, 3):  # warm-up
        calibrate._paired_steps(target, build_proposer(target, DraftOptions(tree="chain", depth=d)), 1, 4,
                                prompts["calibration"])
    for _ in range(rounds):
        for name, prompt in prompts.items():
            for d in (1, 2, 3):
                times, plain, stats = calibrate._paired_steps(
                    target, build_proposer(target, DraftOptions(tree="chain", depth=d)), 1, steps, prompt)
                ratios.setdefault((name, d), []).extend(t / p for t, p in zip(times, plain))
                acc = sum(stats.accepted_per_position) / max(stats.target_forwards, 1)
                accepted.setdefault((name, d), []).append(acc)
print(f"{steps} steps a reading, {rounds} rounds; tree step / plain step over all steps: median / mean (accepted "
      "draft tokens a step)")
for name in prompts:
    print(f"{name:<22}", "  ".join(f"chain{d} {statistics.median(ratios[(name, d)]):.3f} / "
                                   f"{statistics.fmean(ratios[(name, d)]):.3f} ({statistics.fmean(accepted[(name, d)]):.2f})"
                                   for d in (1, 2, 3)))
