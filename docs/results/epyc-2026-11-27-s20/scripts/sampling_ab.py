# Sampled decoding (T=1, batch 1, 128 tokens a request) with this session's verification and draws (the
# eaglespec::sample_rows kernel, the one-node fast path) against those of commit OLD (its spec/verify.py and
# spec/sampling.py loaded from git as modules), swapped in-process before every request: vanilla and a chain
# of 1, alternating per request (rotating order), REPS rounds; wall per arm and the requests whose tokens differ.
# Usage: sampling_ab.py OLD REPS NAME=PATH N
import collections, importlib.util, subprocess, sys, tempfile, time, torch
from pathlib import Path
import eaglespec.engine.generate as gen
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
torch.set_num_threads(2)
OLD, REPS, SPEC, N = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
tmp = Path(tempfile.mkdtemp())


def old_module(name):
    path = tmp / f"old_{name}.py"
    path.write_text(subprocess.check_output(["git", "show", f"{OLD}:eaglespec/spec/{name}.py"], text=True))
    spec = importlib.util.spec_from_file_location(f"old_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


old_sampling = old_module("sampling")
old_verify = old_module("verify")
old_verify.sample_from_probs = old_sampling.sample_from_probs  # the old draw too
rules = {"new": (gen.verify_sampling, gen.process_logits), "old": (old_verify.verify_sampling, old_sampling.process_logits)}
t = load_target()
qs = load_questions(SPEC, N, max_turns=1)
reqs = [Request(encode_messages(t.tokenizer, [{"role": "user", "content": q.turns[0]}]),
                GenerationConfig(128, ignore_eos=True, sampling=SamplingParams(temperature=1.0, seed=i)))
        for i, q in enumerate(qs)]
engs = {"vanilla": Engine(t, None, max_batch_size=1),
        "chain1": Engine(t, build_proposer(t, DraftOptions(tree="chain", depth=1)), max_batch_size=1)}
arms = [(e, r) for e in engs for r in rules]
wall, toks, differ = collections.defaultdict(float), {}, collections.Counter()
with torch.inference_mode():
    for e in engs.values():
        e.generate(reqs[:1])
    for rep in range(REPS):
        for i, req in enumerate(reqs):
            k = (rep * len(reqs) + i) % len(arms)
            for e, r in arms[k:] + arms[:k]:
                gen.verify_sampling, gen.process_logits = rules[r]
                a = time.perf_counter()
                c = engs[e].generate([req])[0]
                wall[(e, r)] += time.perf_counter() - a
                toks[(e, r, i)] = c.token_ids
gen.verify_sampling, gen.process_logits = rules["new"]
for e in engs:
    d = sum(toks[(e, "old", i)] != toks[(e, "new", i)] for i in range(len(reqs)))
    print(f"{e}: old {wall[(e, 'old')]:.3f} s, new {wall[(e, 'new')]:.3f} s, new speed / old {wall[(e, 'old')] / wall[(e, 'new')]:.4f}; "
          f"requests whose tokens differ {d} of {len(reqs)}")
print("chain1 / vanilla speed: old", round(wall[("vanilla", "old")] / wall[("chain1", "old")], 4),
      "new", round(wall[("vanilla", "new")] / wall[("chain1", "new")], 4))
