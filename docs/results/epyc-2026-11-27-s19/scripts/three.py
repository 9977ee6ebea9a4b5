# Batch 1 at temperature T on a dataset's first N first turns (128 tokens each): vanilla, tree "none" (paused
# throughout, head kept ready) and --tree auto (calibrated), alternating per request in one process (rotating
# order), REPS rounds; wall per engine, then a cProfile of one auto round (cumulative).
# Usage: three.py REPS T NAME=PATH N
import cProfile, pstats, sys, time, collections, torch
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import proposer
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.generate import Engine, Request
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions
torch.set_num_threads(2)
REPS, T, SPEC, N = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
t = load_target()
qs = load_questions(SPEC, N, max_turns=1)
reqs = [Request(encode_messages(t.tokenizer, [{"role": "user", "content": q.turns[0]}]),
                GenerationConfig(128, ignore_eos=True, sampling=SamplingParams(temperature=T, seed=i))) for i, q in enumerate(qs)]
print("prompt tokens", [len(r.prompt_ids) for r in reqs])
engs = {"van": Engine(t, None, max_batch_size=1), "none": Engine(t, proposer(t, "none"), max_batch_size=1),
        "auto": Engine(t, build_calibrated_proposer(t, DraftOptions(tree="auto")), max_batch_size=1)}
names = list(engs)
wall = collections.defaultdict(float)
with torch.inference_mode():
    for e in engs.values(): e.generate(reqs[:1])
    for rep in range(REPS):
        for i, r in enumerate(reqs):
            k = (rep * len(reqs) + i) % 3
            for name in names[k:] + names[:k]:
                a = time.perf_counter(); engs[name].generate([r]); wall[name] += time.perf_counter() - a
    print({k: round(v, 3) for k, v in wall.items()}, "none/van", round(wall["none"] / wall["van"], 4),
          "auto/van", round(wall["auto"] / wall["van"], 4))
    pr = cProfile.Profile(); pr.enable(); engs["auto"].generate(reqs); pr.disable()
    pstats.Stats(pr).sort_stats("cumtime").print_stats(40)
