# The proposer's own seconds in a paused step (batch 1, T=1, never drafting, no probes): propose, commit and the
# step-time feedback, each timed around the call over every step of 8 requests; and the target forward with and
# without the head's feature layers kept (alternating).
import statistics, time, sys
import torch
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions
allocator.tune(); torch.set_num_threads(2)
target = load_target(None)
qs = load_questions(sys.argv[1], per_category=1)[:8]
reqs = [Request(encode_messages(target.tokenizer, [{"role": "user", "content": q.turns[0]}]),
                GenerationConfig(128, SamplingParams(temperature=1.0, seed=i), ignore_eos=True)) for i, q in enumerate(qs)]
prop = build_calibrated_proposer(target, DraftOptions())
d = prop.dispatcher
d.margin, d.keep_margin, d.probe_every, d.max_probe_every = 100.0, None, 10**6, 10**6
T = {}
def timed(obj, name):
    f = getattr(obj, name)
    def w(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); T.setdefault(name, []).append(time.perf_counter() - t0); return r
    setattr(obj, name, w)
for n in ("propose", "commit", "observe_step_time"):
    timed(prop, n)
timed(d, "pick")
eng = Engine(target, prop, max_batch_size=1)
with torch.inference_mode():
    eng.generate(reqs[:1]); T.clear()
    eng.generate(reqs)
for k, v in T.items():
    print(f"{k:18s} median {statistics.median(v)*1e6:6.1f} us  mean {statistics.mean(v)*1e6:6.1f} us  ({len(v)} calls)")
