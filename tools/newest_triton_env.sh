#!/usr/bin/env bash
# A second test environment with the newest Triton the package index serves (.ci/run runs the
# kernel tests in it; README.md, "Development"). vLLM's pin never brings it: vLLM 0.33's torch
# 2.14 requires triton 3.8. torch 2.13.0's CPU build requires no triton, so `pip install -e
# ".[test]"` resolves the newest (triton 3.9.0 on 2026-11-28), as a new user's install does.
#   bash tools/newest_triton_env.sh [VENV]      (default: .venv-newest-triton, git-ignored)
# Where the index's torch 2.13.0 is the CUDA build (which pins its own triton), point
# TORCH_INDEX_URL at a CPU index, e.g. https://download.pytorch.org/whl/cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
venv="${1:-.venv-newest-triton}"
[ -x "$venv/bin/python" ] || python -m venv "$venv"
"$venv/bin/pip" install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
"$venv/bin/pip" install -q -e ".[test]"
"$venv/bin/python" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
