# Batch B, greedy: vanilla vs --tree auto (the calibrated dispatcher) on MT-bench first turns (3 per category,
# the matrix's), at temperature T, alternating per group, one process; time spent in the proposer's catch-ups (and their count,
# look-back or not), picks by label. Usage: auto_b4.py B REPS [T [NAME=PATH N]]
import sys, time, collections, torch
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.spec.speculative import DraftOptions
torch.set_num_threads(2)
B, REPS = int(sys.argv[1]), int(sys.argv[2]); T = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
t = load_target()
if len(sys.argv) > 4:  # a dataset spec (NAME=PATH) instead: its first N = argv[5] questions, first turns
    from eaglespec.config import GenerationConfig, SamplingParams
    from eaglespec.datasets import encode_messages, load_questions
    from eaglespec.engine.generate import Request
    qs = load_questions(sys.argv[4], int(sys.argv[5]), max_turns=1)
    reqs = [Request(encode_messages(t.tokenizer, [{"role": "user", "content": q.turns[0]}]),
                    GenerationConfig(128, ignore_eos=True, sampling=SamplingParams(temperature=T, seed=i)))
            for i, q in enumerate(qs)]
else:
    reqs = mt_bench_requests(t.tokenizer, 24, first=0, temperature=T)
p = build_calibrated_proposer(t, DraftOptions(tree="auto"))
engs = {"van": Engine(t, None, max_batch_size=B), "auto": Engine(t, p, max_batch_size=B)}
stat = collections.defaultdict(float)
cu0 = p._catch_up
def cu(rows, row_ids=None, look_back=False):
    a = time.perf_counter(); cu0(rows, row_ids, look_back); stat["catch_up_s"] += time.perf_counter() - a
    stat["catch_ups"] += 1; stat["look_backs"] += look_back
p._catch_up = cu
pick0 = p.dispatcher.pick
def pick(*a, **k):
    c = pick0(*a, **k); stat["pick:" + c.label + ("+lb" if p.dispatcher.look_back_due else "")] += 1; return c
p.dispatcher.pick = pick
wall = collections.defaultdict(float)
groups = [reqs[i:i + B] for i in range(0, len(reqs), B)]
with torch.inference_mode():
    for e in engs.values(): e.generate(groups[0])
    stat.clear()
    for rep in range(REPS):
        for g in groups:
            for name in (("van", "auto") if rep % 2 == 0 else ("auto", "van")):
                a = time.perf_counter(); engs[name].generate(g); wall[name] += time.perf_counter() - a
print({k: round(v, 3) for k, v in wall.items()}, "van/auto speed", round(wall["van"] / wall["auto"], 4))
print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in sorted(stat.items())})
