# Per-step phases of vanilla and of `--tree auto` paused at batch 4 (T=1), arms alternating per group, one process:
# draft_s (propose + commit: the proposer's work) and verify_s (target forward + verification) per step.
import sys, time, statistics
import torch
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions
allocator.tune(); torch.set_num_threads(2)
path, per_cat, batch, temp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
target = load_target(None)
prompts = [encode_messages(target.tokenizer, [{"role": "user", "content": q.turns[0]}])
           for q in load_questions(path, per_category=per_cat)]
reqs = [Request(p, GenerationConfig(128, SamplingParams(temperature=temp, seed=i), ignore_eos=True))
        for i, p in enumerate(prompts)]
arms = {"vanilla": Engine(target, None, max_batch_size=batch),
        "auto": Engine(target, build_calibrated_proposer(target, DraftOptions()), max_batch_size=batch)}
d = arms["auto"].proposer.dispatcher  # held paused, no probe: the paused step alone
d.margin, d.keep_margin, d.probe_every, d.max_probe_every = 100.0, None, 10**6, 10**6
acc = {n: [0.0, 0.0, 0] for n in arms}
with torch.inference_mode():
    for gi, g in enumerate(range(0, len(reqs), batch)):
        for n in (list(arms) if gi % 2 else list(arms)[::-1]):
            done = arms[n].generate(reqs[g:g + batch])
            if gi == 0: continue
            c = max(done, key=lambda c: c.stats.draft_s + c.stats.verify_s)
            steps = c.stats.steps if hasattr(c.stats, "steps") else len(c.token_ids)
            acc[n][0] += c.stats.draft_s; acc[n][1] += c.stats.verify_s; acc[n][2] += len(c.token_ids)
for n, (d, v, k) in acc.items():
    print(f"{n:8s} per step: proposer {d / k * 1e3:.3f} ms, forward+verify {v / k * 1e3:.3f} ms")
