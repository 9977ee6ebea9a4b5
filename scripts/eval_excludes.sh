# Sourced by the training scripts: EX = an --exclude flag for every evaluation file under $D, so that no
# training conversation overlaps a prompt we evaluate on (the overlap guard of `prepare-data`/`regenerate`).
EX=()
for f in mt_bench/question.jsonl spec_bench/question.jsonl humaneval/HumanEval.jsonl.gz gsm8k/test.jsonl \
         alpaca_eval/alpaca_eval.json eagle_bench/alpaca/question.jsonl eagle_bench/gsm8k/question.jsonl \
         eagle_bench/humaneval/question.jsonl eagle_bench/qa/question.jsonl eagle_bench/sum/question.jsonl; do
  EX+=(--exclude "$D/$f")
done
