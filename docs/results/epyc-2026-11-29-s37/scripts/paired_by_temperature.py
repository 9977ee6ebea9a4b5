"""The calibration's paired measurement (a chain's decode steps against a plain engine's, stepped in turns:
`eaglespec.engine.calibrate._paired_steps`) greedy and sampled, on the calibration's prompt and on real first turns,
in rounds: median tree step / plain step, and the draft tokens accepted a step.

    python paired_by_temperature.py QUESTIONS N_QUESTIONS ROUNDS [STEPS]
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
target = load_target(None)
real = [r.prompt_ids for r in first_turn_requests(target.tokenizer, path, n, 0.0)][:n]
prompts = {"calibration": list(range(5, 5 + min(calibrate.PREFIX, calibrate.DRAFT_PROMPT))),
           **{f"real{i} ({len(p)} tok)": p for i, p in enumerate(real)}}
ratios: dict[tuple, list[float]] = {}
accepted: dict[tuple, list[float]] = {}
with torch.inference_mode():
    for d in (1, 2):  # warm-up
        for t in (0.0, 1.0):
            calibrate._paired_steps(target, build_proposer(target, DraftOptions(tree="chain", depth=d)), 1, 4,
                                    prompts["calibration"], t)
    for _ in range(rounds):
        for name, prompt in prompts.items():
            for d in (1, 2):
                for t in (0.0, 1.0):
                    times, plain, stats = calibrate._paired_steps(
                        target, build_proposer(target, DraftOptions(tree="chain", depth=d)), 1, steps, prompt, t)
                    ratios.setdefault((name, d, t), []).extend(a / b for a, b in zip(times, plain))
                    accepted.setdefault((name, d, t), []).append(
                        sum(stats.accepted_per_position) / max(stats.target_forwards, 1))
print(f"{steps} steps a reading, {rounds} rounds; median tree step / plain step (accepted draft tokens a step)")
for name in prompts:
    print(f"{name:<18}", "  ".join(f"chain{d} T={t:g} {statistics.median(ratios[(name, d, t)]):.3f} "
                                   f"({statistics.fmean(accepted[(name, d, t)]):.2f})"
                                   for d in (1, 2) for t in (0.0, 1.0)))
