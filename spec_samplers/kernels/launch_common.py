"""Launch helpers shared by the rejection and typical launchers: row addressing, vocabulary
contiguity and the fused-softmax statistics of logits inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_samplers.kernels import softmax_kernels as sk
from spec_samplers.kernels.backend import VocabSplit, combine_warps, interpreting, triton_next_pow2


def vocab_contiguous(t: torch.Tensor) -> torch.Tensor:
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

    def row_strides(self, t: torch.Tensor) -> tuple[int, int]:
        """(stride_b, stride_k) of a padded [B, K(+1), ...] or ragged [T, ...] tensor."""
        return t.stride(0), 0 if self.ragged else t.stride(1)


def launch_softmax_stats(
    layout: RowLayout,
    target: torch.Tensor,  # logits, [B, K+1, V] padded or [T, V] ragged
    draft: torch.Tensor | None,  # logits, [B, K, V] padded or [T, V] ragged
    temperature: torch.Tensor,  # [B]
    split: VocabSplit,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """Fused-softmax row statistics. Returns (argmax partials [B, K+1, NB] fp32 and int32,
    (target max, target sum, draft max, draft sum), each [B, K+1] fp32)."""
    B, K, NB = layout.batch_size, layout.max_drafts, split.num_blocks
    device = target.device
    f32 = dict(dtype=torch.float32, device=device)
    parts = [torch.empty((B, K + 1, NB), **f32) for _ in range(5)]
    amax_idx = torch.empty((B, K + 1, NB), dtype=torch.int32, device=device)
    stats = tuple(torch.empty((B, K + 1), **f32) for _ in range(4))
    d = target if draft is None else draft
    t_strides = layout.row_strides(target)
    d_strides = layout.row_strides(d)
    precise = not interpreting()
    sk.softmax_partials_kernel[(B, K + 1, NB)](
        target, *t_strides, d, *d_strides, layout.cu, temperature, *parts, amax_idx,
        K, layout.vocab_size, layout.num_rows, split.chunk, NB,
        RAGGED=layout.ragged, HAS_DRAFT=draft is not None, BLOCK_V=split.block_v, PRECISE=precise,
    )
    sk.softmax_combine_kernel[(B,)](
        layout.cu, *parts[:4], *stats, K, layout.num_rows, NB,
        RAGGED=layout.ragged, HAS_DRAFT=draft is not None, BLOCK_K=triton_next_pow2(K + 1),
        BLOCK_NB=triton_next_pow2(NB), PRECISE=precise,
        num_warps=combine_warps(triton_next_pow2(K + 1), triton_next_pow2(NB)),
    )
    return parts[4], amax_idx, stats
