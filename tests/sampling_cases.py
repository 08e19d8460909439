"""The filter combinations the sampling-operation tests run, shared by the reference tests
(tests/test_sampling.py) and the kernel tests (tests/test_sampling_kernels.py)."""

from __future__ import annotations

import torch

#: which filters a case switches on (joint: top-k and top-p both on the full row)
FILTERS = [
    dict(),
    dict(top_k=True),
    dict(top_p=True),
    dict(min_p=True),
    dict(top_k=True, top_p=True),
    dict(top_k=True, top_p=True, joint=True),
]


def filter_kwargs(
    filters: dict[str, bool],
    top_k: torch.Tensor,  # [B] int64
    top_p: torch.Tensor,  # [B] float
    min_p: torch.Tensor,  # [B] float
) -> dict[str, object]:
    """The keywords of ``sample_reference`` / ``sample_triton`` for one entry of :data:`FILTERS`
    (a filter that is off is None)."""
    return dict(
        top_k=top_k if filters.get("top_k") else None,
        top_p=top_p if filters.get("top_p") else None,
        min_p=min_p if filters.get("min_p") else None,
        joint=bool(filters.get("joint")),
    )
