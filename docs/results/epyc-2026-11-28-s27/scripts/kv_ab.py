# The KV cache in float32 against float16 (`--kv-dtype`) on the default int4 (w4a8) target, in one process.
#   python kv_ab.py QUESTIONS.jsonl PER_CATEGORY BATCH [PASSES]
# First turns (PER_CATEGORY a category), 128 greedy tokens each (EOS ignored), at batch BATCH. Four arms: plain
# decoding and `--tree auto` (each cache dtype with its own calibration, measured first if not cached), with
# a float32 and a float16 cache. Each pass runs every arm over every group of BATCH prompts, the arms in a
# rotating order per group; the first group of the first pass is a warm-up and not counted. Printed: per arm the
# wall tok/s (prompt included) and the decode steps' tok/s, float16 / float32 per method, auto's tree shares,
# and whether each float16 arm's greedy output equals the float16 plain one (lossless) and the float32 one.
import sys

import torch

from eaglespec.config import GenerationConfig
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.measure.ab import rotate_arms
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions

allocator.tune()
torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
path, per_cat, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
passes = int(sys.argv[4]) if len(sys.argv) > 4 else 2
target = load_target(None)
prompts = [encode_messages(target.tokenizer, [{"role": "user", "content": q.turns[0]}])
           for q in load_questions(path, per_category=per_cat)]
print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, batch {batch}")
reqs = [Request(p, GenerationConfig(128, ignore_eos=True)) for p in prompts]
arms, kv_of = {}, {}
for kv in (torch.float32, torch.float16):
    target.model.kv_dtype = kv  # auto calibrates in this dtype; each engine allocates its cache in its own below
    name = str(kv).removeprefix("torch.")
    arms[f"vanilla/{name}"] = Engine(target, None, max_batch_size=batch)
    arms[f"auto/{name}"] = Engine(target, build_calibrated_proposer(target, DraftOptions()), max_batch_size=batch)
    kv_of[f"vanilla/{name}"] = kv_of[f"auto/{name}"] = kv


def use(name):
    target.model.kv_dtype = kv_of[name]  # read when the engine (re)allocates its cache


def check(name):
    assert arms[name].cache.k.dtype == kv_of[name]


with torch.inference_mode():
    tot = rotate_arms(arms, reqs, batch, passes, before=use, after=check)  # eaglespec.measure.ab's protocol
names = list(arms)
for name in names:
    t = tot[name]
    print(f"{name:16s} wall {t.tokens / t.wall_s:7.1f} tok/s  decode {t.tokens / t.decode_s:7.1f} tok/s"
          + (f"  rounds {dict(t.rounds)}" if t.rounds else ""))
for m in ("vanilla", "auto"):
    print(f"{m}: float16 / float32 wall {tot[f'{m}/float32'].wall_s / tot[f'{m}/float16'].wall_s:.3f}x, decode "
          f"{tot[f'{m}/float32'].decode_s / tot[f'{m}/float16'].decode_s:.3f}x")
same = lambda a, b: sum(tot[a].outputs[i] == tot[b].outputs[i] for i in tot[a].outputs)
print(f"greedy identical: auto/float16 = vanilla/float16 {same('auto/float16', 'vanilla/float16')} / {len(reqs)}; "
      f"auto/float32 = vanilla/float32 {same('auto/float32', 'vanilla/float32')} / {len(reqs)}; "
      f"vanilla/float16 = vanilla/float32 {same('vanilla/float16', 'vanilla/float32')} / {len(reqs)}")
