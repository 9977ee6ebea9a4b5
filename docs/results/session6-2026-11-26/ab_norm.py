"""A/B in one process: model.rms_norm through our kernel vs torch's, alternating per prompt (10 MT-bench first
turns from the end of the file, 128 tokens, greedy, batch 1, 2 threads); vanilla and chain 1."""
import json, statistics, sys, time, torch
from eaglespec.runtime import cpu_kernels, model as M
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.config import GenerationConfig
from eaglespec.cli import encode_prompt
torch.set_num_threads(2)
target = load_target(None)
qs = [json.loads(l) for l in open("/work/shared/data/mt_bench/question.jsonl")][-10:]
prompts = [encode_prompt(target.tokenizer, q["turns"][0], True) for q in qs]
cfg = GenerationConfig(max_new_tokens=128, ignore_eos=True)
engines = {"vanilla": Engine(target), "chain1": Engine(target, build_proposer(target, DraftOptions(tree="chain", depth=1)))}
real = cpu_kernels.loaded
res = {(e, k): [] for e in engines for k in ("torch", "ours")}
outs = {}
with torch.inference_mode():
    for name, eng in engines.items():
        eng.generate([Request(prompts[0], cfg)])
    for i, p in enumerate(prompts):
        for name, eng in engines.items():
            order = ("torch", "ours") if i % 2 == 0 else ("ours", "torch")
            for k in order:
                cpu_kernels.loaded = real if k == "ours" else (lambda: False)
                t = time.perf_counter()
                c = eng.generate([Request(p, cfg)])[0]
                res[(name, k)].append(time.perf_counter() - t)
                outs[(name, k, i)] = c.token_ids
cpu_kernels.loaded = real
for (name, k), ts in res.items():
    print(name, k, "total s", round(sum(ts), 3), "tok/s", round(128 * len(ts) / sum(ts), 1))
for name in engines:
    print(name, "ours/torch time", round(sum(res[(name, "ours")]) / sum(res[(name, "torch")]), 4))
same = sum(outs[("vanilla", "ours", i)] == outs[("chain1", "ours", i)] for i in range(len(prompts)))
print("greedy chain1 == vanilla with our norm:", same, "/", len(prompts))
