# Per request of one cell of a bench run (records.jsonl): a method's seconds beyond vanilla's, in ms: its draft
# window (the proposer's work and the engine's outside the target forward), its whole wall and its prefill.
#   python per_request.py RECORDS.jsonl TEMPERATURE BATCH [METHOD]   (METHOD default eagle:auto)
import json
import sys

recs = [json.loads(line) for line in open(sys.argv[1])]
T, B, method = float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "eagle:auto"
cell = [r for r in recs if r["temperature"] == T and r["batch_size"] == B]
base = {r["question_id"]: r for r in cell if r["method"] == "vanilla"}
for r in cell:
    v = base.get(r["question_id"])
    if r["method"] != method or v is None:
        continue
    ms = lambda k: (r[k] - v[k]) * 1e3  # noqa: E731
    print(f"{r['question_id']:>6} prompt {r['prompt_tokens']:4d} rounds {r.get('tree_rounds')} "
          f"draft +{ms('draft_s'):.1f} ms wall {ms('wall_s'):+.1f} ms prefill {ms('prefill_s'):+.1f} ms")
