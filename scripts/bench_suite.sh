#!/usr/bin/env bash
# The full benchmark suite of docs/results/HISTORY.md ("The benchmark suite"), on the default model and the shipped head, into one directory.
#
#   bash scripts/bench_suite.sh [OUT_DIR]        (default results/suite)
#
# Every phase is one `eaglespec bench ... --resume` into the same directory, so the phases share their vanilla
# records (each speedup compares the same prompts), a rerun continues where an interrupted one stopped, and the
# report at the end covers everything. Environment: MAX_NEW_TOKENS (128), THREADS (2), PHASES (all of
# "mt_bench code_math spec_bench batch temp1 trees llamacpp cost", in that order), EAGLESPEC (the eaglespec
# executable). The llamacpp phase needs `pip install -e .[llamacpp]` and is skipped (with a note) without it.
# Run it on a quiet machine: anything else running changes the timings.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/suite}
DATA=${DATA:-../shared/data}
TOKENS=${MAX_NEW_TOKENS:-128}
THREADS=${THREADS:-2}
PHASES=${PHASES:-"mt_bench code_math spec_bench batch temp1 trees llamacpp cost"}
EAGLESPEC=${EAGLESPEC:-.venv/bin/eaglespec}

bench() { "$EAGLESPEC" bench --out "$OUT" --resume --max-new-tokens "$TOKENS" --threads "$THREADS" --no-report "$@"; }
MT=(--dataset "mt_bench=$DATA/mt_bench/question.jsonl")

for phase in $PHASES; do
  echo "=== phase $phase ($(date -u +%H:%M:%S))"
  case $phase in
    # MT-bench, 80 questions, both turns, greedy, batch 1: the headline comparison, with HF generate()
    mt_bench) bench "${MT[@]}" --methods vanilla,eagle,hf ;;
    # code and math: HumanEval and GSM8K test, first 80 each; prompt lookup is at home on code
    code_math) bench --dataset "humaneval=$DATA/humaneval/HumanEval.jsonl.gz" \
                     --dataset "gsm8k=$DATA/gsm8k/test.jsonl" --limit 80 --methods vanilla,eagle,hf-prompt-lookup ;;
    # Spec-Bench's own categories (its MT-bench categories are MT-bench questions), 10 per category
    spec_bench) bench --dataset "spec_bench=$DATA/spec_bench/question.jsonl" --max-turns 1 \
                      --categories translation,summarization,qa,math_reasoning,rag --limit-per-category 10 \
                      --methods vanilla,eagle ;;
    # batch sweep on the first 40 MT-bench first turns (batch 1 is already measured by the mt_bench phase)
    batch) bench "${MT[@]}" --max-turns 1 --limit 40 --batch-size 1,2,4,8 --methods vanilla,eagle ;;
    # sampling, T=1: MT-bench first turns, HumanEval, GSM8K (first 40 each)
    temp1) bench "${MT[@]}" --max-turns 1 --dataset "humaneval=$DATA/humaneval/HumanEval.jsonl.gz" \
                 --dataset "gsm8k=$DATA/gsm8k/test.jsonl" --limit 40 --temperature 1 --methods vanilla,eagle ;;
    # tree shapes with the shipped head (tau vs tree size), first 16 MT-bench first turns
    trees) bench "${MT[@]}" --max-turns 1 --limit 16 \
                 --methods vanilla,eagle:chain1,eagle:chain4,eagle:static \
                 --methods eagle:dynamic,depth=5,topk=4,tokens=16 ;;
    # where a quantized C++ runtime stands: llama.cpp on the same GGUF (Q4_1 weights), MT-bench, batch 1
    llamacpp) bench "${MT[@]}" --methods vanilla,llama.cpp ;;
    # target forward latency over N tokens per batch size (what a bigger tree costs)
    cost) "$EAGLESPEC" bench --cost-curve --out "$OUT" --threads "$THREADS" --cost-repeats 5 --no-report ;;
    *) echo "unknown phase: $phase (phases: mt_bench code_math spec_bench batch temp1 trees llamacpp cost)" >&2
       exit 2 ;;
  esac
done
"$EAGLESPEC" report "$OUT"
