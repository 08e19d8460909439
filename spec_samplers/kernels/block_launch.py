"""Launcher of the block-verification kernels: shapes, strides, block sizes, allocation.

:func:`block_triton` is the kernel twin of :func:`spec_samplers.reference.block_reference` (same
tokens on the same inputs and seeds), over a :class:`~spec_samplers.layout.VerifyBatch` in either
layout, probabilities or logits. No host synchronisation; the grids depend on shapes only, so a
CUDA graph can capture a call.
"""

from __future__ import annotations

import torch

from spec_samplers.kernels import block_kernels as bk
from spec_samplers.kernels import launch_common as lc
from spec_samplers.kernels import rejection_kernels as rk
from spec_samplers.kernels.backend import VocabSplit, combine_blocks, triton_next_pow2, vocab_split
from spec_samplers.layout import VerifyBatch

#: rho * q - p must round as in the reference's separate multiply and subtract: no FMA contraction
_NO_FMA = {"enable_fp_fusion": False}


def plan_block(batch: VerifyBatch, split: VocabSplit | None = None) -> tuple[list[lc.KernelLaunch], torch.Tensor]:
    """The launches of one call and the [B, K+1] int64 output they fill."""
    layout = batch.layout
    B, K, V = layout.batch_size, layout.max_drafts, layout.vocab_size
    device = batch.target.device
    out = torch.empty((B, K + 1), dtype=torch.int64, device=device)
    if B == 0:
        return [], out
    assert batch.seeds is not None, "block verification needs per-request seeds"
    if split is None:
        split = vocab_split(V, B, device)
    NB = split.num_blocks
    target = lc.vocab_contiguous(batch.target)
    draft = None if batch.draft is None else lc.vocab_contiguous(batch.draft)
    is_greedy = (batch.temperature == 0) if batch.temperature is not None else batch.is_greedy
    stride_tb, stride_tk = lc.row_strides(layout, target)
    stride_db, stride_dk = lc.row_strides(layout, draft)
    stride_ib, stride_ik = lc.row_strides(layout, batch.draft_token_ids)
    launches: list[lc.KernelLaunch] = []

    def f32(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.float32, device=device)

    def i32(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.int32, device=device)

    stats: dict[str, torch.Tensor | None] = dict(t_stats_ptr=None, d_stats_ptr=None)
    amax_val: torch.Tensor | None = None
    amax_idx: torch.Tensor | None = None
    if batch.temperature is not None:
        softmax, amax_val, amax_idx, stats = lc.plan_softmax_stats(
            layout, target, draft, batch.temperature, split, filters=batch
        )
        launches += softmax
    elif is_greedy is not None:
        amax_val, amax_idx = f32((B, K + 1, NB)), i32((B, K + 1, NB))
        launches.append(
            lc.KernelLaunch(
                rk.argmax_partials_kernel,
                (B, K + 1, NB),
                dict(
                    target_ptr=target,
                    stride_tb=stride_tb,
                    stride_tk=stride_tk,
                    cu_ptr=layout.cu_num_draft_tokens,
                    greedy_ptr=is_greedy,
                    part_val_ptr=amax_val,
                    part_idx_ptr=amax_idx,
                    K=K,
                    V=V,
                    num_rows=layout.num_rows,
                    chunk=split.chunk,
                    NB=NB,
                    RAGGED=layout.ragged,
                    BLOCK_V=split.block_v,
                ),
                name="argmax_partials",
            )
        )
    common = dict(
        target_ptr=target,
        stride_tb=stride_tb,
        stride_tk=stride_tk,
        draft_ptr=draft,
        stride_db=stride_db,
        stride_dk=stride_dk,
        ids_ptr=batch.draft_token_ids,
        stride_ib=stride_ib,
        stride_ik=stride_ik,
        bonus_ptr=batch.bonus_token_ids,
        stride_bonus=batch.bonus_token_ids.stride(0),
        cu_ptr=layout.cu_num_draft_tokens,
        seed_ptr=batch.seeds,
        offset_ptr=batch.offsets,
        greedy_ptr=is_greedy,
        # one (mass, residual race, q race) partial per (request, position, vocab block)
        part_mass_ptr=f32((B, K + 1, NB)),
        part_rkey_ptr=f32((B, K + 1, NB)),
        part_ridx_ptr=i32((B, K + 1, NB)),
        part_qkey_ptr=f32((B, K + 1, NB)),
        part_qidx_ptr=i32((B, K + 1, NB)),
        part_qmax_ptr=f32((B, K + 1, NB)),
        temp_ptr=batch.temperature,
        **stats,
        K=K,
        V=V,
        num_rows=layout.num_rows,
        NB=NB,
        RAGGED=layout.ragged,
        HAS_DRAFT=draft is not None,
        HAS_OFFSETS=batch.offsets is not None,
        HAS_GREEDY=is_greedy is not None,
        LOGITS=batch.temperature is not None,
        PRECISE=lc.precise_math(),
    )
    launches.append(
        lc.KernelLaunch(
            bk.block_partials_kernel,
            (B, K + 1, NB),
            dict(common, chunk=split.chunk, BLOCK_K=triton_next_pow2(K + 1), BLOCK_V=split.block_v),
            name="block_partials",
            options=dict(_NO_FMA),
        )
    )
    block_k, block_nb, warps = combine_blocks(K + 1, NB)
    launches.append(
        lc.KernelLaunch(
            bk.block_finalize_kernel,
            (B,),
            dict(common, amax_val_ptr=amax_val, amax_idx_ptr=amax_idx, out_ptr=out, BLOCK_K=block_k, BLOCK_NB=block_nb),
            num_warps=warps,
            name="block_finalize",
            options=dict(_NO_FMA),
        )
    )
    return launches, out


def block_triton(batch: VerifyBatch, *, split: VocabSplit | None = None) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.block_reference`. Returns [B, K+1] int64.

    ``split`` overrides the vocabulary split (tests use it to cross block boundaries)."""
    launches, out = plan_block(batch, split)
    lc.run_all(launches)
    return out
