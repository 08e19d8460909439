"""benchmarks/host_overhead.py runs on a tiny shape and writes rows of the agreed schema (issue 40,
item 8). Only the schema and the counts' consistency are checked: speed lives in the benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROW_KEYS = {"entry": str, "impl": str, "B": int, "launches": int, "host_us": float, "binder_us": float}


@pytest.mark.vllm  # vLLM's own rows: the full tier, which has the vllm extra
@pytest.mark.not_quick  # imports vLLM in a fresh interpreter (about 20 s)
def test_host_overhead_writes_rows_of_the_schema(tmp_path):
    out = tmp_path / "host.json"
    # compiled Triton mode, as on a GPU machine (launches are planned and recorded, never run)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    args = ["--batch", "1", "2", "--vocab", "512", "--host-vocab", "64", "--repeats", "2"]
    only = ["--only", "mrv2_seam", "--only", "RejectionSampler.forward_ragged_from_logits", "--only", "softmax"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "host_overhead.py"), "--json", str(out), *args, *only],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["notes"] == [], doc["notes"]  # no row failed, counts equal at both vocabularies
    rows = doc["rows"]
    for row in rows:
        assert set(row) == set(ROW_KEYS), row
        assert all(isinstance(row[k], t) for k, t in ROW_KEYS.items()), row
        assert row["impl"] in ("ours", "vllm") and row["launches"] > 0 and row["host_us"] > 0, row
    keys = {(r["entry"], r["impl"], r["B"]) for r in rows}
    expected = {
        (entry, impl, B)
        for B in (1, 2)
        for entry, impl in (
            ("mrv2_seam", "ours"),
            ("mrv2_seam", "vllm"),
            ("RejectionSampler.forward_ragged_from_logits", "ours"),
            ("sampling.softmax", "ours"),
        )
    }
    assert keys == expected
    # every row with a Triton launch pays the binder; the details name what was counted
    for row, detail in zip(rows, doc["details"]):
        assert (detail["entry"], detail["impl"], detail["B"]) == (row["entry"], row["impl"], row["B"])
        assert row["launches"] == len(detail["triton"]) + sum(detail["eager"].values())
        assert (row["binder_us"] > 0) == bool(detail["triton"])
    assert {"commit", "versions", "load_average", "machine"} <= set(doc["meta"])
    assert (out.with_suffix(".md")).exists()
