# Sub-phase timing of engine steps: vanilla vs chain1 (compiled or eager), batch B. With PHASE_TIMER_GRAD=1 the
# engine runs outside torch.inference_mode, as a library caller would (phase_timer_grad_mode.py).
import contextlib, os, sys, time, collections, torch
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import load_draft_head, resolve_head_dir, DraftOptions, build_proposer
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.engine.generate import Engine, Request
import eaglespec.engine.generate as G
torch.set_num_threads(2)
mode = contextlib.nullcontext if os.environ.get("PHASE_TIMER_GRAD") == "1" else torch.inference_mode
KINDS = sys.argv[5].split(',') if len(sys.argv) > 5 else ['vanilla', 'chain1']
comp = sys.argv[1] == "1"; B = int(sys.argv[2]); N = int(sys.argv[3]); T = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
t = load_target(compile=comp)
qs = collections.defaultdict(list)
for q in load_questions("mt_bench=/work/shared/data/mt_bench/question.jsonl", max_turns=1):
    qs[q.category].append(q)
tok = t.tokenizer
prompts = [encode_messages(tok, [{"role": "user", "content": q.turns[0]}]) for c in qs.values() for q in c[:3]][:N]
reqs = [Request(p, GenerationConfig(128, ignore_eos=True, sampling=SamplingParams(temperature=T, seed=i))) for i, p in enumerate(prompts)]
ph = collections.defaultdict(float)
def wrap(obj, name, key):
    orig = getattr(obj, name)
    def w(*a, **k):
        t0 = time.perf_counter(); r = orig(*a, **k); ph[key] += time.perf_counter() - t0; return r
    setattr(obj, name, w)
for fn in ("tree_mask", "tree_positions"):
    wrap(G, fn, fn)
_of = t.model.forward
def _f(*a, **k):
    t0 = time.perf_counter(); r = _of(*a, **k); dt = time.perf_counter() - t0
    key = "fwd.prefill" if k.get("prefill") else f"fwd.n{a[0].shape[1]}"
    ph[key] += dt; cnt[key] += 1; return r
t.model.forward = _f
cnt = collections.Counter()
E = Engine
wrap(E, "_verify", "verify")
def mkprop(kind):
    if kind == "vanilla": return None
    if kind == "auto":
        from eaglespec.engine.calibrate import build_calibrated_proposer
        return build_calibrated_proposer(t, DraftOptions())
    return build_proposer(t, DraftOptions(tree="chain", depth=1))
def run(kind):
    eng = E(t, mkprop(kind), max_batch_size=B)
    for n in ("_step",): pass
    ostep = eng._step; steps = [0]
    def s(seqs):
        t0 = time.perf_counter(); r = ostep(seqs); ph["step"] += time.perf_counter() - t0; steps[0] += 1; return r
    eng._step = s
    with mode(): eng.generate(reqs[:1])  # warm
    cache = eng.cache
    for n in ("compact", "advance"): wrap(cache, n, "cache." + n)
    if eng.proposer is not None:
        for n in ("propose", "commit", "_catch_up", "_record_paused", "_look_back"): wrap(eng.proposer, n, "prop." + n)
    ph.clear(); cnt.clear(); steps[0] = 0
    with mode():
        t0 = time.perf_counter(); outs = eng.generate(reqs); tot = time.perf_counter() - t0
    ntok = sum(len(o.token_ids) for o in outs)
    return tot, steps[0], ntok, dict(ph)
for rep in range(2):
    for kind in KINDS:
        tot, n, ntok, p = run(kind)
        print(f"rep{rep} {kind:8s} {ntok/tot:6.1f} tok/s steps {n} tok/step {ntok/n:.2f} | " + " ".join(f"{k} {1e3*v/n:.2f}" for k, v in sorted(p.items())) + " || " + " ".join(f"{k}:{cnt[k]}x{1e3*p[k]/cnt[k]:.2f}" for k in sorted(cnt)), flush=True)
