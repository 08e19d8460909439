"""Launchers of the block-verification kernels: shapes, strides, block sizes, allocation.

Same signatures and same tokens as the functions of :mod:`spec_samplers.block_reference`. No
host synchronisation; the grids depend on shapes only, so a CUDA graph can capture a call.
"""

from __future__ import annotations

import torch

from spec_samplers.kernels import block_kernels as bk
from spec_samplers.kernels import rejection_kernels as rk
from spec_samplers.kernels.backend import VocabSplit, combine_warps, interpreting, triton_next_pow2, vocab_split
from spec_samplers.kernels.launch_common import RowLayout, launch_softmax_stats, vocab_contiguous


def launch_block(
    layout: RowLayout,
    target: torch.Tensor,  # [B, K+1, V] padded or [T, V] ragged
    draft: torch.Tensor | None,  # [B, K, V] padded or [T, V] ragged
    ids: torch.Tensor,  # [B, K] padded or [T] ragged
    bonus: torch.Tensor,  # [B] or [B, 1]
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None,  # [B] int64
    is_greedy: torch.Tensor | None,  # [B] bool
    split: VocabSplit | None = None,
    temperature: torch.Tensor | None = None,  # [B]: target/draft hold logits (0 = greedy request)
) -> torch.Tensor:
    """Returns [B, K+1] int64 in the standard output layout."""
    B, K, V = layout.batch_size, layout.max_drafts, layout.vocab_size
    device = target.device
    out = torch.empty((B, K + 1), dtype=torch.int64, device=device)
    if B == 0:
        return out
    if split is None:
        split = vocab_split(V, B, device)
    NB = split.num_blocks
    target = vocab_contiguous(target)
    draft = None if draft is None else vocab_contiguous(draft)
    t_strides = layout.row_strides(target)
    d = target if draft is None else draft
    d_strides = layout.row_strides(d)
    i_strides = layout.row_strides(ids)
    logits = temperature is not None
    if logits:
        is_greedy = temperature == 0
    has_greedy = is_greedy is not None
    precise = not interpreting()

    f32 = dict(dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    part_mass = torch.empty((B, K + 1, NB), **f32)
    part_rkey = torch.empty((B, K + 1, NB), **f32)
    part_ridx = torch.empty((B, K + 1, NB), **i32)
    part_qkey = torch.empty((B, K + 1, NB), **f32)
    part_qidx = torch.empty((B, K + 1, NB), **i32)
    stats: tuple[torch.Tensor | None, ...] = (None, None, None, None)
    amax_val: torch.Tensor | None = None
    amax_idx: torch.Tensor | None = None
    if logits:
        amax_val, amax_idx, stats = launch_softmax_stats(layout, target, draft, temperature, split)
    elif has_greedy:
        amax_val = torch.empty((B, K + 1, NB), **f32)
        amax_idx = torch.empty((B, K + 1, NB), **i32)
        rk.argmax_partials_kernel[(B, K + 1, NB)](
            target_ptr=target, stride_tb=t_strides[0], stride_tk=t_strides[1], cu_ptr=layout.cu,
            greedy_ptr=is_greedy, part_val_ptr=amax_val, part_idx_ptr=amax_idx,
            K=K, V=V, num_rows=layout.num_rows, chunk=split.chunk, NB=NB,
            RAGGED=layout.ragged, BLOCK_V=split.block_v,
        )
    common = dict(
        target_ptr=target, stride_tb=t_strides[0], stride_tk=t_strides[1],
        draft_ptr=d, stride_db=d_strides[0], stride_dk=d_strides[1],
        ids_ptr=ids, stride_ib=i_strides[0], stride_ik=i_strides[1],
        bonus_ptr=bonus, stride_bonus=bonus.stride(0),
        cu_ptr=layout.cu, seed_ptr=seeds, offset_ptr=offsets, greedy_ptr=is_greedy,
        part_mass_ptr=part_mass, part_rkey_ptr=part_rkey, part_ridx_ptr=part_ridx,
        part_qkey_ptr=part_qkey, part_qidx_ptr=part_qidx,
        temp_ptr=temperature, t_max_ptr=stats[0], t_sum_ptr=stats[1], d_max_ptr=stats[2], d_sum_ptr=stats[3],
        K=K, V=V, num_rows=layout.num_rows, NB=NB,
        RAGGED=layout.ragged, HAS_DRAFT=draft is not None, HAS_OFFSETS=offsets is not None,
        HAS_GREEDY=has_greedy, LOGITS=logits, PRECISE=precise,
        # rho * q - p must round as in the reference (no FMA contraction)
        enable_fp_fusion=False,
    )
    bk.block_partials_kernel[(B, K + 1, NB)](
        **common, chunk=split.chunk, BLOCK_K=triton_next_pow2(K + 1), BLOCK_V=split.block_v,
    )
    bk.block_finalize_kernel[(B,)](
        **common, amax_val_ptr=amax_val, amax_idx_ptr=amax_idx, out_ptr=out,
        BLOCK_K=triton_next_pow2(K + 1), BLOCK_NB=triton_next_pow2(NB),
        num_warps=combine_warps(triton_next_pow2(K + 1), triton_next_pow2(NB)),
    )
    return out


def block_verify_triton(
    target_with_bonus_probs: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
    draft_probs: torch.Tensor | None,  # [B, k, V] or None (point-mass drafts)
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None = None,  # [B] int64
    is_greedy: torch.Tensor | None = None,  # [B] bool
    *,
    split: VocabSplit | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.block_reference.block_verify_reference` (padded
    layout). Returns [B, k+1] int64."""
    B, kp1, V = target_with_bonus_probs.shape
    layout = RowLayout(False, B, kp1 - 1, V, B * kp1, seeds)
    return launch_block(
        layout, target_with_bonus_probs, draft_probs, draft_token_ids, bonus_token_ids, seeds, offsets, is_greedy, split,
    )


def block_verify_ragged_triton(
    target_probs: torch.Tensor,  # [T, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B] or [B, 1] int32/int64
    draft_probs: torch.Tensor | None,  # [T, V] or None
    draft_token_ids: torch.Tensor,  # [T] int32/int64
    cu_num_draft_tokens: torch.Tensor,  # [B] inclusive cumsum of k_b
    max_spec_len: int,  # K
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None = None,  # [B] int64
    is_greedy: torch.Tensor | None = None,  # [B] bool
    *,
    split: VocabSplit | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.block_reference.block_verify_ragged_reference`.
    Returns [B, K+1] int64, -1 padded."""
    T, V = target_probs.shape
    B = cu_num_draft_tokens.shape[0]
    layout = RowLayout(True, B, max_spec_len, V, T, cu_num_draft_tokens)
    return launch_block(
        layout, target_probs, draft_probs, draft_token_ids, bonus_token_ids.reshape(B), seeds, offsets, is_greedy, split,
    )


def block_verify_from_logits_triton(
    target_logits: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
    draft_logits: torch.Tensor | None,  # [B, k, V] or None (point-mass drafts)
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    temperature: torch.Tensor,  # [B] float, 0 = greedy request
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None = None,  # [B] int64
    *,
    split: VocabSplit | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.block_reference.block_verify_from_logits_reference`,
    the softmax fused. Returns [B, k+1] int64."""
    B, kp1, V = target_logits.shape
    layout = RowLayout(False, B, kp1 - 1, V, B * kp1, seeds)
    return launch_block(
        layout, target_logits, draft_logits, draft_token_ids, bonus_token_ids, seeds, offsets, None, split, temperature,
    )


def block_verify_ragged_from_logits_triton(
    target_logits: torch.Tensor,  # [T, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B] or [B, 1]
    draft_logits: torch.Tensor | None,  # [T, V] or None
    draft_token_ids: torch.Tensor,  # [T]
    cu_num_draft_tokens: torch.Tensor,  # [B] inclusive cumsum of k_b
    max_spec_len: int,  # K
    temperature: torch.Tensor,  # [B] float, 0 = greedy request
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None = None,  # [B] int64
    *,
    split: VocabSplit | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.block_reference.block_verify_ragged_from_logits_reference`.
    Returns [B, K+1] int64, -1 padded."""
    T, V = target_logits.shape
    B = cu_num_draft_tokens.shape[0]
    layout = RowLayout(True, B, max_spec_len, V, T, cu_num_draft_tokens)
    return launch_block(
        layout, target_logits, draft_logits, draft_token_ids, bonus_token_ids.reshape(B), seeds, offsets, None, split,
        temperature,
    )
