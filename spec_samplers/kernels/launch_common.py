"""Launch helpers shared by the launchers: planned launches, row strides, vocabulary contiguity
and the fused-softmax statistics of logits inputs.

A launcher first *plans* its launches (:class:`KernelLaunch`: kernel, grid, keyword arguments),
then runs them. Planning is a pure function of the inputs' shapes, dtypes and which optional
tensors are present, so ``tests/kernel_compile_check.py`` compiles exactly the variants the
launchers can reach, and a test counts the variants a changing batch size can produce.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from spec_samplers.kernels import sampling_kernels
from spec_samplers.kernels import softmax_kernels as sk
from spec_samplers.kernels.backend import VocabSplit, combine_blocks, interpreting
from spec_samplers.layout import RowLayout, VerifyBatch


@dataclass
class KernelLaunch:
    """One planned kernel launch: ``kernel[grid](**args, num_warps=num_warps, **options)``."""

    kernel: Any  # a triton JITFunction
    grid: tuple[int, ...]
    args: dict[str, Any]
    num_warps: int = 4
    name: str = field(default="")
    #: compile options beyond num_warps (e.g. enable_fp_fusion=False), also used by the compile check
    options: dict[str, Any] = field(default_factory=dict)

    def run(self) -> None:
        self.kernel[self.grid](**self.args, num_warps=self.num_warps, **self.options)


def run_all(launches: list[KernelLaunch]) -> None:
    for launch in launches:
        launch.run()


def vocab_contiguous(t: torch.Tensor) -> torch.Tensor:
    """Kernels step through the vocabulary with unit stride; other layouts are copied once."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def row_strides(layout: RowLayout, t: torch.Tensor | None) -> tuple[int, int]:
    """(stride_b, stride_k) addressing row (b, i) of a padded [B, K(+1), ...] or ragged [T, ...]
    tensor (ragged rows are flat: stride_k unused); (0, 0) for an absent tensor."""
    if t is None:
        return 0, 0
    return t.stride(0), 0 if layout.ragged else t.stride(1)


def precise_math() -> bool:
    """libdevice exp/log when compiled; the interpreter has no libdevice."""
    return not interpreting()


