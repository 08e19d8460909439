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


@pytest.mark.vllm  # the exported copy of vLLM's kernels is taken from the installed vLLM
def test_gpu_check_quick_runs_on_tiny_cpu_shapes(monkeypatch, tmp_path):
    """--quick's code on CPU through the interpreter: ours, our MRv2 seam and vLLM's MRv2 built
    from the cost model's workloads (vLLM's kernels imported from an exported copy of its files,
    as on a GPU machine without vLLM), timed, and laid out next to the modeled values."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the script itself runs this at real sizes")
    from triton.language.extra import libdevice

    from spec_samplers.bench import vllm_source
    from spec_samplers.bench.cost import standins

    mod = _load()
    monkeypatch.setattr(mod, "DEVICE", "cpu")
    monkeypatch.setattr(libdevice, "log1p", standins.log1p)  # the interpreter has no libdevice
    src = tmp_path / "vllm_src"
    written = vllm_source.export(src)
    assert (src / "VLLM_VERSION").read_text().strip() and len(written) >= 2
    notes: list[str] = []
    modules = mod.quick_vllm_modules(str(src), notes)
    assert notes == [] and all(str(src) in m.__file__ for m in modules.values())
    builders = mod.quick_calls(2, 2, 256, "float32", modules)
    assert set(builders) == {"ours", "ours-v2-seam", "vllm-mrv2"}
    measured = mod.time_quick(builders, 256, rounds=2, iters=(1, 1))
    for impl, m in measured.items():
        assert m["tokens_in_range"], impl
        assert 0 < m["eager_warm_range_us"][0] <= m["eager_warm_us"] <= m["eager_warm_range_us"][1]
    modeled = mod.modeled_costs("NVIDIA H100 80GB HBM3")
    assert modeled["gpu"] == "H100" and modeled["rows"]["ours/1"]["graph_us"] > 0
    rows = mod.quick_rows({1: measured}, modeled)
    assert {r["impl"] for r in rows} == set(builders) and all("modeled_graph_us" in r for r in rows)
    assert "| ours | 1 |" in mod.quick_table(rows)
    # vLLM absent and no copy: a note, and ours is still timed
    missing: list[str] = []
    assert mod.quick_vllm_modules(str(tmp_path / "nowhere"), missing) is None and "vllm-mrv2" in missing[0]


def test_gpu_check_quick_main_writes_one_json_without_vllm(monkeypatch, tmp_path):
    """--quick end to end on CPU with vLLM not importable (the GPU machine has none): ours and our
    seam are timed, vLLM's row is a note, and everything lands in the one JSON file --out names."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the script itself runs this at real sizes")
    import argparse
    import json
    import sys

    mod = _load()
    for name in ["vllm", *(m for m in sys.modules if m.startswith("vllm."))]:  # (another test's imports too)
        monkeypatch.setitem(sys.modules, name, None)
    for name, value in dict(
        DEVICE="cpu", QUICK_V=256, QUICK_K=2, QUICK_DTYPE="float32", QUICK_READ_BYTES=2**20
    ).items():
        monkeypatch.setattr(mod, name, value)
    monkeypatch.setattr(mod, "QUICK_ROUNDS", 1)
    monkeypatch.setattr(mod, "QUICK_WARM_ITERS", 1)
    monkeypatch.setattr(mod, "QUICK_COLD_ITERS", 1)
    out = tmp_path / "quick.json"
    args = argparse.Namespace(out=str(out), quick_batches=[1, 2], vllm_src=None)
    meta = {"gpu": "NVIDIA H200", "date": "2026-11-28T03:00:00+00:00", "versions": {}}
    assert mod.quick_main(args, meta) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["quick.json"]
    report = json.loads(out.read_text())
    assert {(r["impl"], r["B"]) for r in report["rows"]} == {(i, b) for i in ("ours", "ours-v2-seam") for b in (1, 2)}
    assert "vllm-mrv2 not timed" in report["notes"][0] and report["read_bandwidth_GBps"] > 0
    assert report["modeled_from"]["gpu"] == "H200" and report["launch"]["eager_tiny_kernel_us"] > 0
