# `--tree auto` request by request (batch 1, 128 tokens, one engine as in a bench run): each request's rounds per
# tree, tau, the pooled depth-1..3 acceptance after it, the dispatcher's last choice and its look-backs (summed
# chances, tries). MODE "no-explore": the dispatcher's one look-back per request alone switched off (session 21's
# change), to show what it was before.
# Usage: auto_t1_trace.py NAME=PATH N TEMPERATURE [no-explore]
import sys, torch
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions
allocator.tune()
torch.set_num_threads(2)
SPEC, N, T = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
MODE = sys.argv[4] if len(sys.argv) > 4 else "explore"
print("cpu:", cpu_kernels.cpuinfo("model name"), "torch", torch.__version__, "mode", MODE)
t = load_target()
qs = load_questions(SPEC, N, max_turns=1)
reqs = [Request(encode_messages(t.tokenizer, [{"role": "user", "content": q.turns[0]}]),
                GenerationConfig(128, ignore_eos=True, sampling=SamplingParams(temperature=T, seed=i)))
        for i, q in enumerate(qs)]
p = build_calibrated_proposer(t, DraftOptions(tree="auto"))
d = p.dispatcher
if MODE == "no-explore":
    start = d.start_row
    def start_row(row, sampled=False):
        start(row, sampled)
        d._explore = False
    d.start_row = start_row
e = Engine(t, p, max_batch_size=1)
log = []
observe = d.observe_look_back
def observe_look_back(rows, hits, tries):
    log.append((round(hits[0], 2), tries[0]))
    return observe(rows, hits, tries)
d.observe_look_back = observe_look_back
with torch.inference_mode():
    e.generate(reqs[:1])  # warm-up, as the bench's (its evidence stays in the pool)
    for q, r in zip(qs, reqs):
        log.clear()
        s = e.generate([r])[0].stats
        pool = [round(x, 3) for x in d.pools[T > 0].rates()[:3]]
        print(f"{q.question_id:>14} P={len(r.prompt_ids):4d} rounds {dict(s.tree_rounds)} tau {s.tau:.2f} pool {pool} "
              f"last {d.last.label} {d.last.predicted_speedup:.3f} look-backs {log}", flush=True)
