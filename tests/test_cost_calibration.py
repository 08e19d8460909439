"""The cost model stays on its calibration points (benchmarks/cost_calibration.py, issue 29).

The committed calibration file keeps, per modeled point, the inputs of the time model for that
point's kernel (bytes, issue cycles, grid, occupancy, bytes in flight, spills): the time model
(``spec_samplers.bench.cost.model``) is evaluated on them again here with the current constants,
so a change of a constant or a term that moves a point out of its band fails here. A point that
misses the band in the committed file says why (``note``) and is held where it is (it must not
move further away)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spec_samplers.bench.cost import model

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _points() -> list[dict]:
    files = sorted(RESULTS.glob("*-cost-calibration.json"))
    assert files, "no committed calibration file (python benchmarks/cost_calibration.py --json ...)"
    return json.loads(files[-1].read_text())


def test_calibration_file_lists_each_point_with_its_source():
    points = _points()
    assert len(points) >= 3
    for p in points:
        assert {"source", "gpu", "shape", "measured_us"} <= set(p) and p["measured_us"] > 0
        assert "modeled_us" in p or "not modeled" in p.get("note", "")


def test_time_model_keeps_its_calibration_points():
    modeled = [p for p in _points() if "time_model_inputs" in p]
    assert modeled
    for p in modeled:
        inputs = dict(p["time_model_inputs"])
        hw = model.HARDWARE[inputs.pop("hardware")]
        args = [inputs.pop(k) for k in ("bytes", "warp_cycles", "programs", "num_warps")]
        now = model.launch_time(hw, *args, **inputs)["kernel_s"] * 1e6
        # a changed constant or term moves the point: regenerate the file, then the band applies
        assert now == pytest.approx(p["modeled_us"], rel=1e-6), f"stale calibration point: {p['source']}"
        ratio, band = now / p["measured_us"], p["band"]
        if p["within_band"]:
            assert 1 / band <= ratio <= band, p["source"]
        else:  # a known miss (its note says why): it must not move further from the measurement
            assert p.get("note"), p["source"]
            committed = p["ratio_modeled_over_measured"]
            assert min(ratio, 1 / ratio) >= min(committed, 1 / committed) - 1e-9, p["source"]


def test_graph_totals_keep_their_measured_points():
    """The H200 points (benchmarks/cost_calibration.py --gpu-check): a graph replay is modeled as
    one replay plus, per node, the node cost and its kernel time. Re-evaluated with the current
    constants on the stored kernel and eager-op times, each stays where the file says, and in the
    band where the file says it is."""
    graph = [p for p in _points() if "graph_inputs" in p]
    for p in graph:
        inputs = p["graph_inputs"]
        central = model.LATENCIES["central"]
        now = (
            central.graph_replay + inputs["nodes"] * central.launch_graph + inputs["kernels_s"] + inputs["eager_ops_s"]
        )
        assert now * 1e6 == pytest.approx(p["modeled_us"], rel=1e-6), (
            f"stale graph point: {p['workload']} B={p['shape']['B']}"
        )
        assert {"commit", "triton", "fit"} <= set(p)
        if p["within_band"]:
            assert 1 / p["band"] <= now * 1e6 / p["measured_us"] <= p["band"]


def test_eager_totals_keep_their_measured_points():
    """The H200 eager points: the larger of the GPU's work and the host's (its measured
    host_overhead.py row plus the driver's launch per node). Re-evaluated with the current
    constants on the stored GPU work and host row, each stays where the file says, in its band,
    and says which commit was traced and how its host time was measured."""
    from spec_samplers.bench.cost.totals import eager_time

    eager = [p for p in _points() if "eager_inputs" in p]
    for p in eager:
        inputs, host = p["eager_inputs"], p["host"]
        assert host is not None, f"eager point without a measured host row: {p['workload']} B={p['shape']['B']}"
        host_s = (host["host_us"] + host["binder_us"]) * 1e-6
        now = eager_time(inputs["central"], inputs["nodes"], host_s, model.LATENCIES["central"]) * 1e6
        where = f"{p['workload']} B={p['shape']['B']}"
        assert now == pytest.approx(p["modeled_us"], rel=1e-6), f"stale eager point: {where}"
        assert {"commit", "triton", "fit", "traced_commit"} <= set(p)
        if p["within_band"]:
            assert 1 / p["band"] <= now / p["measured_us"] <= p["band"]