def plan_softmax_stats(
    layout: RowLayout,
    target: torch.Tensor,  # logits, [B, K+1, V] padded or [T, V] ragged
    draft: torch.Tensor | None,  # logits, [B, K, V] padded or [T, V] ragged
    temperature: torch.Tensor,  # [B] float
    split: VocabSplit,
    filters: VerifyBatch | None = None,
) -> tuple[list[KernelLaunch], torch.Tensor, torch.Tensor, dict[str, torch.Tensor | None]]:
    """Fused-softmax row statistics. Returns (launches, argmax partials [B, K+1, NB] fp32 and
    int32, {t_stats_ptr, d_stats_ptr}).

    Each statistics tensor is [B, K+1, 3] fp32 holding per row (max, sum, cut): the largest
    logit, the sum of exp((x - max) / T), and the smallest weight kept, 0 here (the plain
    softmax keeps every entry); see :func:`spec_samplers.kernels.common.row_stats`.
    ``d_stats_ptr`` is None without a draft. With ``filters`` (a batch with per-request top-k /
    top-p / min-p) the launches end with :func:`plan_filter_cuts`, which sets (sum, cut)."""
    B, K, NB = layout.batch_size, layout.max_drafts, split.num_blocks
    device = target.device
    has_draft = draft is not None

    def f32(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.float32, device=device)

    t_m, t_s, amax_val = f32((B, K + 1, NB)), f32((B, K + 1, NB)), f32((B, K + 1, NB))
    d_m, d_s = (f32((B, K + 1, NB)), f32((B, K + 1, NB))) if has_draft else (None, None)
    amax_idx = torch.empty((B, K + 1, NB), dtype=torch.int32, device=device)
    stats: dict[str, torch.Tensor | None] = {
        "t_stats_ptr": f32((B, K + 1, 3)),
        "d_stats_ptr": f32((B, K + 1, 3)) if has_draft else None,
    }
    stride_tb, stride_tk = row_strides(layout, target)
    stride_db, stride_dk = row_strides(layout, draft)
    block_k, block_nb, warps = combine_blocks(K + 1, NB)
    launches = [
        KernelLaunch(
            sk.softmax_partials_kernel,
            (B, K + 1, NB),
            dict(
                target_ptr=target,
                stride_tb=stride_tb,
                stride_tk=stride_tk,
                draft_ptr=draft,
                stride_db=stride_db,
                stride_dk=stride_dk,
                cu_ptr=layout.cu_num_draft_tokens,
                temp_ptr=temperature,
                t_m_ptr=t_m,
                t_s_ptr=t_s,
                d_m_ptr=d_m,
                d_s_ptr=d_s,
                amax_val_ptr=amax_val,
                amax_idx_ptr=amax_idx,
                K=K,
                V=layout.vocab_size,
                num_rows=layout.num_rows,
                chunk=split.chunk,
                NB=NB,
                RAGGED=layout.ragged,
                HAS_DRAFT=has_draft,
                BLOCK_V=split.block_v,
                PRECISE=precise_math(),
            ),
            name="softmax_partials",
        ),
        KernelLaunch(
            sk.softmax_combine_kernel,
            (B,),
            dict(
                cu_ptr=layout.cu_num_draft_tokens,
                temp_ptr=temperature,
                t_m_ptr=t_m,
                t_s_ptr=t_s,
                d_m_ptr=d_m,
                d_s_ptr=d_s,
                **stats,
                K=K,
                num_rows=layout.num_rows,
                NB=NB,
                RAGGED=layout.ragged,
                HAS_DRAFT=has_draft,
                BLOCK_K=block_k,
                BLOCK_NB=block_nb,
                PRECISE=precise_math(),
            ),
            num_warps=warps,
            name="softmax_combine",
        ),
    ]
    if filters is not None and filters.filtered:
        launches += plan_filter_cuts(filters, target, draft, stats["t_stats_ptr"], stats["d_stats_ptr"])
    return launches, amax_val, amax_idx, stats


def plan_filter_cuts(
    batch: VerifyBatch,
    target: torch.Tensor,  # logits [B, K+1, V] padded or [T, V] ragged, vocab stride 1
    draft: torch.Tensor | None,  # logits [B, K, V] padded or [T, V] ragged, vocab stride 1
    t_stats: torch.Tensor | None,  # [B, K+1, 3] fp32 (max, sum, cut): max filled by the softmax statistics
    d_stats: torch.Tensor | None,  # [B, K+1, 3] fp32, or None without a draft
) -> list[KernelLaunch]:
    """Launches that overwrite (sum, cut) of every row with its request's top-k / top-p / min-p
    (``batch.top_k`` ...; :func:`spec_samplers.sampling.reference.filtered_softmax_reference`), so
    the verification kernels read filtered probabilities straight from the logits. Run after the
    softmax statistics (they read the row max)."""
    assert batch.filtered and batch.temperature is not None
    layout = batch.layout
    B, K = layout.batch_size, layout.max_drafts
    launches = []
    for x, stats, bonus_row in ((target, t_stats, not layout.ragged), (draft, d_stats, False)):
        if x is None or stats is None or B == 0 or x.numel() == 0:
            continue
        stride_b, stride_k = row_strides(layout, x)
        launches.append(
            KernelLaunch(
                sampling_kernels.filter_cut_kernel,
                (B, K + 1),
                dict(
                    x_ptr=x,
                    stride_b=stride_b,
                    stride_k=stride_k,
                    cu_ptr=layout.cu_num_draft_tokens,
                    temp_ptr=batch.temperature,
                    top_k_ptr=batch.top_k,
                    top_p_ptr=batch.top_p,
                    min_p_ptr=batch.min_p,
                    stats_ptr=stats,
                    K=K,
                    num_rows=layout.num_rows,
                    V=layout.vocab_size,
                    RAGGED=layout.ragged,
                    BONUS_ROW=bonus_row,
                    BLOCK_V=sampling_kernels.search_block(layout.vocab_size),
                    PRECISE=precise_math(),
                ),
                name="filter_cut",
            )
        )
    return launches
