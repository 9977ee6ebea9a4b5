"""The fixed chains' decode step in vanilla steps (decode seconds per target forward, the same request's over
vanilla's), median over a bench run's batch-1 requests, at T=0 and at T=1, per records file.

    python chain_steps_by_temperature.py RECORDS.jsonl...
"""
import json
import statistics
import sys


def step(r):
    return (r["wall_s"] - r["prefill_s"]) / r["target_forwards"]


for path in sys.argv[1:]:
    rows = [json.loads(line) for line in open(path)]
    out = []
    for temp in (0, 1):
        by = {}
        for r in rows:
            if r["batch_size"] == 1 and r["temperature"] == temp:
                by.setdefault(r["question_id"], {})[r["method"]] = r
        for m in ("eagle:chain1", "eagle:chain2"):
            ratios = [step(d[m]) / step(d["vanilla"]) for d in by.values() if m in d and "vanilla" in d]
            if ratios:
                out.append(f"{m[6:]} T={temp} {statistics.median(ratios):.2f}")
    print(path, " | ".join(out))
