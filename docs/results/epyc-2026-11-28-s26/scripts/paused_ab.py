# What a paused batch-4 step of `--tree auto` costs the proposer, against vanilla (this machine's calibration).
# MT-bench first turns (2 a category, 16 prompts) of 64-160 tokens each (--ignore-eos), so that rows join the batch
# at different steps and lag differently; T from the command line. After a warm-up group of each, two passes of
# vanilla and auto in turns (one engine each). Printed: wall seconds and the stats' draft and verify seconds per
# row and step; auto's rounds by tree; the proposer's own seconds (propose + commit + its step timing) in each
# paused batch-4 step that caught nothing up, and with --parts the dispatcher's pick, the record of the pair and
# the step's price check inside it (their wrappers add ~1 us each).
# Run it with the checkout to measure first on PYTHONPATH, e.g. PYTHONPATH=. python paused_ab.py Q.jsonl 0 --parts
# Usage: paused_ab.py MT_BENCH_JSONL TEMPERATURE [--parts]
import collections, statistics, sys, time

import torch

import eaglespec
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
           for q in load_questions(sys.argv[1], per_category=2)]
temp = float(sys.argv[2])
reqs = [Request(x, GenerationConfig(64 + 24 * (i % 5), ignore_eos=True,
                                    sampling=SamplingParams(temperature=temp, seed=i))) for i, x in enumerate(prompts)]
prop = build_calibrated_proposer(target, DraftOptions())
auto, vanilla = Engine(target, prop, max_batch_size=4), Engine(target, None, max_batch_size=4)
paused, parts, cur = [], collections.defaultdict(list), {}


def timed(obj, name, outer):
    f = getattr(obj, name)

    def g(*a, **k):
        if name == "propose":
            cur.clear()
        t0 = time.perf_counter()
        r = f(*a, **k)
        dt = time.perf_counter() - t0
        if not outer:
            cur[name] = cur.get(name, 0.0) + dt
        elif name == "propose":  # a paused batch-4 step that caught nothing up (the tree's own work)
            cur["ok"], cur["s"] = prop.step_label == "none" and prop._timed > 0 and len(a[0]) == 4, dt
        else:
            cur["s"] = cur.get("s", 0.0) + dt
            if name == "observe_step_time" and cur.get("ok"):
                paused.append(cur["s"])
                for k2, v in cur.items():
                    if k2 not in ("ok", "s"):
                        parts[k2].append(v)
        return r

    setattr(obj, name, g)


for n in ("propose", "commit", "observe_step_time"):
    timed(prop, n, True)
if "--parts" in sys.argv:
    for o, n in ((prop.dispatcher, "pick"), (prop, "_record_paused"), (prop.dispatcher, "observe_step")):
        timed(o, n, False)
res = collections.defaultdict(list)
with torch.inference_mode():
    auto.generate(reqs[:4])
    vanilla.generate(reqs[:4])
    paused.clear()
    parts.clear()
    for i in range(2):
        turn = (("vanilla", vanilla), ("auto", auto))
        for name, e in (turn if i % 2 == 0 else turn[::-1]):
            t0 = time.perf_counter()
            done = e.generate(reqs)
            wall = time.perf_counter() - t0
            st = [c.stats for c in done]
            steps = sum(s.target_forwards for s in st)
            res[name].append((wall, sum(s.draft_s for s in st) / steps * 1e3, sum(s.verify_s for s in st) / steps * 1e3))
            if e is auto:
                rounds = dict(sum((collections.Counter(c.stats.tree_rounds) for c in done), collections.Counter()))
print(eaglespec.__file__, f"T={temp}", "auto's rounds by tree", rounds)
for name, v in res.items():
    print(f"{name:8s} wall {[round(w, 2) for w, _, _ in v]} s  draft {[round(d, 3) for _, d, _ in v]} ms a row-step  "
          f"verify {[round(x, 3) for _, _, x in v]}")
print("vanilla / auto wall", [round(a[0] / b[0], 3) for a, b in zip(res["vanilla"], res["auto"])])
print(f"paused batch-4 steps without a catch-up: {len(paused)}, the proposer's median {statistics.median(paused) * 1e6:.1f}"
      f" us, mean {statistics.fmean(paused) * 1e6:.1f} us, p90 {sorted(paused)[int(0.9 * len(paused))] * 1e6:.1f} us")
for k, v in parts.items():
    print(f"  {k}: median {statistics.median(v) * 1e6:.1f} us, mean {statistics.fmean(v) * 1e6:.1f} us")
