# Prompt precision of the default int4 (w4a8) target: float32 vs bfloat16 dense prompts (`--prompt-dtype`).
#   python prompt_dtype.py QUESTIONS.jsonl N [PROMPT_SIZES]
# 1. Speed: one prompt forward of each size (random tokens), both targets alternating, 7 rounds, medians of the
#    last 6 (2 threads).
# 2. Answers: the first turns of every (len / N)-th question plus "What is the capital of France?", 128 greedy
#    tokens (EOS ignored) from each target and from the float32 model: identical answers and the mean common
#    prefix with the float32 model's, and with each other.
import json, statistics, sys, time, torch
from eaglespec.config import GenerationConfig
from eaglespec.datasets import encode_messages
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target

allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
qs = [json.loads(l) for l in open(sys.argv[1])]
n = int(sys.argv[2])
sizes = [int(s) for s in (sys.argv[3] if len(sys.argv) > 3 else "94,300,1000").split(",")]
first = [q["turns"][0] if "turns" in q else q.get("prompt") or q["question"] for q in qs[:: max(1, len(qs) // n)][:n]]
first.append("What is the capital of France?")
targets = {d: load_target(None, prompt_dtype=d) for d in ("float32", "bfloat16")}
assert all(t.model.prompt_dtype == d for d, t in targets.items())
with torch.inference_mode():
    for p in sizes:
        x = torch.randint(0, 49152, (1, p))
        caches = {d: t.model.new_cache(1, p) for d, t in targets.items()}
        times = {d: [] for d in targets}
        for r in range(7):
            for d, t in (list(targets.items()) if r % 2 == 0 else list(targets.items())[::-1]):
                caches[d].lengths[0] = 0
                a = time.perf_counter(); t.model(x, torch.arange(p)[None], caches[d], prefill=True)
                times[d].append(time.perf_counter() - a)
        m = {d: statistics.median(v[1:]) * 1e3 for d, v in times.items()}
        print(f"prompt {p:5d} tokens: float32 {m['float32']:7.1f} ms  bfloat16 {m['bfloat16']:7.1f} ms  "
              f"speedup {m['float32'] / m['bfloat16']:.2f}x")
    tok = targets["float32"].tokenizer
    ids = [encode_messages(tok, [{"role": "user", "content": q}]) for q in first]
    print("prompts:", len(ids), "| prompt tokens: mean", round(statistics.mean(map(len, ids)), 1), "min", min(map(len, ids)),
          "| prompts over 16 tokens (the dense path):", sum(len(i) > 16 for i in ids))
    cfg = GenerationConfig(128, ignore_eos=True)
    outs = {d: [Engine(t, max_batch_size=1).generate([Request(i, cfg)])[0].token_ids for i in ids]
            for d, t in targets.items()}
    del targets
    ref = load_target(None, dtype="float32")
    outs["float32 model"] = [Engine(ref, max_batch_size=1).generate([Request(i, cfg)])[0].token_ids for i in ids]


def common(a, b):
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


for x, y in (("float32", "float32 model"), ("bfloat16", "float32 model"), ("bfloat16", "float32")):
    c = [common(a, b) for a, b in zip(outs[x], outs[y])]
    print(f"int4 with {x:8s} prompts vs {y:13s}: identical {sum(k == 128 for k in c)}/{len(c)}, mean common prefix "
          f"{statistics.mean(c):5.1f} tokens, same first token {sum(k > 0 for k in c)}/{len(c)}")
for d, o in outs.items():
    print(f"{d:13s} | France: {tok.decode(o[-1][:16])!r}")
