#!/usr/bin/env bash
# Issue 14's test of `--tree auto` (docs/DISPATCH.md, "Protocol"): on MT-bench, Spec-Bench (every category) and
# HumanEval first turns, at batch 1 and 4, greedy and T=1, the default speculative run (`eagle` = `--tree auto`)
# against vanilla and the fixed trees (chains of 1-3, the dynamic tree), one bench run per dataset.
#
#   bash scripts/dispatch_matrix.sh OUT [HEAD]       (HEAD: default the shipped head; resumable: rerun to continue)
#
# Environment: D (data dir, default ../shared/data), MT_PER_CATEGORY / SB_PER_CATEGORY (MT-bench / Spec-Bench
# questions per category, default 3 / 2), HUMANEVAL (HumanEval problems, default 20), TOKENS (128), THREADS (2),
# TREES (the fixed trees, default "chain1 chain2 chain3 dynamic"), TEMPS (the temperatures, default "0,1"),
# BATCHES (the batch sizes, default "1,4").
# Every request decodes exactly TOKENS tokens (--ignore-eos): at T=1 the methods sample different streams that
# stop at different lengths, and a run with shorter outputs pays its prompt over fewer tokens. The methods decode
# each group in lockstep (bench --interleave; INTERLEAVE=0: back to back, as before session 34).
# Run it on a quiet machine; the calibration runs first so that no timed run includes it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1; HEAD=${2:-}
D=${D:-../shared/data}; E=${EAGLESPEC:-.venv/bin/eaglespec}; THREADS=${THREADS:-2}
H=""; DRAFT=(); if [ -n "$HEAD" ]; then H="head=$HEAD,"; DRAFT=(--draft "$HEAD"); fi
A="vanilla,eagle:${H}auto"
for t in ${TREES:-chain1 chain2 chain3 dynamic}; do A="$A,eagle:${H}$t"; done
C=(--max-turns 1 --ignore-eos --batch-size "${BATCHES:-1,4}" --temperature "${TEMPS:-0,1}" --max-new-tokens "${TOKENS:-128}" --threads "$THREADS"
   --seed 0 --methods "$A")
[ "${INTERLEAVE:-1}" = 0 ] || C+=(--interleave)
"$E" calibrate "${DRAFT[@]}" --threads "$THREADS"
run() {  # run NAME bench-args...
    local name=$1; shift
    local res=(); [ -e "$OUT/$name/records.jsonl" ] && res=(--resume)
    "$E" bench "$@" "${C[@]}" --out "$OUT/$name" "${res[@]}"
}
run mt_bench --dataset "mt_bench=$D/mt_bench/question.jsonl" --limit-per-category "${MT_PER_CATEGORY:-3}"
run spec_bench --dataset "spec_bench=$D/spec_bench/question.jsonl" --limit-per-category "${SB_PER_CATEGORY:-2}"
run humaneval --dataset "humaneval=$D/humaneval/HumanEval.jsonl.gz" --limit "${HUMANEVAL:-20}"
