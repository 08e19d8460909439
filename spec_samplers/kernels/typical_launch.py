"""Launcher of the typical-acceptance kernels: shapes, strides, block sizes, allocation.

:func:`typical_triton` is the kernel twin of :func:`spec_samplers.reference.typical_reference`,
over a :class:`~spec_samplers.layout.VerifyBatch` in either layout, probabilities or logits. No
host synchronisation; grids depend on shapes only (CUDA-graph capturable).
"""

from __future__ import annotations

import torch

from spec_samplers.constants import fp32_value
from spec_samplers.kernels import launch_common as lc
from spec_samplers.kernels import typical_kernels as tk
from spec_samplers.kernels.backend import VocabSplit, combine_blocks
from spec_samplers.layout import VerifyBatch


def plan_typical(
    batch: VerifyBatch, posterior_threshold: float, posterior_alpha: float, split: VocabSplit | None = None
) -> tuple[list[lc.KernelLaunch], torch.Tensor]:
    """The launches of one call and the [B, K+1] int64 output they fill."""
    layout = batch.layout
    B, K = layout.batch_size, layout.max_drafts
    start = lc.plan_start(batch, split, None)  # drafts are point masses here: no draft rows
    out, split, launches = start.out, start.split, start.launches
    if split is None:
        return [], out
    NB = split.num_blocks
    target = lc.rows(layout, start.target, start.stats["t_stats_ptr"])
    seqs = (target, lc.rows(layout, None), lc.rows(layout, batch.draft_token_ids)[:3])
    bonus = batch.bonus_token_ids
    req = (layout.cu_num_draft_tokens, None, None, batch.temperature, None, bonus, bonus.stride(0))
    # (entropy, max, argmax) partials of q, then the logits (max, argmax) partials (greedy requests)
    parts = lc.partials(out.device, (B, K + 1, NB), torch.float64, torch.float32, torch.int32) + start.amax
    dims = dict(req=req, parts=parts, K=K, V=layout.vocab_size, num_rows=layout.num_rows, NB=NB)
    args = dict(dims, target=target, chunk=split.chunk, BLOCK_V=split.block_v, PRECISE=lc.precise_math())
    launches.append(lc.KernelLaunch(tk.typical_partials_kernel, (B, K + 1, NB), args, name="typical_partials"))
    block_k, block_nb, warps = combine_blocks(K + 1, NB)
    # fp32 values: a Triton float argument is fp32, and the reference rounds alike
    posterior = (fp32_value(posterior_threshold), fp32_value(posterior_alpha))
    args = dict(dims, seqs=seqs, out_ptr=out, posterior=posterior, BLOCK_K=block_k, BLOCK_NB=block_nb)
    args["PRECISE"] = lc.precise_math()
    launches.append(lc.KernelLaunch(tk.typical_finalize_kernel, (B,), args, warps, "typical_finalize"))
    return launches, out


def typical_triton(
    batch: VerifyBatch, posterior_threshold: float, posterior_alpha: float, *, split: VocabSplit | None = None
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.typical_reference`. Returns [B, K+1] int64."""
    return lc.run_planned(plan_typical(batch, posterior_threshold, posterior_alpha, split))
