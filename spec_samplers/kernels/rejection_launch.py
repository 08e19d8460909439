"""Launcher of the rejection-sampling kernels (the plan: :func:`spec_samplers.kernels.verify_plan.plan_verify`).

:func:`rejection_triton` is the kernel twin of :func:`spec_samplers.reference.rejection_reference`
(same tokens on the same inputs and seeds), over a :class:`~spec_samplers.layout.VerifyBatch` in
either layout, probabilities or logits. No host synchronisation; the launch grids depend on shapes
only, so a CUDA graph can capture a call. Importing this module does not import triton.
"""

from __future__ import annotations

import torch

from spec_samplers.kernels.backend import LaunchConfig, VocabSplit
from spec_samplers.layout import VerifyBatch


def rejection_triton(
    batch: VerifyBatch, *, split: VocabSplit | None = None, config: LaunchConfig | None = None
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.rejection_reference`. Returns [B, K+1] int64.

    ``split`` overrides the vocabulary split (tests use it to cross block boundaries); ``config``
    (:class:`~spec_samplers.kernels.backend.LaunchConfig`): with ``config.launches`` a list, the
    planned launches are appended to it and not run."""
    from spec_samplers.kernels.verify_plan import REJECTION, plan_verify

    launches, out = plan_verify(batch, REJECTION, split, config)
    if config is not None and config.launches is not None:
        config.launches.extend(launches)
        return out
    for launch in launches:
        launch.kernel[launch.grid](**launch.args, num_warps=launch.num_warps, **launch.options)
    return out
