#!/bin/bash
# third device call (session 18): stage 4 of the shipped head on the grown data (bf16 target on the GPU, online
# features), holding out the same 64 records as stages 1-3; the test suite runs on the host's CPU cores beside
# it (CPU paths, this image's torch/transformers). Head (bf16, split), metrics, logs -> $OUT.
set -u
K=/root/keep; OUT=$(cd "$OUT" && pwd); REPO=$(pwd)
[ -f $K/data/data.jsonl ] || { echo "NO PREPARED DATA"; exit 3; }
mkdir -p $K/head; cp .gpu/c3/config.json .gpu/c3/model.safetensors $K/head/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/c3/whl/*.whl
export PYTHONUNBUFFERED=1 EAGLESPEC_CACHE_DIR=/root/cache PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
T=${T:-280}
( export PYTHONPATH=$K/site:/tmp/site EAGLESPEC_CACHE_DIR=/root/tcache CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1
  nice -n 19 timeout $((T + 30)) python3 -m pytest -q -n 6 -p no:cacheprovider > $K/pytest.log 2>&1; echo "pytest rc=$?" >> $K/pytest.log ) &
R=/root/runs; mkdir -p $R; date
PYTHONPATH=$K/site OMP_NUM_THREADS=1 timeout -s INT $((T + 120)) python3 -m eaglespec.cli train --out-dir $R/L4 \
  --data $K/data --init-head $K/head \
  --eval-ids $K/eval_ids.txt --eval-records 64 --device cuda --model-dtype bfloat16 --precision bf16 \
  --kind eagle3 --draft-vocab-size 8192 --ttt-steps 5 --batch-size 64 --grad-accum 1 --lr 3e-4 --warmup-steps 30 \
  --max-steps 100000 --time-budget $T --eval-count 3 --eval-prompts mt_bench=$K/question.jsonl \
  --eval-prompts-per-category 3 --eval-acceptance-prompts 24 --eval-max-new-tokens 64 --eval-chain-depth 3 \
  --checkpoint-every 0 --no-progress --log-every 20 --threads 1 > $R/L4.log 2>&1
echo "train rc=$?"; date; tail -c 1200 $R/L4/train_summary.json; echo
PYTHONPATH=$K/site python3 - $R/L4/head/model.safetensors <<'PY'
import sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
p = Path(sys.argv[1])
if p.exists():
    t = load_file(p)
    save_file({k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in t.items()}, p)
    print("head ->", p.stat().st_size, "bytes")
PY
wait; tail -n 15 $K/pytest.log; cp $K/pytest.log $OUT/
cd $R && tar -cf - --exclude='L4/checkpoints' L4 L4.log | gzip -1 | split -b 15500000 - $OUT/runs.tgz.
ls -la $OUT; date
