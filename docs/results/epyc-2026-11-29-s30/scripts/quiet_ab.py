# The dispatcher's pick in a paused step with its quiet path (`AdaptiveDispatcher._quiet_step`) and without it (the
# whole pick every step), one process, two engines alternating per request (Spec-Bench first turns, 1 a category, T=1,
# batch 1, 2 passes, never drafting, no probe): python quiet_ab.py QUESTIONS
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
qs = load_questions(sys.argv[1], per_category=1)
reqs = [Request(encode_messages(target.tokenizer, [{"role": "user", "content": q.turns[0]}]),
                GenerationConfig(128, SamplingParams(temperature=1.0, seed=i), ignore_eos=True)) for i, q in enumerate(qs)]
T = {}
engines = {}
for name in ("quiet", "whole"):
    prop = build_calibrated_proposer(target, DraftOptions())
    d = prop.dispatcher
    d.margin, d.keep_margin, d.probe_every, d.max_probe_every = 100.0, None, 10**6, 10**6
    if name == "whole":
        d._quiet_step = lambda *a: False
    for obj, fn in ((d, "pick"), (prop, "propose"), (prop, "commit")):
        f = getattr(obj, fn)
        def w(*a, _f=f, _k=(name, fn), **k):
            t0 = time.perf_counter(); r = _f(*a, **k); T.setdefault(_k, []).append(time.perf_counter() - t0); return r
        setattr(obj, fn, w)
    engines[name] = Engine(target, prop)
with torch.inference_mode():
    for e in engines.values(): e.generate(reqs[:1])
    T.clear()
    for i, r in enumerate(reqs * 2):
        for name in (("quiet", "whole") if i % 2 else ("whole", "quiet")):
            engines[name].generate([r])
for k, v in sorted(T.items()):
    print(f"{k[0]:6s} {k[1]:8s} median {statistics.median(v)*1e6:6.1f} us  mean {statistics.mean(v)*1e6:6.1f} us ({len(v)})")
