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

from spec_samplers.errors import input_error
from spec_samplers.kernels import sampling_kernels
from spec_samplers.kernels import softmax_kernels as sk
from spec_samplers.kernels.backend import VocabSplit, combine_blocks, interpreting, vocab_split
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
        """(the sampling operations' launchers still call this; the verification launchers launch
        in their own body)"""
        self.kernel[self.grid](**self.args, num_warps=self.num_warps, **self.options)


def vocab_contiguous(t: torch.Tensor) -> torch.Tensor:
    """Kernels step through the vocabulary with unit stride; other layouts are copied once."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def row_strides(layout: RowLayout, t: torch.Tensor | None) -> tuple[int, int]:
    """(stride_b, stride_k) addressing row (b, i) of a padded [B, K(+1), ...] or ragged [T, ...]
    tensor (ragged rows are flat: stride_k unused); (0, 0) for an absent tensor."""
    if t is None:
        return 0, 0
    return t.stride(0), 0 if layout.ragged else t.stride(1)


RowTuple = tuple[
    torch.Tensor | None, int, int, torch.Tensor | None, torch.Tensor | None, int | None, torch.Tensor | None
]


def rows(
    layout: RowLayout,
    t: torch.Tensor | None,
    stats: torch.Tensor | None = None,
    index: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
) -> RowTuple:
    """The kernels' row tuple (ptr, stride_b, stride_k, stats_ptr, index_ptr, num_index_rows, temp_ptr) of a
    padded [B, K(+1), ...] or ragged [T, ...] tensor with its [B, K+1, 3] row statistics
    (:func:`plan_softmax_stats`; None for probabilities), all None for an absent tensor. With
    ``index`` ([T] int32/int64, ``VerifyBatch.draft_rows``) ``t`` is a ragged layout's [N, ...]
    matrix whose rows are indexed (:func:`spec_samplers.kernels.common.indexed_row_offset`:
    an index outside [0, N) is tested there, so no eager op runs here);
    ``temperature`` [B]: the rows' own T."""
    if t is None:
        return None, 0, 0, None, None, None, None
    # N only with an index (None otherwise: a constexpr, so the other variants keep their signature)
    return (t, *row_strides(layout, t), stats, index, t.shape[0] if index is not None else None, temperature)


def partials(device: torch.device, shape: tuple[int, ...], *dtypes: torch.dtype) -> tuple[torch.Tensor, ...]:
    """One uninitialised partials tensor of ``shape`` per dtype (the kernels write what they read)."""
    return tuple(torch.empty(shape, dtype=dtype, device=device) for dtype in dtypes)


