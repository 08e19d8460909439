"""pytest-benchmark suite of the FlashInfer-compatible sampling operations (spec_samplers.sampling)
against the PyTorch way (sort-based top-k / top-p, torch.softmax, exponential-race sampling), and
FlashInfer itself on CUDA when it imports. The same calls as ``spec-samplers bench sampling``
(spec_samplers/bench/sampling_ops.py).

Grid: B in 1,16 x V in 32000,128256 by default; SPEC_SAMPLERS_SAMPLING_FULL=1 runs the full grid
(B in 1,16,128,512 x V in 32000,128256,152064); ``--bench-quick`` one tiny point. extra_info holds
bytes, GB/s and the share of the byte floor (bytes / measured copy bandwidth / time).

    pytest benchmarks/test_sampling_ops.py --benchmark-only --benchmark-json out.json
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from spec_samplers.bench import sampling_ops as so
from spec_samplers.bench.suite import bench_device, quick_mode
from spec_samplers.bench.timing import synchronize


def _grid() -> list[tuple[int, int]]:
    if quick_mode():
        return [(3, 512)]
    full = os.environ.get("SPEC_SAMPLERS_SAMPLING_FULL", "") not in ("", "0")
    Bs, Vs = (so.FULL_BATCH_SIZES, so.FULL_VOCABS) if full else (so.DEFAULT_BATCH_SIZES, so.DEFAULT_VOCABS)
    return [(b, v) for v in Vs for b in Bs]


@functools.cache
def _bandwidth(device: torch.device) -> float:
    return so.copy_bandwidth(device)


@functools.lru_cache(maxsize=4)
def _inputs(B: int, V: int, device: torch.device) -> dict[str, torch.Tensor]:
    return so._inputs(B, V, device, seed=B * 7 + V)


#: chain_speculative_sampling has no sort-based PyTorch counterpart (benchmarks/test_verification.py
#: times the rejection-sampling baselines)
CASES = [
    (op, impl)
    for op in so.OPS
    for impl in ("ours", "torch", "flashinfer")
    if not (op == "chain_speculative_sampling" and impl == "torch")
]


@pytest.mark.parametrize("op, impl", CASES, ids=[f"{o}-{i}" for o, i in CASES])
@pytest.mark.parametrize("shape", _grid(), ids=lambda s: f"B{s[0]}-V{s[1]}")
def test_sampling_op(benchmark, op, impl, shape):
    device = bench_device()
    B, V = shape
    x = _inputs(B, V, device)
    ours, baseline, nbytes = so._calls(op, x, "auto")
    if impl == "ours":
        fn = ours
    elif impl == "torch":
        fn = baseline
    else:
        fi = so._flashinfer_call(op, x) if device.type == "cuda" else None
        if fi is None:
            pytest.skip("FlashInfer runs on CUDA only and must import (pip install flashinfer-python)")
        fn = fi

    def body():
        fn()
        synchronize(device)

    benchmark.extra_info.update({"op": op, "impl": impl, "batch_size": B, "vocab_size": V, "bytes": nbytes})
    benchmark.pedantic(body, rounds=1 if quick_mode() else 3, iterations=1, warmup_rounds=1)
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None:
        median = stats.stats.median
        benchmark.extra_info.update(
            {"gbps": nbytes / median / 1e9, "floor_share": nbytes / _bandwidth(device) / median}
        )
