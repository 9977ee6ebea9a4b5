"""Same-process A/B: compiled target, chain 1, commits through the compiled head graph vs eager.
Alternates per prompt; prints draft ms per step and tokens/s of each arm."""
import time, logging, sys
import torch
logging.basicConfig(level=logging.WARNING)
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import SHIPPED_HEAD_DIR, load_draft_head
from eaglespec.spec.proposer import EagleProposer
from eaglespec.spec.strategies import Chain
from eaglespec.engine.generate import Engine, Request
from eaglespec.config import GenerationConfig
from eaglespec.datasets import load_questions, encode_conversation
torch.set_num_threads(2)
t = load_target(None, "auto", "cpu", compile=True)
head = load_draft_head(SHIPPED_HEAD_DIR, t)
qs = load_questions("mt_bench=/work/shared/data/mt_bench/question.jsonl", per_category=int(sys.argv[1]) if len(sys.argv) > 1 else 2)
prompts = [encode_conversation(t.tokenizer, q.turns[:1], []) for q in qs]
arms = {}
for name in ("compiled", "eager"):
    p = EagleProposer(head, Chain(1))
    e = Engine(t, p, max_batch_size=1)
    if name == "eager":
        p.compiled = None
    arms[name] = e
res = {n: [0, 0.0, 0.0, 0] for n in arms}
with torch.inference_mode():
    for n, e in arms.items():  # warm-up (compiles)
        e.generate([Request(prompts[0], GenerationConfig(32))])
    for i, pr in enumerate(prompts):
        order = list(arms) if i % 2 == 0 else list(arms)[::-1]
        for n in order:
            t0 = time.perf_counter()
            c = arms[n].generate([Request(pr, GenerationConfig(128))])[0]
            dt = time.perf_counter() - t0
            r = res[n]; r[0] += len(c.token_ids); r[1] += dt; r[2] += c.stats.draft_s; r[3] += c.stats.target_forwards
for n, (tok, dt, ds, f) in res.items():
    print(f"{n:9s} {tok} tok {tok/dt:6.1f} tok/s  draft {1e3*ds/max(f,1):.2f} ms/step  tau {tok/max(f,1):.3f}")
print("compiled head disabled:", arms["compiled"].proposer.compiled.disabled)