#: (device, stream) -> int32 arrival counters, all 0 between launches (the last program resets its own)
_ARRIVALS: dict[tuple[str, int | None, int], torch.Tensor] = {}


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """[>= n] int32 zeros: one arrival counter per request for a launch whose last program per
    request finishes it (:func:`spec_samplers.kernels.common.last_to_arrive`).

    The last program resets its counter, so a buffer is all zero again when its launch ends and
    one buffer serves every launch of its stream in turn: one per (device, stream), no memset
    per call. Two launches that may run at once must be on different streams (they are then
    given different buffers). A buffer too small is replaced by a larger one, except while a
    CUDA graph is being captured: the graph then gets its own zeroed buffer (a memset node)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    buf = _ARRIVALS.get(key)
    if buf is not None and buf.numel() >= n:
        return buf
    size = max(1024, 1 << max(n - 1, 0).bit_length())
    fresh = torch.zeros(size, dtype=torch.int32, device=device)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return fresh
    _ARRIVALS[key] = fresh
    return fresh


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
    draft_index: torch.Tensor | None = None,  # [T] int32/int64: indexed draft rows (VerifyBatch.draft_rows)
    draft_temperature: torch.Tensor | None = None,  # [B] float: T of the draft rows (None: temperature)
) -> tuple[list[KernelLaunch], torch.Tensor, torch.Tensor, dict[str, torch.Tensor | None]]:
    """Fused-softmax row statistics (one launch). Returns (launches, argmax partials [B, K+1, NB] fp32 and
    int32, {t_stats_ptr, d_stats_ptr}). With ``draft_index`` the draft is an [N, V] matrix
    whose rows the index picks; ``draft_temperature`` is the draft rows' T.

    Each statistics tensor is [B, K+1, 3] fp32 holding per row (max, sum, cut): the largest
    logit, the sum of exp((x - max) / T), and the smallest weight kept, 0 here (the plain
    softmax keeps every entry); see :func:`spec_samplers.kernels.common.row_stats`.
    ``d_stats_ptr`` is None without a draft. With ``filters`` (a batch with per-request top-k /
    top-p / min-p) the launches end with :func:`plan_filter_cuts`, which sets (sum, cut)."""
    B, K, NB = layout.batch_size, layout.max_drafts, split.num_blocks
    device = target.device
    has_draft = draft is not None
    grid = (B, K + 1, NB)  # of the partials, one per (request, position, vocab block)
    t_part, amax = (
        partials(device, grid, torch.float32, torch.float32),
        partials(device, grid, torch.float32, torch.int32),
    )
    d_part = partials(device, grid, torch.float32, torch.float32) if has_draft else (None, None)
    # (max, sum) partials of target and draft rows, then the (max, argmax) of the target logits
    parts = t_part + d_part + amax
    stats = (
        torch.empty((B, K + 1, 3), dtype=torch.float32, device=device),
        torch.empty((B, K + 1, 3), dtype=torch.float32, device=device) if has_draft else None,
    )
    req = (layout.cu_num_draft_tokens, temperature, draft_temperature)
    dims = dict(K=K, num_rows=layout.num_rows, NB=NB)
    d_rows = rows(layout, draft, None, draft_index)
    args = dict(
        target=rows(layout, target)[:3],
        draft=(*d_rows[:3], *d_rows[4:6]),
        req=req,
        parts=parts,
        V=layout.vocab_size,
    )
    _, block_nb, _ = combine_blocks(K + 1, NB)
    launches = [
        KernelLaunch(
            sk.softmax_partials_kernel,
            grid,
            dict(
                args,
                stats=stats,
                arrivals=arrival_counters(device, B * (K + 1)),  # one per (request, position)
                **dims,
                chunk=split.chunk,
                BLOCK_V=split.block_v,
                TAIL_NB=block_nb,
                PRECISE=precise_math(),
            ),
            # 8 entries per thread per step at every BLOCK_V (one 128-bit load of bf16), and no
            # cross-warp reduction for the small-batch split's BLOCK_V = 256; the last program
            # of each (request, position) combines its rows' blocks (no second launch)
            num_warps=max(1, split.block_v // 256),
            name="softmax_partials",
        ),
    ]
    if filters is not None and filters.filtered:
        launches += plan_filter_cuts(filters, target, draft, stats[0], stats[1])
    return launches, amax[0], amax[1], dict(t_stats_ptr=stats[0], d_stats_ptr=stats[1])


@dataclass
class PlanStart:
    """What every verification launcher starts from (:func:`plan_start`)."""

    out: torch.Tensor  # [B, K+1] int64, what the launches fill
    split: VocabSplit | None  # None for an empty batch: nothing to launch
    target: torch.Tensor  # vocab-contiguous
    draft: torch.Tensor | None  # vocab-contiguous
    draft_index: torch.Tensor | None  # [T] int32/int64 rows of indexed draft rows (batch.draft_rows), or None
    launches: list[KernelLaunch]  # the fused-softmax statistics of logits inputs (else none)
    stats: dict[str, torch.Tensor | None]  # t_stats_ptr, d_stats_ptr (None for probabilities)
    amax: tuple[torch.Tensor | None, ...]  # (max, argmax) partials of the logits [B, K+1, NB]


def plan_start(
    batch: VerifyBatch, split: VocabSplit | None, draft: torch.Tensor | None, num_sms: int | None = None
) -> PlanStart:
    """The output, the vocabulary split and, for logits inputs, the fused-softmax statistics of
    the target and ``draft`` rows (a launcher passes None for a draft it does not read)."""
    layout = batch.layout
    B, V, device = layout.batch_size, layout.vocab_size, batch.target.device
    out = torch.empty((B, layout.max_drafts + 1), dtype=torch.int64, device=device)
    target = vocab_contiguous(batch.target)
    draft = None if draft is None else vocab_contiguous(draft)
    index = None
    if draft is not None and batch.draft_rows is not None:
        # indexed draft rows (ragged logits): the launches below read them in place
        if not (layout.ragged and batch.temperature is not None and not batch.filtered):
            raise input_error("draft_rows", "None outside the ragged logits layout without filters", "a tensor")
        index = batch.draft_rows
    stats: dict[str, torch.Tensor | None] = dict(t_stats_ptr=None, d_stats_ptr=None)
    start = PlanStart(out, None, target, draft, index, [], stats, (None, None))
    if B == 0:
        return start
    start.split = split if split is not None else vocab_split(V, B, device, num_sms=num_sms)
    if batch.temperature is not None:
        # draft probabilities (draft_is_probs) need no statistics: the kernels read them as given
        logit_draft = None if batch.draft_is_probs else draft
        start.launches, amax_val, amax_idx, start.stats = plan_softmax_stats(
            layout,
            target,
            logit_draft,
            batch.temperature,
            start.split,
            filters=batch,
            draft_index=index if logit_draft is not None else None,
            draft_temperature=batch.draft_temperature if logit_draft is not None else None,
        )
        start.amax = (amax_val, amax_idx)
    return start


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
    cap = sampling_kernels.search_scratch(B * (K + 1), layout.vocab_size)
    # one scratch row per (request, position) for its searches' candidates (pivot_search), shared
    # by the target and draft launches (one after the other on the stream)
    scratch = torch.empty((B, K + 1, cap), dtype=torch.float32, device=target.device)
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
                    scratch_ptr=scratch,
                    K=K,
                    num_rows=layout.num_rows,
                    V=layout.vocab_size,
                    cap=cap,
                    RAGGED=layout.ragged,
                    BONUS_ROW=bonus_row,
                    BLOCK_V=sampling_kernels.search_block(layout.vocab_size),
                    PRECISE=precise_math(),
                ),
                num_warps=sampling_kernels.SEARCH_WARPS,
                name="filter_cut",
            )
        )
    return launches
