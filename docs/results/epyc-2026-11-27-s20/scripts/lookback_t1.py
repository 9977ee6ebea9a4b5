# T=1, batch 1, 128 tokens a request: vanilla against `--tree auto` whose paused probes look back (this session)
# and `--tree auto` whose probes of sampled requests draft a chain of 1 for 4 steps (before it: the proposer's
# look_back forced off), alternating per request in one process (rotating order), REPS rounds.
# Usage: lookback_t1.py REPS NAME=PATH N   (e.g. humaneval=$D/humaneval/HumanEval.jsonl.gz 10)
import collections, sys, time, torch
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions
torch.set_num_threads(2)
REPS, SPEC, N = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
t = load_target()
qs = load_questions(SPEC, N, max_turns=1)
reqs = [Request(encode_messages(t.tokenizer, [{"role": "user", "content": q.turns[0]}]),
                GenerationConfig(128, ignore_eos=True, sampling=SamplingParams(temperature=1.0, seed=i)))
        for i, q in enumerate(qs)]
print("prompt tokens", [len(r.prompt_ids) for r in reqs])
old = build_calibrated_proposer(t, DraftOptions(tree="auto"))
pick = old.dispatcher.pick
old.dispatcher.pick = lambda *a, look_back=False, **k: pick(*a, look_back=False, **k)  # probes draft
engs = {"van": Engine(t, None, max_batch_size=1),
        "auto": Engine(t, build_calibrated_proposer(t, DraftOptions(tree="auto")), max_batch_size=1),
        "auto_drafting_probes": Engine(t, old, max_batch_size=1)}
names = list(engs)
wall, steps = collections.defaultdict(float), collections.defaultdict(collections.Counter)
with torch.inference_mode():
    for e in engs.values():
        e.generate(reqs[:1])
    for rep in range(REPS):
        for i, r in enumerate(reqs):
            k = (rep * len(reqs) + i) % len(names)
            for name in names[k:] + names[:k]:
                a = time.perf_counter()
                c = engs[name].generate([r])[0]
                wall[name] += time.perf_counter() - a
                steps[name].update(c.stats.tree_rounds)
print({k: round(v, 3) for k, v in wall.items()})
print("auto/van time", round(wall["auto"] / wall["van"], 4), "-> speed", round(wall["van"] / wall["auto"], 4))
print("drafting-probes/van time", round(wall["auto_drafting_probes"] / wall["van"], 4), "-> speed",
      round(wall["van"] / wall["auto_drafting_probes"], 4))
print({k: dict(v) for k, v in steps.items()})
