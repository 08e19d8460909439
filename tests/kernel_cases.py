"""Random inputs shared by the kernel equality tests (the factory lives in spec_samplers.bench.cases,
which benchmarks/gpu_check.py uses too)."""

from spec_samplers.bench.cases import Case, make_case, ragged_view

__all__ = ["Case", "make_case", "ragged_view"]
