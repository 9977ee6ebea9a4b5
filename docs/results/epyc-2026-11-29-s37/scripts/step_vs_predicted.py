"""auto's predicted step (plain steps) against its measured decode step (vanilla steps), and the tokens per round
predicted against measured, pooled over a bench run's batch-1 requests, per temperature.

    python step_vs_predicted.py RECORDS.jsonl...
"""
import json
import sys

for path in sys.argv[1:]:
    rows = [json.loads(line) for line in open(path)]
    for temp in (0, 1):
        rs = [r for r in rows if r["batch_size"] == 1 and r["temperature"] == temp]
        vanilla = {r["question_id"]: r for r in rs if r["method"] == "vanilla"}
        auto = [r for r in rs if r["method"] == "eagle:auto"]
        if not auto:
            continue
        ps = sum(r["predicted_s"] for r in auto); pv = sum(r["predicted_vanilla_s"] for r in auto)
        pr = sum(r["predicted_rounds"] for r in auto); pt = sum(r["predicted_tokens"] for r in auto)
        ms = sum(r["wall_s"] - r["prefill_s"] for r in auto); mf = sum(r["target_forwards"] for r in auto)
        vs = sum(vanilla[r["question_id"]]["wall_s"] - vanilla[r["question_id"]]["prefill_s"] for r in auto)
        vf = sum(vanilla[r["question_id"]]["target_forwards"] for r in auto)
        print(f"{path} T={temp}: predicted step {ps / pv:.3f} plain steps, measured {(ms / mf) / (vs / vf):.3f} "
              f"vanilla steps; tokens a round predicted {pt / pr:.3f}, measured {sum(r['new_tokens'] for r in auto) / mf:.3f}")
