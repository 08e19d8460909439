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
from spec_samplers.kernels.backend import VocabSplit, combine_blocks, vocab_split
from spec_samplers.layout import VerifyBatch


def plan_typical(
    batch: VerifyBatch, posterior_threshold: float, posterior_alpha: float, split: VocabSplit | None = None
) -> tuple[list[lc.KernelLaunch], torch.Tensor]:
    """The launches of one call and the [B, K+1] int64 output they fill."""
    layout = batch.layout
    B, K, V = layout.batch_size, layout.max_drafts, layout.vocab_size
    device = batch.target.device
    out = torch.empty((B, K + 1), dtype=torch.int64, device=device)
    if B == 0:
        return [], out
    if split is None:
        split = vocab_split(V, B, device)
    NB = split.num_blocks
    target = lc.vocab_contiguous(batch.target)
    stride_tb, stride_tk = lc.row_strides(layout, target)
    stride_ib, stride_ik = lc.row_strides(layout, batch.draft_token_ids)
    launches: list[lc.KernelLaunch] = []
    t_stats: torch.Tensor | None = None
    lamax_val: torch.Tensor | None = None
    lamax_idx: torch.Tensor | None = None
    if batch.temperature is not None:
        softmax, lamax_val, lamax_idx, stats = lc.plan_softmax_stats(
            layout, target, None, batch.temperature, split, filters=batch
        )
        launches += softmax
        t_stats = stats["t_stats_ptr"]
    ent = torch.empty((B, K + 1, NB), dtype=torch.float64, device=device)
    amax_val = torch.empty((B, K + 1, NB), dtype=torch.float32, device=device)
    amax_idx = torch.empty((B, K + 1, NB), dtype=torch.int32, device=device)
    shared = dict(
        target_ptr=target,
        stride_tb=stride_tb,
        stride_tk=stride_tk,
        cu_ptr=layout.cu_num_draft_tokens,
        temp_ptr=batch.temperature,
        t_stats_ptr=t_stats,
        ent_ptr=ent,
        amax_val_ptr=amax_val,
        amax_idx_ptr=amax_idx,
        K=K,
        V=V,
        num_rows=layout.num_rows,
        NB=NB,
        RAGGED=layout.ragged,
        LOGITS=batch.temperature is not None,
        PRECISE=lc.precise_math(),
    )
    launches.append(
        lc.KernelLaunch(
            tk.typical_partials_kernel,
            (B, K + 1, NB),
            dict(shared, chunk=split.chunk, BLOCK_V=split.block_v),
            name="typical_partials",
        )
    )
    block_k, block_nb, warps = combine_blocks(K + 1, NB)
    launches.append(
        lc.KernelLaunch(
            tk.typical_finalize_kernel,
            (B,),
            dict(
                shared,
                ids_ptr=batch.draft_token_ids,
                stride_ib=stride_ib,
                stride_ik=stride_ik,
                bonus_ptr=batch.bonus_token_ids,
                stride_bonus=batch.bonus_token_ids.stride(0),
                lamax_val_ptr=lamax_val,
                lamax_idx_ptr=lamax_idx,
                out_ptr=out,
                # fp32 values: a Triton float argument is fp32, and the reference rounds alike
                posterior_threshold=fp32_value(posterior_threshold),
                posterior_alpha=fp32_value(posterior_alpha),
                BLOCK_K=block_k,
                BLOCK_NB=block_nb,
            ),
            num_warps=warps,
            name="typical_finalize",
        )
    )
    return launches, out


def typical_triton(
    batch: VerifyBatch, posterior_threshold: float, posterior_alpha: float, *, split: VocabSplit | None = None
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.typical_reference`. Returns [B, K+1] int64."""
    launches, out = plan_typical(batch, posterior_threshold, posterior_alpha, split)
    lc.run_all(launches)
    return out
