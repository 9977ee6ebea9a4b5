# One engine, its proposer swapped in and out between groups of 4 requests (same KV cache memory for all arms):
# per arm, the 1-token batch-4 forwards' and steps' medians, and group walls; the arms in a rotating order per
# group. With `hi`, a third arm: plain decoding whose forwards also collect the head's feature layers.
# Usage: swap_ab.py Q.jsonl T ROUNDS [hi]
import collections, statistics, sys, time
import torch
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions

allocator.tune()
torch.set_num_threads(2)
target = load_target(None)
prompts = [encode_messages(target.tokenizer, [{"role": "user", "content": q.turns[0]}])
           for q in load_questions(sys.argv[1], per_category=2)][:16]
temp = float(sys.argv[2])
reqs = [Request(x, GenerationConfig(128, ignore_eos=True, sampling=SamplingParams(temperature=temp, seed=i)))
        for i, x in enumerate(prompts)]
prop = build_calibrated_proposer(target, DraftOptions())
eng = Engine(target, prop, max_batch_size=4)
rec = collections.defaultdict(lambda: collections.defaultdict(list))
arm = {"name": None}
model = eng.model


class Timed:
    def __getattr__(self, k):
        return getattr(model, k)

    def __call__(self, tokens, *a, **k):
        if arm["name"] == "vanilla_hi":
            k["hidden_indices"] = prop.hidden_indices
        t0 = time.perf_counter()
        r = model(tokens, *a, **k)
        if arm["name"] and tokens.shape == (4, 1):
            rec[arm["name"]]["fwd"].append(time.perf_counter() - t0)
        return r


eng.model = Timed()
f = eng._step


def g(seqs):
    t0 = time.perf_counter()
    r = f(seqs)
    if arm["name"] and len(seqs) == 4:
        lbl = getattr(eng.proposer, "step_label", "none") if eng.proposer else "vanilla"
        rec[arm["name"]]["step_" + str(lbl)].append(time.perf_counter() - t0)
    return r


eng._step = g
with torch.no_grad():
    eng.generate(reqs[:8])
    walls = collections.defaultdict(float)
    for i in range(int(sys.argv[3])):
        for j in range(0, 16, 4):
            arms = ["auto", "vanilla"] + (["vanilla_hi"] if sys.argv[4:] == ["hi"] else [])
            r0 = (i + j // 4) % len(arms)
            for name in arms[r0:] + arms[:r0]:
                eng.proposer = prop if name == "auto" else None
                arm["name"] = name
                t0 = time.perf_counter(); eng.generate(reqs[j:j + 4]); walls[name] += time.perf_counter() - t0
                arm["name"] = None
    eng.proposer = prop
print("walls", {k: round(v, 2) for k, v in walls.items()}, "vanilla/auto", round(walls["vanilla"] / walls["auto"], 4))
if "vanilla_hi" in walls:
    print("hi / auto", round(walls["vanilla_hi"] / walls["auto"], 4))
for name in rec:
    for k, v in sorted(rec[name].items()):
        print(f"{name} {k}: n {len(v)} median {statistics.median(v)*1e3:.3f} ms mean {statistics.fmean(v)*1e3:.3f} sum {sum(v):.2f} s")
