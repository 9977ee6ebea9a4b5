#!/usr/bin/env bash
# Evaluate a draft head as README reports it, on prompts no training data overlaps (MT-bench first turns).
# Usage: bash scripts/eval_head.sh OUT [HEAD|shipped] [OTHER_HEAD]     (resumable: rerun to continue)
# Environment: D (data dir, default ../shared/data), LIMIT (questions, default all 80), TOKENS (256),
#              SPEED_LIMIT (questions in the batch-1 speed run, default 20), THREADS (2).
# 1. acceptance: greedy, TOKENS new tokens, a chain of 1 (depth-1 acceptance) and the default dynamic tree
#    (tau), with vanilla for the greedy-identity check; batch 8 (greedy tokens do not depend on the batch;
#    tested), OTHER_HEAD (e.g. the previous head) on the same prompts in the same run.
# 2. speed at batch 1: vanilla against the calibrated dispatcher (`--tree auto`) and a chain of 1..3.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1; HEAD=${2:-shipped}; OTHER=${3:-}
H=""; if [ "$HEAD" != shipped ]; then H="head=$HEAD,"; fi   # arms of the shipped head are named eagle:chain1 etc.
D=${D:-../shared/data}; E=${EAGLESPEC:-.venv/bin/eaglespec}; THREADS=${THREADS:-2}
MT=(--dataset "mt_bench=$D/mt_bench/question.jsonl" --max-turns 1)
LIM=(); [ -n "${LIMIT:-}" ] && LIM=(--limit "$LIMIT")
ARMS=(--methods vanilla --methods "eagle:${H}chain1" --methods "eagle:${H}dynamic")
[ -n "$OTHER" ] && ARMS+=(--methods "eagle:head=$OTHER,chain1" --methods "eagle:head=$OTHER,dynamic")
RES=(); [ -e "$OUT/acceptance/records.jsonl" ] && RES=(--resume)
"$E" bench "${MT[@]}" "${LIM[@]}" --max-new-tokens "${TOKENS:-256}" "${ARMS[@]}" --batch-size 8 \
    --threads "$THREADS" --out "$OUT/acceptance" "${RES[@]}"
RES=(); [ -e "$OUT/speed/records.jsonl" ] && RES=(--resume)
"$E" bench "${MT[@]}" --limit "${SPEED_LIMIT:-20}" --max-new-tokens 128 --methods vanilla \
    --methods "eagle:${H}auto" --methods "eagle:${H}chain1" --methods "eagle:${H}chain2" \
    --methods "eagle:${H}chain3" --batch-size 1 --threads "$THREADS" --out "$OUT/speed" "${RES[@]}"
