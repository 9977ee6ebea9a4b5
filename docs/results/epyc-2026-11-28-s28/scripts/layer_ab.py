# The one-call decoder layer before and after session 28, in one process, three arms alternating over the
# default int4 target's forward: "before", the layer_step.cpp of BASE (views and intermediate tensors through the
# dispatcher, residual adds as separate operators) built under its own op namespace next to the current kernels
# (base_layer.py) and called once a layer from Python, as BASE did; "per layer", the current layer_step (raw rows) called the
# same way; "one call", the current forward (eaglespec::layer_steps: every layer in one call). All arms call the
# current attention kernel (which reads q in place: its own saving is fuse_ab.py's part 1). Medians of 40 rounds
# after 8 of one forward of every (batch, N), logits at every position and their argmax read back, float16
# cache, 2 threads. The first lines check that the arms give the same logits bit for bit.
#   python layer_ab.py
import statistics, time

import torch

from base_layer import build_base_op, per_layer
from eaglespec.runtime import allocator, cpu_kernels, model as model_mod
from eaglespec.runtime.loading import load_target

allocator.tune()
torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
m = load_target(None).model  # loads (builds) the current kernels first
base_op = build_base_op()
step_op = torch.ops.eaglespec.layer_step
one_call = model_mod.Transformer._layer_steps
ops = {"before": per_layer(base_op), "per layer": per_layer(step_op), "one call": one_call}


def use(name):
    model_mod.Transformer._layer_steps = ops[name]


cases = [(1, 256, 1), (1, 256, 2), (1, 256, 4), (1, 256, 8), (4, 200, 1), (4, 200, 2), (4, 200, 4)]
g = torch.Generator().manual_seed(0)
setups = {}
with torch.inference_mode():
    for B, P, N in cases:
        cache = m.new_cache(B, P + 16)
        m(torch.randint(0, 49152, (B, P), generator=g), torch.arange(P).repeat(B, 1), cache, prefill=True)
        cache.lengths[:] = P
        setups[(B, N)] = (cache, torch.randint(0, 49152, (B, N), generator=g), torch.arange(P, P + N).repeat(B, 1))
    for k, (cache, toks, pos) in setups.items():
        outs = []
        for name in ops:
            use(name)
            outs.append(m(toks, pos, cache, logits_at="all").logits)
        print(f"B={k[0]} N={k[1]} logits bit-identical:", all(torch.equal(outs[0], o) for o in outs[1:]))
    ts = {(name, k): [] for name in ops for k in setups}
    for r in range(48):
        for name in (list(ops) if r % 2 == 0 else list(ops)[::-1]):
            use(name)
            for k, (cache, toks, pos) in setups.items():
                t0 = time.perf_counter()
                m(toks, pos, cache, logits_at="all").logits.argmax(-1).tolist()
                if r >= 8:
                    ts[(name, k)].append(time.perf_counter() - t0)
print("\n| batch | N | before (ms) | per layer (ms) | one call (ms) | before / one call |\n|---|---|---|---|---|---|")
for k in setups:
    a, b, c = (statistics.median(ts[(name, k)]) * 1e3 for name in ops)
    print(f"| {k[0]} | {k[1]} | {a:.3f} | {b:.3f} | {c:.3f} | {a / c:.3f}x |")
for name in ops:
    one, eight = (statistics.median(ts[(name, (1, n))]) for n in (1, 8))
    print(f"{name}: forward(8) / forward(1) at batch 1 = {eight / one:.2f}")
