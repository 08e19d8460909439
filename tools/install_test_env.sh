#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine: this package with its test extras and the
# vLLM its `vllm` extra names (0.33.x, which brings torch 2.14). README.md, "Run the tests":
#   bash tools/install_test_env.sh && python -m pytest
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! pip install -e ".[test,vllm]"; then
  # Fallback, only when pip cannot resolve: vLLM 0.33.0 requires certifi>=2026.10.19, and the
  # package index the CI machines reach stops at certifi 2026.10.18, so pip refuses (in seconds).
  # uv's --override replaces just that requirement (certifi is Mozilla's CA bundle; nothing in the
  # tests depends on a month of it); everything else resolves from the same index as pip would.
  pip install uv
  overrides="$(mktemp)"
  echo "certifi==2026.10.18" > "$overrides"
  uv pip install --python "$(command -v python)" -e ".[test,vllm]" --override "$overrides"
fi
# flashinfer-python 0.7.2 (a vLLM 0.33 dependency, "cuda-python>=12.0") resolves to cuda-python
# 12.6.2.post1, the last release that bundles its own cuda/bindings package: installed after
# cuda-bindings 13.x it overwrites that package's files, and torch.compile's inductor (the CPU race
# of tests/test_rng.py) then fails importing nvidia-cutlass-dsl ("cuda.bindings.runtime has no
# attribute cudaLibrary_t"). Put cuda-bindings' own files back when the two disagree.
if python -c 'import sys, cuda.bindings as b; from importlib.metadata import version; sys.exit(b.__version__ == version("cuda-bindings"))' 2>/dev/null; then
  pip install --no-deps --force-reinstall "cuda-bindings==$(python -c 'from importlib.metadata import version; print(version("cuda-bindings"))')"
fi
# vLLM pulls CUDA builds of torchvision, torchaudio and torchcodec; next to a CPU-only machine they
# break importing transformers ("operator torchvision::nms does not exist"); the tests need none.
pip uninstall -y torchvision torchaudio torchcodec
