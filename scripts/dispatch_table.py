"""Issue 14 table from dispatch_matrix.sh output: per dataset, T and batch, auto and fixed trees over vanilla
(tokens pooled over the prompts / wall seconds pooled), the per-prompt median, the criteria, and predicted.
usage: python scripts/dispatch_table.py OUT/mt_bench OUT/spec_bench ..."""
import json, sys, collections, statistics
rows = []
for ds in sys.argv[1:]:
    R = [json.loads(l) for l in open(f"{ds}/records.jsonl")]
    g = collections.defaultdict(lambda: [0, 0.0]); pred = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    per = collections.defaultdict(dict); mism = 0
    for r in R:
        k = (r["dataset"], r["temperature"], r["batch_size"])
        g[k + (r["method"],)][0] += r["new_tokens"]; g[k + (r["method"],)][1] += r["wall_s"]
        per[k + (r["question_id"],)][r["method"]] = r["new_tokens"] / r["wall_s"]
        mism += bool(r.get("mismatch"))
        if r["method"] == "eagle:auto" and r.get("predicted_speedup") is not None:
            pred[k][0] += r["predicted_speedup"] * r["new_tokens"]; pred[k][1] += r["new_tokens"]
    keys = sorted({k[:3] for k in g})
    for k in keys:
        tps = {m: g[k + (m,)][0] / g[k + (m,)][1] for (a, b, c, m) in g if (a, b, c) == k}
        v = tps["vanilla"]; auto = tps["eagle:auto"] / v
        fixed = {m: s / v for m, s in tps.items() if m.startswith("eagle:chain")}
        best = max(fixed, key=fixed.get)
        ratios = [d["eagle:auto"] / d["vanilla"] for kk, d in per.items() if kk[:3] == k and "eagle:auto" in d and "vanilla" in d]
        p = pred[k][0] / pred[k][1] if pred[k][1] else float("nan")
        n = sum(1 for kk in per if kk[:3] == k)
        print(f"| {k[0]} | {k[1]:g} | {k[2]} | {n} | {v:.1f} | **{auto:.3f}x** | {statistics.median(ratios):.3f}x | "
              f"{' / '.join(f'{fixed[m]:.2f}' for m in sorted(fixed))} | {best.split(':')[1]} {fixed[best]:.2f}x | "
              f"{'yes' if auto >= 0.98 else 'no'} | {'yes' if auto >= fixed[best] * 0.95 else 'no'} | {p:.2f}x | {p / auto:.2f} |")
    print("greedy mismatches:", mism, file=sys.stderr)
