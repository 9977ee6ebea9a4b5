# look-back vs real acceptance: MT-bench first turns (writing 81, 82; humanities 151) through --tree auto in one
# engine, in the bench's order; logs each pick's label, each look-back's hits/tries and the row's rates.
# Usage: D=../shared/data python lb.py 81,82,151,143 [threads] (question ids, in that order)
import os, sys, json, collections, torch
from eaglespec.config import GenerationConfig
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.generate import Engine, Request
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.spec.speculative import DraftOptions
from eaglespec.runtime.loading import load_target
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
ids = [int(x) for x in sys.argv[1].split(",")]
t = load_target()
qs = {int(q.question_id): q for q in load_questions("mt_bench=" + os.environ.get("D", "../shared/data") + "/mt_bench/question.jsonl", max_turns=1)}
p = build_calibrated_proposer(t, DraftOptions(tree="auto"))
d = p.dispatcher
log = []
pick0, olb0, obs0 = d.pick, d.observe_look_back, d.observe
def pick(*a, **k):
    c = pick0(*a, **k); log.append(("P", c.label, d.look_back_due)); return c
def olb(rows, hits, tries):
    olb0(rows, hits, tries); log.append(("LB", hits[0], tries[0], [round(x, 2) for x in d.rows[rows[0]].rates()]))
def obs(rows, cfg, n):
    obs0(rows, cfg, n)
    if cfg.drafts: log.append(("O", cfg.label, n[0], [round(x, 2) for x in d.rows[rows[0]].rates()] if rows[0] in d.rows else None))
d.pick, d.observe_look_back, d.observe = pick, olb, obs
e = Engine(t, p, max_batch_size=1)
with torch.inference_mode():
    for qid in ids:
        log.clear()
        req = Request(encode_messages(t.tokenizer, [{"role": "user", "content": qs[qid].turns[0]}]), GenerationConfig(128))
        out = e.generate([req])[0]
        cnt = collections.Counter(x[1] for x in log if x[0] == "P")
        print(qid, dict(cnt), "accepted", out.stats.accepted_per_position if hasattr(out, "stats") else None)
        run = []
        for x in log:
            if x[0] == "P":
                if run and run[-1][0] == x[1]: run[-1][1] += 1
                else: run.append([x[1], 1])
            else:
                print("   ", run, x); run = []
        print("   ", run)
