"""Launcher of the rejection-sampling kernels (the plan: :mod:`spec_samplers.kernels.verify_launch`).

:func:`rejection_triton` is the kernel twin of :func:`spec_samplers.reference.rejection_reference`
(same tokens on the same inputs and seeds), over a :class:`~spec_samplers.layout.VerifyBatch` in
either layout, probabilities or logits. No host synchronisation; the launch grids depend on shapes
only, so a CUDA graph can capture a call.
"""

from __future__ import annotations

import torch

from spec_samplers.kernels import launch_common as lc
from spec_samplers.kernels import rejection_kernels as rk
from spec_samplers.kernels.backend import VocabSplit
from spec_samplers.kernels.verify_launch import VerifyKernels, plan_verify
from spec_samplers.layout import VerifyBatch

#: one residual pass per request (at its first rejection), partials [B, NB]
REJECTION = VerifyKernels("rejection sampling", rk.residual_partials_kernel, "residual_partials", False)


def plan_rejection(batch: VerifyBatch, split: VocabSplit | None = None) -> tuple[list[lc.KernelLaunch], torch.Tensor]:
    """The launches of one call and the [B, K+1] int64 output they fill."""
    return plan_verify(batch, split, REJECTION)


def rejection_triton(batch: VerifyBatch, *, split: VocabSplit | None = None) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.rejection_reference`. Returns [B, K+1] int64.

    ``split`` overrides the vocabulary split (tests use it to cross block boundaries)."""
    return lc.run_planned(plan_rejection(batch, split))
