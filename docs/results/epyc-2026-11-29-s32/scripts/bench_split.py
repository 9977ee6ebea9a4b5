# Sums of a bench run's records per method: wall, draft, verify and prefill seconds, and rounds per tree.
# python bench_split.py OUT/records.jsonl
import collections
import json
import sys

recs = collections.defaultdict(dict)
for l in open(sys.argv[1]):
    r = json.loads(l)
    recs[r["question_id"]][r["method"]] = r
meths = sorted({m for d in recs.values() for m in d})
for m in meths:
    tot = collections.Counter()
    for d in recs.values():
        r = d[m]
        for k in ("wall_s", "draft_s", "verify_s", "prefill_s"):
            tot[k] += r.get(k) or 0
        for t, v in (r.get("tree_rounds") or {}).items():
            tot["r_" + t] += v
    print(f"{m:12s}", {k: round(v, 3) for k, v in tot.items()})
