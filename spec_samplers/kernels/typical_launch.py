"""Launcher of the typical-acceptance kernels (the plan: :func:`spec_samplers.kernels.verify_plan.plan_typical`).

:func:`typical_triton` is the kernel twin of :func:`spec_samplers.reference.typical_reference`,
over a :class:`~spec_samplers.layout.VerifyBatch` in either layout, probabilities or logits. No
host synchronisation; grids depend on shapes only (CUDA-graph capturable). Importing this module
does not import triton.
"""

from __future__ import annotations

import torch

from spec_samplers.kernels.backend import LaunchConfig, VocabSplit
from spec_samplers.layout import VerifyBatch


def typical_triton(
    batch: VerifyBatch,
    posterior_threshold: float,
    posterior_alpha: float,
    *,
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.typical_reference`. Returns [B, K+1] int64.

    ``split`` and ``config`` as :func:`spec_samplers.kernels.rejection_launch.rejection_triton`'s."""
    from spec_samplers.kernels.verify_plan import plan_typical

    launches, out = plan_typical(batch, posterior_threshold, posterior_alpha, split, config)
    if config is not None and config.launches is not None:
        config.launches.extend(launches)
        return out
    for launch in launches:
        launch.kernel[launch.grid](**launch.args, num_warps=launch.num_warps, **launch.options)
    return out
