"""The pytest-benchmark suite in benchmarks/ collects and runs once in its quick mode."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.not_quick  # the whole benchmarks/ suite in a subprocess
def test_benchmark_suite_runs_in_quick_mode():
    # TRITON_INTERPRET=1: the Triton kernel path (when the samplers have one) runs on the CPU too
    env = {**os.environ, "PYTHONPATH": REPO, "SPEC_SAMPLERS_BENCH_QUICK": "1", "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "benchmarks", "--benchmark-disable", "-v", "-p", "no:cacheprovider", "-rs"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, proc.stdout[-4000:]
    # every implementation ran or was skipped with its reason; the baselines section is printed
    assert "spec-samplers baselines" in proc.stdout
    assert "vllm_v0_torch: ran" in proc.stdout
    for impl in ("rejection_sampler-torch", "typical_acceptance_sampler-torch", "vllm_v0_torch"):
        for dtype in ("float32", "bfloat16"):
            test_id = f"test_verification[B3-k2-V512-{dtype}-{impl}] PASSED"
            assert test_id in proc.stdout, (test_id, proc.stdout[-4000:])
