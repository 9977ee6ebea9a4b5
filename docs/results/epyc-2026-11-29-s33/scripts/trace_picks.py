# auto alone over the requests in order: per request, its runs of labels, and at each change the row's rates
import sys, torch
from eaglespec.measure.ab import arm_engine, first_turn_requests
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
target = load_target(None)
reqs = first_turn_requests(target.tokenizer, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
eng = arm_engine(target, sys.argv[5] if len(sys.argv) > 5 else "auto", 1)
d = eng.proposer.dispatcher
log = []
pick = d.pick
def pick_(*a, **k):
    cfg = pick(*a, **k)
    rows = a[1] if len(a) > 1 else k.get("rows")
    t = d.rows.get(rows[0]) if rows else None
    lab = cfg.label + ("/LB" if d.look_back_due else "")
    if not log or log[-1][0] != lab:
        own = d._own.get(rows[0])
        log.append([lab, 0, [round(x, 2) for x in t.rates()[:2]] if t else None, [round(x, 1) for x in t.tries[:2]] if t else None,
                    (round(own.hits[0], 1), round(own.tries[0], 1)) if own else None,
                    round(d.last.predicted_speedup, 3) if d.last else None, {k: round(v, 3) for k, v in d._factors(1).items()}, {k: round(v, 3) for k, v in ((l, d.feedback.ratio(1, l, d._context)) for l in ("none", "chain1", "chain2")) if v}])
    log[-1][1] += 1
    return cfg
d.pick = pick_
with torch.inference_mode():
    for i, r in enumerate(reqs * int(sys.argv[4])):
        log.clear()
        c = eng.generate([r])[0]
        print(i % len(reqs), len(r.prompt_ids), "acc", [round(a, 2) for a in c.stats.acceptance_by_position(1)],
              "pool", [round(x, 2) for x in d.pools[False].rates()[:2]], "spread", d.spreads[False].prior(), d.spreads[True].prior())
        for e in log: print("   ", e)
for e in d.feedback.snapshot(): print(e)
print("catch-up us/pair", 1e6 * d._catch_up_s / max(d._catch_up_pairs, 1e-9))
