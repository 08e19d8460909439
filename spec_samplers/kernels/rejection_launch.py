"""Launchers of the rejection-sampling kernels: shapes, strides, block sizes, allocation.

Same signatures and same tokens as :func:`spec_samplers.reference.rejection_sample_reference`
and :func:`spec_samplers.reference.rejection_sample_ragged_reference`. No host synchronisation;
the launch grids depend on shapes only, so a CUDA graph can capture a call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_samplers.kernels import rejection_kernels as rk
from spec_samplers.kernels.backend import VocabSplit, interpreting, triton_next_pow2, vocab_split


def _vocab_contiguous(t: torch.Tensor) -> torch.Tensor:
    """Kernels step through the vocabulary with unit stride; other layouts are copied once."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


@dataclass(frozen=True)
class RowLayout:
    """How kernels address rows (b, i): padded ``b * stride_b + i * stride_k``, ragged
    ``(start_b + i) * stride_b`` (stride_k unused)."""

    ragged: bool
    batch_size: int
    max_drafts: int  # K
    vocab_size: int
    num_rows: int  # flat rows of the ragged tensors (unused when padded)
    cu: torch.Tensor  # [B] inclusive cumsum of k_b (ragged), any [B] tensor otherwise


def launch_rejection(
    layout: RowLayout,
    target: torch.Tensor,  # [B, K+1, V] padded or [T, V] ragged
    draft: torch.Tensor | None,  # [B, K, V] padded or [T, V] ragged
    ids: torch.Tensor,  # [B, K] padded or [T] ragged
    bonus: torch.Tensor,  # [B] or [B, 1]
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None,  # [B] int64
    is_greedy: torch.Tensor | None,  # [B] bool
    split: VocabSplit | None = None,
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
    target = _vocab_contiguous(target)
    draft = None if draft is None else _vocab_contiguous(draft)
    t_strides = (target.stride(0), target.stride(1) if not layout.ragged else 0)
    d = target if draft is None else draft
    d_strides = (d.stride(0), d.stride(1) if not layout.ragged else 0)
    i_strides = (ids.stride(0), ids.stride(1) if not layout.ragged else 0)
    stride_bonus = bonus.stride(0)
    has_greedy = is_greedy is not None
    precise = not interpreting()

    f32 = dict(dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    part_mass = torch.empty((B, NB), **f32)
    part_rkey = torch.empty((B, NB), **f32)
    part_ridx = torch.empty((B, NB), **i32)
    part_qkey = torch.empty((B, NB), **f32)
    part_qidx = torch.empty((B, NB), **i32)
    if has_greedy:
        amax_val = torch.empty((B, K + 1, NB), **f32)
        amax_idx = torch.empty((B, K + 1, NB), **i32)
        rk.argmax_partials_kernel[(B, K + 1, NB)](
            target, *t_strides, layout.cu, is_greedy, amax_val, amax_idx,
            K, V, layout.num_rows, split.chunk, NB,
            RAGGED=layout.ragged, BLOCK_V=split.block_v,
        )
    else:
        amax_val, amax_idx = part_rkey, part_ridx  # unused
    greedy_arg = is_greedy if has_greedy else seeds  # unused when HAS_GREEDY is False
    offsets_arg = offsets if offsets is not None else seeds  # unused when HAS_OFFSETS is False
    common = (
        target, *t_strides, d, *d_strides, ids, *i_strides, bonus, stride_bonus,
        layout.cu, seeds, offsets_arg, greedy_arg, part_mass, part_rkey, part_ridx, part_qkey, part_qidx,
    )
    flags = dict(RAGGED=layout.ragged, HAS_DRAFT=draft is not None, HAS_OFFSETS=offsets is not None, HAS_GREEDY=has_greedy)
    rk.residual_partials_kernel[(B, NB)](
        *common, K, V, layout.num_rows, split.chunk, NB,
        **flags, BLOCK_K=triton_next_pow2(max(K, 1)), BLOCK_V=split.block_v, PRECISE=precise,
    )
    rk.finalize_kernel[(B,)](
        *common, amax_val, amax_idx, out, K, V, layout.num_rows, NB,
        **flags, BLOCK_K=triton_next_pow2(K + 1), BLOCK_NB=triton_next_pow2(NB), num_warps=1,
    )
    return out


def rejection_sample_triton(
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
    """Kernel twin of :func:`spec_samplers.reference.rejection_sample_reference` (padded layout).
    Returns [B, k+1] int64."""
    B, kp1, V = target_with_bonus_probs.shape
    layout = RowLayout(False, B, kp1 - 1, V, B * kp1, seeds)
    return launch_rejection(
        layout, target_with_bonus_probs, draft_probs, draft_token_ids, bonus_token_ids, seeds, offsets, is_greedy, split,
    )


def rejection_sample_ragged_triton(
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
    """Kernel twin of :func:`spec_samplers.reference.rejection_sample_ragged_reference`.
    Returns [B, K+1] int64, -1 padded."""
    T, V = target_probs.shape
    B = cu_num_draft_tokens.shape[0]
    layout = RowLayout(True, B, max_spec_len, V, T, cu_num_draft_tokens)
    return launch_rejection(
        layout, target_probs, draft_probs, draft_token_ids, bonus_token_ids.reshape(B), seeds, offsets, is_greedy, split,
    )
