"""Launcher of the block-verification kernels (the plan: :mod:`spec_samplers.kernels.verify_launch`).

:func:`block_triton` is the kernel twin of :func:`spec_samplers.reference.block_reference` (same
tokens on the same inputs and seeds), over a :class:`~spec_samplers.layout.VerifyBatch` in either
layout, probabilities or logits. No host synchronisation; the grids depend on shapes only, so a
CUDA graph can capture a call.
"""

from __future__ import annotations

import torch

from spec_samplers.kernels import block_kernels as bk
from spec_samplers.kernels import launch_common as lc
from spec_samplers.kernels.backend import VocabSplit
from spec_samplers.kernels.verify_launch import VerifyKernels, plan_verify
from spec_samplers.layout import VerifyBatch

#: one pass per (request, position), partials [B, K+1, NB]; rho * q - p must round as in the
#: reference's separate multiply and subtract: no FMA contraction
BLOCK = VerifyKernels(
    "block verification",
    bk.block_partials_kernel,
    "block_partials",
    True,
    {"enable_fp_fusion": False},
)


def plan_block(batch: VerifyBatch, split: VocabSplit | None = None) -> tuple[list[lc.KernelLaunch], torch.Tensor]:
    """The launches of one call and the [B, K+1] int64 output they fill."""
    return plan_verify(batch, split, BLOCK)


def block_triton(batch: VerifyBatch, *, split: VocabSplit | None = None) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.block_reference`. Returns [B, K+1] int64.

    ``split`` overrides the vocabulary split (tests use it to cross block boundaries)."""
    return lc.run_planned(plan_block(batch, split))
