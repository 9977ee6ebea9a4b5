# Batch 4 and batch 1 decoding (128 tokens a request, MT-bench first turns 3-4 of each category, the first N):
# vanilla and a chain of 1, greedy and T=1, each engine on each group of requests back to back (rotating
# order), REPS rounds; prints tokens/s per (engine, temperature, batch). Run it in processes with and without
# the glibc allocator settings (MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_) to compare them.
# TUNE=1: call eaglespec.runtime.allocator.tune() first (what the eaglespec commands do).
# Usage: malloc_e2e.py REPS N   (D: the data dir, default ../shared/data)
import collections, os, sys, time, torch
if os.environ.get("TUNE") == "1":
    from eaglespec.runtime import allocator
    print("allocator:", allocator.tune())
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
torch.set_num_threads(2)
REPS, N = int(sys.argv[1]), int(sys.argv[2])
t = load_target()
by_cat = collections.defaultdict(list)
for q in load_questions("mt_bench=" + os.environ.get("D", "../shared/data") + "/mt_bench/question.jsonl", max_turns=1):
    by_cat[q.category].append(q)
qs = [q for c in by_cat.values() for q in c[3:5]][:N]
def reqs(temp):
    return [Request(encode_messages(t.tokenizer, [{"role": "user", "content": q.turns[0]}]),
                    GenerationConfig(128, ignore_eos=True, sampling=SamplingParams(temperature=temp, seed=i)))
            for i, q in enumerate(qs)]
arms = [(kind, temp, batch) for batch in (4, 1) for temp in (0.0, 1.0) for kind in ("vanilla", "chain1")]
engs = {}
for kind, _, batch in arms:
    if (kind, batch) not in engs:
        p = None if kind == "vanilla" else build_proposer(t, DraftOptions(tree="chain", depth=1))
        engs[(kind, batch)] = Engine(t, p, max_batch_size=batch)
wall, toks = collections.defaultdict(float), collections.defaultdict(int)
with torch.inference_mode():
    for (kind, temp, batch) in arms:
        engs[(kind, batch)].generate(reqs(temp)[:batch])  # warm-up
    for rep in range(REPS):
        for temp in (0.0, 1.0):
            rs = reqs(temp)
            for batch in (4, 1):
                for i in range(0, len(rs), batch):
                    kinds = ["vanilla", "chain1"] if (rep + i // batch) % 2 == 0 else ["chain1", "vanilla"]
                    for kind in kinds:
                        a = time.perf_counter()
                        out = engs[(kind, batch)].generate(rs[i:i + batch])
                        wall[(kind, temp, batch)] += time.perf_counter() - a
                        toks[(kind, temp, batch)] += sum(len(c.token_ids) for c in out)
env = {k: os.environ.get(k) for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "TUNE")}
print("env", env)
for key in sorted(wall):
    print(key, "%.1f tok/s" % (toks[key] / wall[key]))
