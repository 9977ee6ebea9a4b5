#!/bin/bash
# third device call (session 8): continue the shipped head on the grown data (bf16 target on the GPU, online
# features), holding out the same 64 records the shipped head never trained on. Head (bf16) + metrics -> $OUT.
set -u
K=/root/keep; OUT=$(cd "$OUT" && pwd)
[ -f $K/data/data.jsonl ] || { echo "NO PREPARED DATA"; exit 3; }
mkdir -p $K/head; cp .gpu/c3/config.json .gpu/c3/model.safetensors $K/head/
export PYTHONPATH=$K/site PYTHONUNBUFFERED=1 EAGLESPEC_CACHE_DIR=/root/cache OMP_NUM_THREADS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T=${T:-280}
R=/root/runs; mkdir -p $R; date
timeout -s INT $((T + 120)) python3 -m eaglespec.cli train --out-dir $R/L3 --data $K/data --init-head $K/head \
  --eval-ids .gpu/c3/eval_ids.txt --eval-records 64 --device cuda --model-dtype bfloat16 --precision bf16 \
  --kind eagle3 --draft-vocab-size 8192 --ttt-steps 5 --batch-size 64 --grad-accum 1 --lr 3e-4 --warmup-steps 30 \
  --max-steps 100000 --time-budget $T --eval-count 3 --eval-prompts mt_bench=$K/mt_bench.jsonl \
  --eval-prompts-per-category 3 --eval-acceptance-prompts 24 --eval-max-new-tokens 64 --eval-chain-depth 3 \
  --checkpoint-every 0 --no-progress --log-every 20 --threads 1 > $R/L3.log 2>&1
echo "train rc=$?"; date; tail -c 1500 $R/L3/train_summary.json
python3 - $R/L3/head/model.safetensors <<'PY'
import sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
p = Path(sys.argv[1])
if p.exists():
    t = load_file(p)
    save_file({k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in t.items()}, p)
    print("head ->", p.stat().st_size, "bytes")
PY
cd $R && tar -cf - --exclude='L3/checkpoints' L3 L3.log | gzip -1 | split -b 15500000 - $OUT/runs.tgz.
ls -la $OUT; date
