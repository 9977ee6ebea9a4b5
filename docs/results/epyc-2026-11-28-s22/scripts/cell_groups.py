# One matrix cell, group by group: auto's and vanilla's batch wall (less prefill), their ratio, auto's trees.
import json, sys
run, ds, T, B = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
recs = [json.loads(l) for l in open(f"{run}/{ds}/records.jsonl")]
rows = {}
for r in recs:
    if r["temperature"] != T or r["batch_size"] != B: continue
    rows.setdefault((r["method"], r["batch_wall_s"]), []).append(r)
by = {}
for (m, w), rs in rows.items():
    key = tuple(sorted(x["question_id"] for x in rs))
    by.setdefault(key, {})[m] = (w, max(x["prefill_s"] for x in rs), rs, rs[0]["time"])
tot = {}
for key, d in by.items():
    v, a = d["vanilla"], d["eagle:auto"]
    tr = {}
    for x in a[2]:
        for k, n in x.get("tree_rounds", {}).items(): tr[k] = tr.get(k, 0) + n
    print(key[:4], f"vanilla {v[0]:.2f}s (prefill {v[1]:.2f}) auto {a[0]:.2f}s (prefill {a[1]:.2f})  speed {v[0] / a[0]:.3f}  decode {(v[0]-v[1]) / (a[0]-a[1]):.3f}", tr, v[3], a[3])
    for m in d: tot.setdefault(m, [0, 0]); tot[m][0] += d[m][0]; tot[m][1] += d[m][1]
print({m: f"{t[0]:.2f}s prefill {t[1]:.2f}" for m, t in tot.items()})
