#!/usr/bin/env bash
# Device checks on a GPU machine, through the same CLI commands users run (docs/RUNTIME.md "GPU").
#
#   bash scripts/device_check.sh OUT [DEVICE]        (DEVICE: cuda by default)
#
# On a tiny random Llama saved as a Hugging Face directory: prepare-data, a few training steps (online
# features, --device), greedy `generate` with the trained head vs `--draft none` (must be token-identical),
# and a regeneration exported with --export-work and made from the work file on the device. Each check prints
# one line `CHECK <name> ok|FAIL`; logs go to OUT/. Exit status: the number of failed checks.
set -u
OUT=${1:?usage: device_check.sh OUT [DEVICE]}
DEV=${2:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
W=$(mktemp -d)
fails=0

check() {  # check NAME CMD...: run CMD, log to OUT/NAME.log
    local name=$1; shift
    if "$@" >"$OUT/$name.log" 2>&1; then echo "CHECK $name ok"; else echo "CHECK $name FAIL"; tail -n 25 "$OUT/$name.log"; fails=$((fails + 1)); fi
}

# the tiny target and its training prompts (the tests' tiny model: tests/helpers.py)
$PY - "$W" <<'EOF'
import json, random, sys
sys.path.insert(0, "tests")
from helpers import tiny_hf_model, tiny_tokenizer
w = sys.argv[1]
hf = tiny_hf_model("llama", num_hidden_layers=4)
hf.save_pretrained(f"{w}/model")
tiny_tokenizer().save_pretrained(f"{w}/model")
rng = random.Random(0)
words = ["fox", "dog", "cat", "one", "two", "add", "sum", "tree", "draft", "token"]
with open(f"{w}/train.jsonl", "w") as f:
    for i in range(64):
        msgs = [{"role": "user", "content": "Say " + " ".join(rng.choice(words) for _ in range(5))},
                {"role": "assistant", "content": "x"}]
        f.write(json.dumps({"id": f"t{i}", "messages": msgs}) + "\n")
with open(f"{w}/prompts.jsonl", "w") as f:
    for i in range(4):
        f.write(json.dumps({"prompt": "Say " + " ".join(rng.choice(words) for _ in range(4))}) + "\n")
EOF

M="--model $W/model"
check prepare $PY -m eaglespec.cli prepare-data $M --input "$W/train.jsonl" --output "$W/data" --max-len 96 \
    --regenerate --regen-max-new-tokens 24 --regen-batch-size 16 --device "$DEV"
check train $PY -m eaglespec.cli train $M --data "$W/data" --out-dir "$W/run" --device "$DEV" --max-steps 20 \
    --batch-size 8 --draft-vocab-size 200 --eval-records 8 --eval-every 10 --eval-acceptance-prompts 4 \
    --checkpoint-every 10 --no-progress
# bf16 autocast over a bf16 target, the step count fitted to a time budget (the GPU training recipe)
check train-bf16-budget $PY -m eaglespec.cli train $M --data "$W/data" --out-dir "$W/run-bf16" --device "$DEV" \
    --model-dtype bfloat16 --precision bf16 --max-steps 100000 --time-budget 8 --eval-count 2 --batch-size 8 \
    --draft-vocab-size 200 --eval-records 8 --eval-acceptance-prompts 4 --num-layers 2 --labels hard --no-progress
for d in float32 bf16; do
    for draft in none "$W/run/head"; do
        tag=$([ "$draft" = none ] && echo vanilla || echo eagle)
        check "generate-$d-$tag" $PY -m eaglespec.cli generate $M --prompts-file "$W/prompts.jsonl" --device "$DEV" \
            --dtype "$d" --max-new-tokens 40 --ignore-eos --batch-size 2 --json --draft "$draft" --tree chain --depth 3
    done
    # float32: token-identical. bf16: reported, not required: a random tiny model's logits are full of
    # near-ties, and a verify forward over several tokens rounds differently from one-token decodes.
    check "greedy-identical-$d" $PY - "$OUT/generate-$d-vanilla.log" "$OUT/generate-$d-eagle.log" "$d" <<'EOF'
import json, sys
def ids(p):
    return [json.loads(l)["token_ids"] for l in open(p) if l.startswith("{")]
a, b = ids(sys.argv[1]), ids(sys.argv[2])
assert a and len(a) == len(b), "missing outputs"
same = [next((i for i, (x, y) in enumerate(zip(u, v)) if x != y), len(u)) for u, v in zip(a, b)]
print("tokens identical before the first difference, per prompt:", same, "of", [len(u) for u in a])
assert sys.argv[3] != "float32" or a == b, "float32 speculative greedy output differs from vanilla"
EOF
done
check export $PY -m eaglespec.cli regenerate $M --input "$W/train.jsonl" --output "$W/regen-here" --max-len 96 \
    --max-new-tokens 16 --shard-size 16 --export-work "$W/work.jsonl.gz"
check regenerate $PY -m eaglespec.cli regenerate $M --work "$W/work.jsonl.gz" --output "$W/regen-there" \
    --batch-size 32 --device "$DEV"
ls "$W/regen-there" > "$OUT/regen-files.txt" 2>&1
rm -rf "$W"
echo "device checks: $fails failed"
exit $fails
