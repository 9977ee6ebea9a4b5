"""Per request of a bench run's `--tree auto` arm: its predicted speedup (the cost model's, summed over its rounds)
against the one measured (vanilla's wall time over its own, same request), at one batch size and temperature;
then the requests grouped by predicted speedup, and the drafting ones' mean ratio predicted / measured.

    python predicted_by_request.py RECORDS.jsonl [RECORDS.jsonl ...] --batch 1 --temperature 1
"""
import argparse
import json
import statistics

ap = argparse.ArgumentParser()
ap.add_argument("records", nargs="+")
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--temperature", type=float, default=1.0)
a = ap.parse_args()
rows = []
for path in a.records:
    recs = [json.loads(line) for line in open(path)]
    cell = [r for r in recs if r["batch_size"] == a.batch and r["temperature"] == a.temperature]
    van = {r["question_id"]: r["wall_s"] for r in cell if r["method"] == "vanilla"}
    for r in cell:
        if r["method"] == "eagle:auto" and r.get("predicted_speedup"):
            drafted = sum(n for t, n in r["tree_rounds"].items() if t != "none")
            rows.append((path, r["question_id"], r["predicted_speedup"], van[r["question_id"]] / r["wall_s"], drafted,
                         sum(r["tree_rounds"].values())))
for path, q, pred, meas, drafted, rounds in rows:
    print(f"{path:60s} {q:>14s} drafted {drafted:3d}/{rounds:3d} predicted {pred:.3f} measured {meas:.3f}")
print()
for lo, hi in ((0, 1.0), (1.0, 1.02), (1.02, 1.05), (1.05, 9)):
    g = [m for _, _, p, m, d, _ in rows if lo <= p < hi and d]
    if g:
        print(f"drafting requests predicted [{lo:.2f}, {hi:.2f}): n={len(g):3d} measured mean {statistics.mean(g):.3f} "
              f"min {min(g):.3f} max {max(g):.3f}")
paused = [m for _, _, p, m, d, _ in rows if not d]
if paused:
    print(f"requests that never drafted: n={len(paused)} measured mean {statistics.mean(paused):.3f}")
ratio = [p / m for _, _, p, m, d, _ in rows if d]
print(f"drafting requests: predicted / measured mean {statistics.mean(ratio):.3f} (n={len(ratio)})")
