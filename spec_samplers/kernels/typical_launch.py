"""Launchers of the typical-acceptance kernels: shapes, strides, block sizes, allocation.

Same signatures and tokens as :func:`spec_samplers.reference.typical_accept_reference` and
:func:`spec_samplers.reference.typical_accept_ragged_reference` (plus logits variants). No host
synchronisation; grids depend on shapes only (CUDA-graph capturable).
"""

from __future__ import annotations

import torch

from spec_samplers.kernels import typical_kernels as tk
from spec_samplers.kernels.backend import VocabSplit, combine_warps, interpreting, triton_next_pow2, vocab_split
from spec_samplers.kernels.launch_common import RowLayout, launch_softmax_stats, vocab_contiguous


def launch_typical(
    layout: RowLayout,
    target: torch.Tensor,  # [B, K+1, V] padded or [T, V] ragged: probabilities, or logits
    ids: torch.Tensor,  # [B, K] padded or [T] ragged
    bonus: torch.Tensor,  # [B] or [B, 1]
    posterior_threshold: float,
    posterior_alpha: float,
    split: VocabSplit | None = None,
    temperature: torch.Tensor | None = None,  # [B]: target holds logits (0 = greedy request)
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
    t_strides = layout.row_strides(target)
    i_strides = layout.row_strides(ids)
    precise = not interpreting()
    logits = temperature is not None
    parts = [torch.empty((B, K + 1, NB), dtype=torch.float32, device=device) for _ in range(2)]
    amax_idx = torch.empty((B, K + 1, NB), dtype=torch.int32, device=device)
    if logits:
        lamax_val, lamax_idx, stats = launch_softmax_stats(layout, target, None, temperature, split)
        t_max, t_sum = stats[0], stats[1]
    else:
        temperature, t_max, t_sum = layout.cu, parts[0], parts[0]  # unused
        lamax_val, lamax_idx = parts[1], amax_idx  # unused
    tk.typical_partials_kernel[(B, K + 1, NB)](
        target, *t_strides, layout.cu, temperature, t_max, t_sum, parts[0], parts[1], amax_idx,
        K, V, layout.num_rows, split.chunk, NB,
        RAGGED=layout.ragged, LOGITS=logits, BLOCK_V=split.block_v, PRECISE=precise,
    )
    tk.typical_finalize_kernel[(B,)](
        target, *t_strides, ids, *i_strides, bonus, bonus.stride(0),
        layout.cu, temperature, t_max, t_sum, parts[0], parts[1], amax_idx, lamax_val, lamax_idx, out,
        float(posterior_threshold), float(posterior_alpha), K, V, layout.num_rows, NB,
        RAGGED=layout.ragged, LOGITS=logits, BLOCK_K=triton_next_pow2(K + 1), BLOCK_NB=triton_next_pow2(NB),
        PRECISE=precise, num_warps=combine_warps(triton_next_pow2(K + 1), triton_next_pow2(NB)),
    )
    return out


def typical_accept_triton(
    target_with_bonus_probs: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    posterior_threshold: float,
    posterior_alpha: float,
    *,
    split: VocabSplit | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.typical_accept_reference`. Returns [B, k+1] int64."""
    B, kp1, V = target_with_bonus_probs.shape
    layout = RowLayout(False, B, kp1 - 1, V, B * kp1, bonus_token_ids)
    return launch_typical(layout, target_with_bonus_probs, draft_token_ids, bonus_token_ids, posterior_threshold, posterior_alpha, split)


def typical_accept_ragged_triton(
    target_probs: torch.Tensor,  # [T, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B] or [B, 1] int32/int64
    draft_token_ids: torch.Tensor,  # [T] int32/int64
    cu_num_draft_tokens: torch.Tensor,  # [B] inclusive cumsum of k_b
    max_spec_len: int,  # K
    posterior_threshold: float,
    posterior_alpha: float,
    *,
    split: VocabSplit | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.typical_accept_ragged_reference`.
    Returns [B, K+1] int64, -1 padded."""
    T, V = target_probs.shape
    B = cu_num_draft_tokens.shape[0]
    layout = RowLayout(True, B, max_spec_len, V, T, cu_num_draft_tokens)
    return launch_typical(layout, target_probs, draft_token_ids, bonus_token_ids.reshape(B), posterior_threshold, posterior_alpha, split)


def typical_accept_from_logits_triton(
    target_logits: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1]
    draft_token_ids: torch.Tensor,  # [B, k]
    temperature: torch.Tensor,  # [B] float, 0 = greedy request
    posterior_threshold: float,
    posterior_alpha: float,
    *,
    split: VocabSplit | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.typical_accept_from_logits_reference`:
    q = softmax(target_logits / T) fused. Returns [B, k+1] int64."""
    B, kp1, V = target_logits.shape
    layout = RowLayout(False, B, kp1 - 1, V, B * kp1, bonus_token_ids)
    return launch_typical(
        layout, vocab_contiguous(target_logits), draft_token_ids, bonus_token_ids, posterior_threshold, posterior_alpha,
        split, temperature,
    )


def typical_accept_ragged_from_logits_triton(
    target_logits: torch.Tensor,  # [T, V]
    bonus_token_ids: torch.Tensor,  # [B] or [B, 1]
    draft_token_ids: torch.Tensor,  # [T]
    cu_num_draft_tokens: torch.Tensor,  # [B]
    max_spec_len: int,  # K
    temperature: torch.Tensor,  # [B] float, 0 = greedy request
    posterior_threshold: float,
    posterior_alpha: float,
    *,
    split: VocabSplit | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.typical_accept_ragged_from_logits_reference`."""
    T, V = target_logits.shape
    B = cu_num_draft_tokens.shape[0]
    layout = RowLayout(True, B, max_spec_len, V, T, cu_num_draft_tokens)
    return launch_typical(
        layout, vocab_contiguous(target_logits), draft_token_ids, bonus_token_ids.reshape(B), posterior_threshold,
        posterior_alpha, split, temperature,
    )
