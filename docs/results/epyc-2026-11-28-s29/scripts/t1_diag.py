# One pass of vanilla and `--tree auto` over the same requests (batch 1), per request: auto / vanilla decode time,
# rounds drafted, pause<->draft switches, catch-ups (count, seconds), mean predicted speedup of drafted rounds,
# and the request's depth-1 acceptance when drafting.
import sys, time, collections
import torch
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions
allocator.tune(); torch.set_num_threads(2)
path, per_cat, temp = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
target = load_target(None)
qs = load_questions(path, per_category=per_cat)
reqs = [Request(encode_messages(target.tokenizer, [{"role": "user", "content": q.turns[0]}]),
                GenerationConfig(128, SamplingParams(temperature=temp, seed=i), ignore_eos=True)) for i, q in enumerate(qs)]
van = Engine(target, None, max_batch_size=1)
prop = build_calibrated_proposer(target, DraftOptions())
for k, v in (a.split("=") for a in sys.argv[4:]):
    setattr(prop.dispatcher, k, eval(v))
auto = Engine(target, prop, max_batch_size=1)
log = {"cu": [], "steps": []}
orig_cu = prop._catch_up
def cu(*a, **k):
    t0 = time.perf_counter(); r = orig_cu(*a, **k); log["cu"].append(time.perf_counter() - t0); return r
prop._catch_up = cu
orig_commit = prop.commit
def commit(rows, tree, verdict, out, n_accepted=None):
    log["steps"].append((prop._cfg.label, prop.step_choice.predicted_speedup if prop.step_choice else None, n_accepted[0]))
    return orig_commit(rows, tree, verdict, out, n_accepted=n_accepted)
prop.commit = commit
with torch.inference_mode():
    van.generate(reqs[:1]); auto.generate(reqs[:1])  # warm-up
    tv = ta = 0.0
    for i, (q, r) in enumerate(zip(qs, reqs)):
        log["cu"].clear(); log["steps"].clear()
        cv = van.generate([r])[0]; ca = auto.generate([r])[0]
        dv, da = cv.stats.draft_s + cv.stats.verify_s, ca.stats.draft_s + ca.stats.verify_s
        tv += cv.stats.wall_s; ta += ca.stats.wall_s
        st = log["steps"]; labels = [s[0] for s in st]
        sw = sum(1 for a, b in zip(labels, labels[1:]) if (a == "none") != (b == "none"))
        dr = [s for s in st if s[0] != "none"]
        pred = sum(s[1] for s in dr) / len(dr) if dr else float("nan")
        acc = sum(min(s[2], 1) for s in dr) / len(dr) if dr else float("nan")
        print(f"{q.category[:12]:12s} van/auto decode {dv / da:.3f} wall {cv.stats.wall_s / ca.stats.wall_s:.3f} | steps {len(st)} drafted {len(dr)} "
              f"switches {sw} catch-ups {len(log['cu'])} ({sum(log['cu'])*1e3:.0f} ms) | pred {pred:.3f} acc1 {acc:.2f}")
print(f"total wall van/auto {tv / ta:.3f}")
