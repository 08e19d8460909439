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


@pytest.mark.not_quick  # the whole GPU check script on the CPU (10 s)
def test_gpu_check_equality_and_report_code_runs_on_tiny_cpu_shapes(monkeypatch):
    """The GPU script's equality sweep and report, on CPU through the interpreter: catches
    mistakes in the script before a GPU session spends time on it."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the script itself runs this at real sizes")
    mod = _load()
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    monkeypatch.setattr(mod, "DTYPES", (torch.float32,))
    rows = mod.check_equality(vocabs=(130,), batches=(3,), ks=(2,))
    assert len(rows) == 1
    row = rows[0]
    assert row["rejection"] and row["rejection_point_mass"] and row["rejection_ragged"] and row["typical"]
    assert row["logits_rows_differing"] == 0 and row["typical_logits_rows_differing"] == 0
    assert row["filtered_rows_differing"] == 0 and row["block_filtered_rows_differing"] == 0
    # the fused-vs-unfused SamplingParams timing runs both paths on one case; they agree here
    calls = mod._fused_and_unfused(mod.make_inputs(3, 2, 130, torch.float32, seed=1), 3, 2, 130)
    fused, unfused = calls["fused"](), calls["process_then_verify"]()
    assert fused.shape == (3, 3) and torch.equal(fused, unfused)
    # the arrival-counter check (repeated calls, counters back at zero) runs its code here too
    (arrivals,) = [r for r in mod.check_arrivals(shapes=((3, 2, 130),), repeats=2) if r["kernel"] == "rejection"]
    assert arrivals["ok"] and arrivals["counters_left_nonzero"] == 0
    meta = {"gpu": "none", "date": "today", "versions": {"torch": torch.__version__}, "copy_bandwidth_GBps": 1.0}
    graphs = [
        {"kernel": "rejection", "B": 1, "k": 4, "V": 130, "dtype": "float32", "replays_equal": True, "replay_us": 5.0}
    ]
    timings = [
        {
            "impl": "spec_samplers",
            "kernel": "rejection",
            "V": 130,
            "B": 3,
            "k": 2,
            "dtype": "float32",
            "warm_us": 1.0,
            "cold_us": 2.0,
            "floor_us": 1.0,
            "cold_over_floor": 2.0,
        }
    ]
    md = mod._markdown(meta, rows, graphs, timings, ["flashinfer not importable"])
    assert "| spec_samplers | rejection | 130 | 3 | 2 | float32 |" in md and "1/1 shapes equal" in md
