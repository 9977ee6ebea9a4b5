# The one-call decoder layer before and after session 28, end to end in one process (default int4 target,
# shipped head, float16 cache, 2 threads):   python e2e_ab.py QUESTIONS.jsonl PER_CATEGORY BATCH [PASSES]
# First turns (PER_CATEGORY a category), 128 greedy tokens each (EOS ignored), at batch BATCH. Four arms: plain
# decoding and the chain of 1, each with the layer of BASE ("before": layer_step.cpp of BASE built under its own
# op namespace by base_layer.py, called once a layer from Python for the target and the head, as BASE did) and with the current
# one ("after": every target layer in one call, the head's layers through the current layer_step). All arms use
# the current attention and matmul kernels, so the q copy BASE's attention made is not in "before" (fuse_ab.py).
# Each pass runs every arm over every group of BATCH prompts, the arms in a rotating order per group; the first
# group of the first pass is a warm-up and not counted. Printed: per arm wall tok/s (prompt included) and the
# decode steps' tok/s, after / before per method, and whether every arm's greedy output equals plain "after".
import sys

import torch

from base_layer import build_base_op, per_layer
from eaglespec.config import GenerationConfig
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.generate import Engine, Request
from eaglespec.measure.ab import rotate_arms
from eaglespec.runtime import allocator, cpu_kernels, model as model_mod
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer

allocator.tune()
torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
path, per_cat, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
passes = int(sys.argv[4]) if len(sys.argv) > 4 else 2
target = load_target(None)
base_op = build_base_op()
after = (model_mod.Transformer._layer_steps, model_mod.LayerStepCall.__call__)
base_layers = per_layer(base_op)  # BASE's Transformer._layer_steps


def base_call(self, weights, x, cache, i, attn_input=None):  # BASE's LayerStepCall.__call__ (the head's layers)
    p = self.plan
    return base_op(x, attn_input, *weights, self.cos, self.sin, cache.k[i], cache.v[i], p.rows, p.write_slots,
                   self.first, p.n_slots, self.mask, *self.shape)


def use(layer):
    model_mod.Transformer._layer_steps, model_mod.LayerStepCall.__call__ = (
        (base_layers, base_call) if layer == "before" else after)


prompts = [encode_messages(target.tokenizer, [{"role": "user", "content": q.turns[0]}])
           for q in load_questions(path, per_category=per_cat)]
print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, batch {batch}")
reqs = [Request(p, GenerationConfig(128, ignore_eos=True)) for p in prompts]
arms = {}
for method in ("vanilla", "chain1"):
    for layer in ("before", "after"):
        proposer = None if method == "vanilla" else build_proposer(target, DraftOptions(tree="chain", depth=1))
        arms[f"{method}/{layer}"] = (layer, Engine(target, proposer, max_batch_size=batch))
with torch.inference_mode():
    tot = rotate_arms({name: engine for name, (_, engine) in arms.items()}, reqs, batch, passes,
                      before=lambda name: use(arms[name][0]))  # eaglespec.measure.ab's protocol
use("after")
names = list(arms)
for name in names:
    t = tot[name]
    print(f"{name:16s} wall {t.tokens / t.wall_s:7.1f} tok/s  decode {t.tokens / t.decode_s:7.1f} tok/s")
for m in ("vanilla", "chain1"):
    print(f"{m}: after / before wall {tot[f'{m}/before'].wall_s / tot[f'{m}/after'].wall_s:.3f}x, decode "
          f"{tot[f'{m}/before'].decode_s / tot[f'{m}/after'].decode_s:.3f}x")
ref = tot["vanilla/after"].outputs
print("greedy identical to vanilla/after: " + ", ".join(
    f"{name} {sum(tot[name].outputs[i] == ref[i] for i in ref)} / {len(ref)}" for name in names))
