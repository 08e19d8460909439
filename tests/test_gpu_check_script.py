"""benchmarks/gpu_check.py imports everywhere and refuses clearly without CUDA."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_requires_cuda(monkeypatch, tmp_path):
    mod = _load()
    assert (mod.VOCABS, mod.BATCHES, mod.KS) == ((32000, 128256, 152064), (1, 8, 64, 256), (1, 4, 8))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="CUDA required"):
        mod.main(["--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())
