#!/usr/bin/env bash
# CI: the transformers tests on the oldest transformers the package supports (MIN_TRANSFORMERS in
# spec_samplers/integrations/transformers.py, 4.56) and on the newest the index serves, next to the
# one vLLM's environment pins (.ci/run runs this beside the main suite). Each runs in a venv over
# the test environment's packages (torch, triton, pytest, scipy ...) in which only transformers
# (and what it pins: huggingface-hub, tokenizers) is replaced, so nothing heavy is installed twice;
# pip's complaint that vLLM wants another transformers concerns the venv only.
#   bash tools/ci_transformers.sh                 # both: oldest, then newest
#   bash tools/ci_transformers.sh oldest          # venvs in .venv-tf-oldest/, .venv-tf-newest/ (git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
oldest="$(python -c 'from spec_samplers.integrations.transformers import MIN_TRANSFORMERS as v; print(".".join(map(str, v)))')"
for which in "${@:-oldest newest}"; do
  for one in $which; do
    case "$one" in
      oldest) spec="transformers==${oldest}.*" ;;
      newest) spec="transformers" ;;
      *) echo "usage: $0 [oldest] [newest]" >&2; exit 2 ;;
    esac
    venv=".venv-tf-$one"
    [ -x "$venv/bin/python" ] || python -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install -q --upgrade "$spec"
    "$venv/bin/python" -c 'import torch, transformers; print("transformers", transformers.__version__, "torch", torch.__version__)'
    # every test file that runs transformers models
    PYTHONPATH="$PWD" "$venv/bin/python" -m pytest -q -p no:cacheprovider -n auto \
      tests/test_hf_generate.py tests/test_decoding.py tests/test_tree_decoding.py tests/test_kv_cache.py \
      tests/test_generate_cli.py tests/test_tree_cli.py
  done
done
