"""pytest-benchmark suite of the verification step: ``pytest benchmarks/ --benchmark-only``.

Grid, device and quick mode: ``spec_samplers/bench/suite.py`` (environment variables
SPEC_SAMPLERS_BENCH_B/_K/_V/_DTYPE/_DEVICE/_QUICK). The JSON written by ``--benchmark-json``
gets a ``spec_samplers`` field: machine info and, per baseline, whether it ran here and why not.
"""

from __future__ import annotations

import os

import pytest

from spec_samplers.bench import baselines, report, suite


def pytest_addoption(parser):
    parser.addoption("--bench-quick", action="store_true", help="spec-samplers: one tiny point per implementation")


def pytest_configure(config):
    if config.getoption("--bench-quick"):
        os.environ[suite.QUICK_ENV] = "1"


def pytest_generate_tests(metafunc):
    if "point" in metafunc.fixturenames:
        try:
            points = suite.grid()
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        metafunc.parametrize("point", points, ids=[f"B{b}-k{k}-V{v}-{d}" for b, k, v, d in points])


def pytest_benchmark_update_json(config, benchmarks, output_json):
    device = suite.bench_device()
    output_json["spec_samplers"] = {
        "machine": report.machine_info(device),
        "quick": suite.quick_mode(),
        "grid": suite.grid(),
        "baselines": baselines.availability(device),
    }


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.section("spec-samplers baselines")
    for name, status in baselines.availability(suite.bench_device()).items():
        terminalreporter.write_line(f"{name}: {'ran' if status['available'] else 'unavailable: ' + status['reason']}")
