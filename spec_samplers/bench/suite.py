"""Grid and device of the pytest-benchmark suite in ``benchmarks/`` (shared with its conftest).

Grid (B, k, V, dtype) by device; override each axis with an environment variable holding a
comma-separated list: SPEC_SAMPLERS_BENCH_B, _K, _V, _DTYPE (float32, float16, bfloat16).
SPEC_SAMPLERS_BENCH_QUICK=1 (``--bench-quick`` sets it) runs one tiny point per dtype and
implementation: the CI smoke run, with ``--benchmark-disable`` (each body runs once, untimed).
SPEC_SAMPLERS_BENCH_DEVICE picks the device (default: cuda when available, else cpu).
"""

from __future__ import annotations

import os

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

#: (B, k, V, dtype names) by device kind
GRIDS = {
    "cuda": ((1, 16, 64, 256), (2, 5, 8), (32000, 128256), ("float32", "bfloat16")),
    "cpu": ((1, 16), (5,), (32000, 128256), ("float32", "bfloat16")),
    "quick": ((3,), (2,), (512,), ("float32", "bfloat16")),
}

QUICK_ENV = "SPEC_SAMPLERS_BENCH_QUICK"


def bench_device() -> torch.device:
    name = os.environ.get("SPEC_SAMPLERS_BENCH_DEVICE")
    return torch.device(name) if name else torch.device("cuda" if torch.cuda.is_available() else "cpu")


def quick_mode() -> bool:
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def _axis(env: str, default: tuple, cast) -> tuple:
    text = os.environ.get(env)
    try:
        return default if not text else tuple(cast(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{env}: expected a comma-separated list, got {text!r}") from None


def grid() -> list[tuple[int, int, int, str]]:
    """[(B, k, V, dtype name)] for this run."""
    B, k, V, dtypes = GRIDS["quick" if quick_mode() else bench_device().type]
    B = _axis("SPEC_SAMPLERS_BENCH_B", B, int)
    k = _axis("SPEC_SAMPLERS_BENCH_K", k, int)
    V = _axis("SPEC_SAMPLERS_BENCH_V", V, int)
    dtypes = _axis("SPEC_SAMPLERS_BENCH_DTYPE", dtypes, str)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"SPEC_SAMPLERS_BENCH_DTYPE: expected names from {', '.join(DTYPES)}, got {bad[0]!r}")
    return [(b, kk, v, d) for d in dtypes for v in V for kk in k for b in B]
