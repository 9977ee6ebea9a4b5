# Vanilla, `--tree auto` (as shipped and with changed dispatcher settings) and the chain of 1 in one process, arms
# rotating per group (eaglespec.measure.ab): python t1_ab.py QUESTIONS PER_CATEGORY BATCH TEMPERATURE PASSES ARM...
# ARM: vanilla | chain1 | auto | auto-committing-look-back | auto-s28 | auto...:ATTR=VALUE,... (dispatcher attributes set after
# construction)
import sys
import torch
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.measure.ab import rotate_arms
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer

allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
path, per_cat, batch, temp, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
target = load_target(None)
qs = load_questions(path, per_category=per_cat) if per_cat > 0 else load_questions(path, limit=-per_cat)
prompts = [encode_messages(target.tokenizer, [{"role": "user", "content": q.turns[0]}]) for q in qs]
print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, batch {batch}, T={temp}")
reqs = [Request(p, GenerationConfig(128, SamplingParams(temperature=temp, seed=i), ignore_eos=True))
        for i, p in enumerate(prompts)]
arms, disp = {}, {}
for spec in sys.argv[6:]:
    kind, _, sets = spec.partition(":")
    if kind == "vanilla":
        prop = None
    elif kind == "chain1":
        prop = build_proposer(target, DraftOptions(tree="chain", depth=1))
    else:
        prop = build_calibrated_proposer(target, DraftOptions())
        # From a8b9e89 on every look-back catches up again, so these two lines change nothing there; they put
        # the committing look-back back in the runs at 282510d-49da936, where the windowed one existed.
        if kind in ("auto-committing-look-back", "auto-s28"):  # before session 29: a look-back catches up
            prop._look_back_window = lambda rows, ids, _p=prop: _p._catch_up(rows, ids, look_back=True)
            prop.look_back_pairs = prop.catch_up_pairs
        if kind == "auto-s28":  # and drafting starts by the usual margins, whatever its catch-up costs; and a request
            prop.dispatcher._start_margin = lambda *a: None  # alone explores whatever its look-back costs
            could_pay = prop.dispatcher._probe_could_pay
            prop.dispatcher._probe_could_pay = lambda *a, floor=None, _f=could_pay, **k: True if floor is not None \
                else _f(*a, **k)
        for kv in filter(None, sets.split(",")):
            k, v = kv.split("=")
            setattr(prop.dispatcher, k, eval(v))
        disp[spec] = prop.dispatcher
    arms[spec] = Engine(target, prop, max_batch_size=batch)
with torch.inference_mode():
    tot = rotate_arms(arms, reqs, batch, passes)
base = tot["vanilla"]
for name, t in tot.items():
    print(f"{name:40s} wall {t.tokens / t.wall_s:7.1f} tok/s ({base.wall_s / t.wall_s:.3f}x)  decode "
          f"{t.tokens / t.decode_s:7.1f} ({base.decode_s / t.decode_s:.3f}x)  rounds {dict(t.rounds)}")
