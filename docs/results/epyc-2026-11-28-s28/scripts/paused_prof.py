# Where `--tree auto` at T=1, batch 1, loses to plain decoding when it pauses most of the time: one process, a
# plain engine and an auto engine (the cached calibration) alternating per prompt over the first turn of one
# question per category (10 prompts, 128 sampled tokens each, EOS ignored, seed per prompt), each under its own
# cProfile (the profiler's own cost inflates Python-heavy code, so only the differences between the arms are
# read). Prints both walls, auto's rounds per tree, and the 25 functions whose own time differs most.
#   python paused_prof.py QUESTIONS.jsonl [TEMPERATURE]
import cProfile, pstats, sys, time

import torch

from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions

allocator.tune()
torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
target = load_target(None)
prompts = [encode_messages(target.tokenizer, [{"role": "user", "content": q.turns[0]}])
           for q in load_questions(sys.argv[1], per_category=1)][:10]
T = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
reqs = [Request(x, GenerationConfig(128, ignore_eos=True, sampling=SamplingParams(temperature=T, seed=i)))
        for i, x in enumerate(prompts)]
engines = {"vanilla": Engine(target, None, max_batch_size=1),
           "auto": Engine(target, build_calibrated_proposer(target, DraftOptions()), max_batch_size=1)}
walls, rounds = {k: 0.0 for k in engines}, {}
profs = {k: cProfile.Profile() for k in engines}
with torch.inference_mode():
    for e in engines.values():
        e.generate(reqs[:1])  # warm-up
    for r in reqs:
        for k, e in engines.items():
            t0 = time.perf_counter()
            profs[k].enable()
            out = e.generate([r])
            profs[k].disable()
            walls[k] += time.perf_counter() - t0
            if k == "auto":
                for c in out:
                    for tree, n in (c.stats.tree_rounds or {}).items():
                        rounds[tree] = rounds.get(tree, 0) + n
print(f"walls (profiled): vanilla {walls['vanilla']:.3f} s, auto {walls['auto']:.3f} s "
      f"({walls['vanilla'] / walls['auto']:.3f}x); auto's rounds {rounds}")
a, v = (pstats.Stats(profs[k]).stats for k in ("auto", "vanilla"))
rows = []
for key in set(a) | set(v):
    (_, na, ta, _, _), (_, nv, tv, _, _) = a.get(key, (0, 0, 0.0, 0, {})), v.get(key, (0, 0, 0.0, 0, {}))
    rows.append((ta - tv, key, ta, tv, na, nv))
rows.sort(key=lambda x: -x[0])
print(f"own time in all functions: auto {sum(x[2] for x in rows):.3f} s, vanilla {sum(x[3] for x in rows):.3f} s")
print("| auto - vanilla (ms) | auto s (calls) | vanilla s (calls) | function |\n|---|---|---|---|")
for d, key, ta, tv, na, nv in rows[:25]:
    print(f"| {d * 1e3:.1f} | {ta:.3f} ({na}) | {tv:.3f} ({nv}) | {key[2]} {key[0].rsplit('/', 1)[-1]}:{key[1]} |")
