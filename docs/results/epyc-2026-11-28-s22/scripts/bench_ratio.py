import json, collections, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/records.jsonl")]
acc = collections.defaultdict(lambda: [0.0, 0])
for r in recs:
    a = acc[r["method"]]; a[0] += r["batch_wall_s"] - r["prefill_s"]; a[1] += r["target_forwards"]
per = {m: a[0] / a[1] * 1e3 for m, a in acc.items()}
print(" ".join(f"{m} {v:.2f} ms" for m, v in per.items()), "ratio %.3f" % (per["eagle:chain1"] / per["vanilla"]))
