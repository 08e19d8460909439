"""The verification launchers: rejection sampling (:func:`rejection_triton`), block verification
(:func:`block_triton`) and typical acceptance (:func:`typical_triton`), with their one plan.

Each launcher is the kernel twin of its reference in :mod:`spec_samplers.reference` (same tokens
on the same inputs and seeds), over a :class:`~spec_samplers.layout.VerifyBatch` in either layout,
probabilities or logits. A call computes one key of its shapes, strides and variant and looks up
its plan (:class:`VerifyPlan`: splits, grids, constexprs, persistent workspaces; made once per key,
device and stream, :func:`spec_samplers.kernels.backend.plan_cache`), binds its tensors
(:func:`bind_verify`), then launches each kernel where it names it: the fused-softmax statistics
and the SamplingParams filter cuts of logits inputs, the greedy argmax partials of probability
inputs with a greedy mask, then the partials kernel over the vocabulary whose last program per
request finishes that request (an arrival counter: no separate finalize launch). Rejection and
block differ in their kernel and in whether the vocabulary partials are per request or per
(request, position); typical acceptance reads no draft and draws no random number.

No host synchronisation; the grids depend on shapes only, so a CUDA graph can capture a call.
This module does not import triton: each launcher imports its kernels, so a sampler names its
launcher (``kernel_op = staticmethod(rejection_triton)``) and ``import spec_samplers`` needs only
torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from spec_samplers import rng
from spec_samplers.constants import fp32_value, input_error
from spec_samplers.kernels import backend
from spec_samplers.kernels.abi import (
    Ids,
    Posterior,
    Request,
    Rows,
    Seqs,
    SoftmaxParts,
    Stats,
    StatsRequest,
    TypicalParts,
    VerifyParts,
)
from spec_samplers.kernels.backend import (
    KernelLaunch,
    LaunchConfig,
    VocabSplit,
    combine_blocks,
    plan_cache,
    precise_math,
    recorded,
    triton_next_pow2,
    vocab_contiguous,
    vocab_splits,
    workspaces,
)
from spec_samplers.layout import RowLayout, VerifyBatch


@dataclass(frozen=True)
class VerifyKernels:
    """What one verification method launches."""

    method: str  # for messages
    name: str  # the partials launch's name
    #: where its partials kernel lives ("module:attribute"), imported when a plan is made: this
    #: module imports no kernel (a launcher names its kernel at its launch site)
    kernel: str
    #: partials per (request, position), grid (B, K+1, NB), each program seeing positions 0..K;
    #: else per request, grid (B, NB), each program seeing the K draft positions
    per_position: bool
    options: dict[str, Any] = field(default_factory=dict)  # compile options of the launch
    typical: bool = False  # typical acceptance: no draft rows, no random numbers, no greedy mask

    def partials_kernel(self) -> Any:
        module, _, attribute = self.kernel.partition(":")
        return getattr(importlib.import_module(module), attribute)


#: one residual pass per request (at its first rejection), partials [B, NB]
REJECTION = VerifyKernels(
    "rejection sampling", "residual_partials", "spec_samplers.kernels.rejection_kernels:residual_partials_kernel", False
)

#: one pass per (request, position), partials [B, K+1, NB]; rho * q - p must round as in the
#: reference's separate multiply and subtract: no FMA contraction
BLOCK = VerifyKernels(
    "block verification",
    "block_partials",
    "spec_samplers.kernels.block_kernels:block_partials_kernel",
    True,
    {"enable_fp_fusion": False},
)

#: (entropy, max, argmax) partials of q per (request, position), [B, K+1, NB]
TYPICAL = VerifyKernels(
    "typical acceptance",
    "typical_partials",
    "spec_samplers.kernels.typical_kernels:typical_partials_kernel",
    True,
    typical=True,
)


def row_strides(layout: RowLayout, t: torch.Tensor | None) -> tuple[int, int]:
    """(stride_b, stride_k) addressing row (b, i) of a padded [B, K(+1), ...] or ragged [T, ...]
    tensor (ragged rows are flat: stride_k unused); (0, 0) for an absent tensor."""
    if t is None:
        return 0, 0
    return t.stride(0), 0 if layout.ragged else t.stride(1)


def rows(
    layout: RowLayout,
    t: torch.Tensor | None,
    stats: torch.Tensor | None = None,
    index: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
) -> Rows:
    """The kernels' :class:`~spec_samplers.kernels.abi.Rows` of a padded [B, K(+1), ...] or ragged
    [T, ...] tensor with its [B, K+1, 3] row statistics (:func:`plan_softmax_stats`; None for
    probabilities), every field None / 0 for an absent tensor. With ``index`` ([T] int32/int64,
    ``VerifyBatch.draft_rows``) ``t`` is a ragged layout's [N, ...] matrix whose rows are indexed
    (:func:`spec_samplers.kernels.common.indexed_row_offset`: an index outside [0, N) is tested
    there, so no eager op runs here); ``temperature`` [B]: the rows' own T."""
    if t is None:
        return Rows(ptr=None, stride_b=0, stride_k=0, stats=None, row_index=None, num_index_rows=None, temperature=None)
    stride_b, stride_k = row_strides(layout, t)
    return Rows(
        ptr=t,
        stride_b=stride_b,
        stride_k=stride_k,
        stats=stats,
        row_index=index,
        # N only with an index (None otherwise: a constexpr, so the other variants keep their signature)
        num_index_rows=t.shape[0] if index is not None else None,
        temperature=temperature,
    )


def draft_ids(layout: RowLayout, ids: torch.Tensor) -> Ids:
    stride_b, stride_k = row_strides(layout, ids)
    return Ids(ptr=ids, stride_b=stride_b, stride_k=stride_k)


def request(
    batch: VerifyBatch,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    is_greedy: torch.Tensor | None = None,
) -> Request:
    """The kernels' :class:`~spec_samplers.kernels.abi.Request` of ``batch`` with the random and
    greedy inputs a plan reads (None: the kernels' variant without them)."""
    bonus = batch.bonus_token_ids
    return Request(
        cu=batch.layout.cu_num_draft_tokens,
        seeds=seeds,
        offsets=offsets,
        temperature=batch.temperature,
        is_greedy=is_greedy,
        bonus=bonus,
        stride_bonus=bonus.stride(0),
    )


def partials(device: torch.device, shape: tuple[int, ...], *dtypes: torch.dtype) -> tuple[torch.Tensor, ...]:
    """One uninitialised partials tensor of ``shape`` per dtype (the kernels write what they read)."""
    return tuple(torch.empty(shape, dtype=dtype, device=device) for dtype in dtypes)


@dataclass(frozen=True)
class StatsShape:
    """The shape-only part of the fused-softmax statistics launch (:func:`stats_shape`)."""

    grid: tuple[int, int, int]  # (B, K+1, NB): one program per (request, position, vocab block)
    parts: SoftmaxParts  # the partials, persistent workspaces
    stats: Stats  # [B, K+1, 3] fp32 row statistics, persistent workspaces
    constants: dict[str, Any]  # every argument that is not a per-call tensor
    warps: int
    kernel: Any  # softmax_partials_kernel (for a recorded launch)


def stats_shape(layout: RowLayout, split: VocabSplit, device: torch.device, has_draft: bool) -> StatsShape:
    """What the statistics launch takes from shapes: its grid, workspaces and constexprs."""
    B, K, NB = layout.batch_size, layout.max_drafts, split.num_blocks
    grid = (B, K + 1, NB)  # of the partials, one per (request, position, vocab block)

    def make() -> tuple[torch.Tensor | None, ...]:
        f32, row = torch.float32, (B, K + 1, 3)
        t_max, t_sum, logit_max, logit_argmax = partials(device, grid, f32, f32, f32, torch.int32)
        d_max, d_sum = partials(device, grid, f32, f32) if has_draft else (None, None)
        (t_stats,) = partials(device, row, f32)
        d_stats = partials(device, row, f32)[0] if has_draft else None
        return t_max, t_sum, d_max, d_sum, logit_max, logit_argmax, t_stats, d_stats

    # written here, read by the launches after it: allocated once per shape (backend.workspaces)
    t_max, t_sum, d_max, d_sum, logit_max, logit_argmax, t_stats, d_stats = workspaces(
        "softmax_stats", (grid, has_draft), device, make
    )
    parts = SoftmaxParts(
        t_max=t_max, t_sum=t_sum, d_max=d_max, d_sum=d_sum, logit_max=logit_max, logit_argmax=logit_argmax
    )
    _, block_nb, _ = combine_blocks(K + 1, NB)
    constants = dict(
        arrivals=backend.arrival_counters(device, B * (K + 1)),  # one per (request, position)
        K=K,
        V=layout.vocab_size,
        num_rows=layout.num_rows,
        chunk=split.chunk,
        NB=NB,
        BLOCK_V=split.block_v,
        TAIL_NB=block_nb,
        PRECISE=precise_math(),
    )
    # 8 entries per thread per step at every BLOCK_V (one 128-bit load of bf16), and no
    # cross-warp reduction for the small-batch split's BLOCK_V = 256; the last program of each
    # (request, position) combines its rows' blocks (no second launch)
    warps = max(1, split.block_v // 256)
    from spec_samplers.kernels.softmax_kernels import softmax_partials_kernel

    return StatsShape(grid, parts, Stats(target=t_stats, draft=d_stats), constants, warps, softmax_partials_kernel)


def stats_launch(
    shape: StatsShape,
    layout: RowLayout,
    target: torch.Tensor,
    draft: torch.Tensor | None,
    temperature: torch.Tensor,
    draft_index: torch.Tensor | None,
    draft_temperature: torch.Tensor | None,
) -> KernelLaunch:
    """The statistics launch of one call: ``shape`` bound to the call's tensors."""
    req = StatsRequest(cu=layout.cu_num_draft_tokens, temperature=temperature, draft_temperature=draft_temperature)
    args = dict(
        target=rows(layout, target),
        draft=rows(layout, draft, None, draft_index),
        req=req,
        parts=shape.parts,
        stats=shape.stats,
        **shape.constants,
    )
    return KernelLaunch(shape.kernel, shape.grid, args, shape.warps, "softmax_partials")


def plan_softmax_stats(
    layout: RowLayout,
    target: torch.Tensor,  # logits, [B, K+1, V] padded or [T, V] ragged
    draft: torch.Tensor | None,  # logits, [B, K, V] padded or [T, V] ragged
    temperature: torch.Tensor,  # [B] float
    split: VocabSplit,
    filters: VerifyBatch | None = None,
    draft_index: torch.Tensor | None = None,  # [T] int32/int64: indexed draft rows (VerifyBatch.draft_rows)
    draft_temperature: torch.Tensor | None = None,  # [B] float: T of the draft rows (None: temperature)
) -> tuple[list[KernelLaunch], torch.Tensor, torch.Tensor, Stats]:
    """Fused-softmax row statistics (one launch). Returns (launches, argmax partials [B, K+1, NB] fp32 and
    int32, :class:`~spec_samplers.kernels.abi.Stats`). With ``draft_index`` the draft is an [N, V] matrix
    whose rows the index picks; ``draft_temperature`` is the draft rows' T.

    Each statistics tensor is [B, K+1, 3] fp32 holding per row (max, sum, cut): the largest
    logit, the sum of exp((x - max) / T), and the smallest weight kept, 0 here (the plain
    softmax keeps every entry); see :func:`spec_samplers.kernels.common.row_stats`.
    ``Stats.draft`` is None without a draft. With ``filters`` (a batch with per-request top-k /
    top-p / min-p) the launches end with :func:`plan_filter_cuts`, which sets (sum, cut)."""
    shape = stats_shape(layout, split, target.device, draft is not None)
    launches = [stats_launch(shape, layout, target, draft, temperature, draft_index, draft_temperature)]
    if filters is not None and filters.filtered:
        launches += plan_filter_cuts(filters, target, draft, shape.stats.target, shape.stats.draft)
    logit_max, logit_argmax = shape.parts.logit_max, shape.parts.logit_argmax
    assert logit_max is not None and logit_argmax is not None
    return launches, logit_max, logit_argmax, shape.stats


@dataclass(frozen=True)
class CutsShape:
    """The shape-only part of the SamplingParams filter-cut launch (:func:`cuts_shape`)."""

    grid: tuple[int, int, int]  # (B, K+1, sides): one program per (request, position, input)
    has_draft: bool
    constants: dict[str, Any]  # every argument that is not a per-call tensor


def cuts_shape(
    layout: RowLayout,
    target: torch.Tensor,  # logits, vocab stride 1 (its strides are read)
    draft: torch.Tensor | None,  # logits, vocab stride 1, or None
    t_stats: torch.Tensor,  # [B, K+1, 3] fp32 (max, sum, cut): max filled by the softmax statistics
    d_stats: torch.Tensor | None,
) -> CutsShape:
    """What the filter-cut launch takes from shapes: grid, scratch and constexprs."""
    from spec_samplers.kernels import sampling_kernels

    B, K = layout.batch_size, layout.max_drafts
    has_draft = draft is not None and d_stats is not None and draft.numel() > 0
    sides = 2 if has_draft else 1
    cap = sampling_kernels.search_scratch(sides * B * (K + 1), layout.vocab_size)
    # one scratch row per (input, request, position) for its searches' candidates (pivot_search)
    scratch = torch.empty((sides, B, K + 1, cap), dtype=torch.float32, device=target.device)
    stride_b, stride_k = row_strides(layout, target)
    d_stride_b, d_stride_k = row_strides(layout, draft) if has_draft else (0, 0)
    constants = dict(
        stride_b=stride_b,
        stride_k=stride_k,
        d_stride_b=d_stride_b,
        d_stride_k=d_stride_k,
        stats_ptr=t_stats,
        d_stats_ptr=d_stats if has_draft else None,
        scratch_ptr=scratch,
        K=K,
        num_rows=layout.num_rows,
        V=layout.vocab_size,
        cap=cap,
        RAGGED=layout.ragged,
        BONUS_ROW=not layout.ragged,
        BLOCK_V=sampling_kernels.search_block(layout.vocab_size),
        PRECISE=precise_math(),
    )
    return CutsShape((B, K + 1, sides), has_draft, constants)


def cuts_launch(shape: CutsShape, batch: VerifyBatch, target: torch.Tensor, draft: torch.Tensor | None) -> KernelLaunch:
    """The filter-cut launch of one call: ``shape`` bound to the call's tensors."""
    from spec_samplers.kernels.sampling_kernels import SEARCH_WARPS, filter_cut_kernel

    args = dict(
        x_ptr=target,
        d_ptr=draft if shape.has_draft else None,
        cu_ptr=batch.layout.cu_num_draft_tokens,
        temp_ptr=batch.temperature,
        top_k_ptr=batch.top_k,
        top_p_ptr=batch.top_p,
        min_p_ptr=batch.min_p,
        **shape.constants,
    )
    return KernelLaunch(filter_cut_kernel, shape.grid, args, SEARCH_WARPS, "filter_cut")


def plan_filter_cuts(
    batch: VerifyBatch,
    target: torch.Tensor,  # logits [B, K+1, V] padded or [T, V] ragged, vocab stride 1
    draft: torch.Tensor | None,  # logits [B, K, V] padded or [T, V] ragged, vocab stride 1
    t_stats: torch.Tensor | None,  # [B, K+1, 3] fp32 (max, sum, cut): max filled by the softmax statistics
    d_stats: torch.Tensor | None,  # [B, K+1, 3] fp32, or None without a draft
) -> list[KernelLaunch]:
    """The launch that overwrites (sum, cut) of every target and draft row with its request's
    top-k / top-p / min-p (``batch.top_k`` ...;
    :func:`spec_samplers.sampling.reference.filtered_softmax_reference`), so the verification
    kernels read filtered probabilities straight from the logits: one launch for both inputs
    (grid axis 2). Run after the softmax statistics (they read the row max). The launchers keep
    its shape in their plan; this is the same launch on its own (tests)."""
    assert batch.filtered and batch.temperature is not None
    if t_stats is None or batch.layout.batch_size == 0 or target.numel() == 0:
        return []
    return [cuts_launch(cuts_shape(batch.layout, target, draft, t_stats, d_stats), batch, target, draft)]


@dataclass(frozen=True)
class VerifyPlan:
    """What a verification call decides from its key alone (:func:`bind_verify`): made once per
    key, device and stream (:func:`spec_samplers.kernels.backend.plan_cache`)."""

    copy_target: bool  # the target's vocabulary is strided: copied once per call (vocab_contiguous)
    copy_draft: bool
    target: Rows  # the target's rows without their tensor (ptr None): strides, statistics
    draft: Rows  # the draft's rows without their tensors (ptr, row_index, temperature None)
    ids: tuple[int, int]  # the draft ids' (stride_b, stride_k)
    stride_bonus: int
    logit_draft: bool  # the draft is read as logits (statistics, its temperature)
    greedy_mask: bool  # probability inputs with a greedy mask (rejection and block)
    stats: StatsShape | None  # the fused-softmax statistics launch of logits inputs
    cuts: CutsShape | None  # the filter-cut launch of logits inputs with SamplingParams filters
    argmax: tuple[Any, tuple[int, ...], dict[str, Any]] | None  # (kernel, grid, constants): greedy argmax partials
    grid: tuple[int, ...]  # of the partials launch: (B, NB) or (B, K+1, NB)
    constants: dict[str, Any]  # every argument of the partials launch that is not a per-call tensor
    warps: int
    kernel: Any  # the partials kernel (for a recorded launch)
    options: dict[str, Any]  # its compile options


#: the rows of an absent tensor (point-mass drafts, typical acceptance's drafts)
NO_ROWS = Rows(ptr=None, stride_b=0, stride_k=0, stats=None, row_index=None, num_index_rows=None, temperature=None)


def verify_plan(
    batch: VerifyBatch,
    kernels: VerifyKernels,
    split: VocabSplit | None,
    num_sms: int | None,
    posterior: tuple[float, float] | None,
) -> VerifyPlan:
    """The plan of every call keyed like ``batch`` (:func:`bind_verify`'s key): the argument
    checks that shapes decide, the splits (``split``, from tests, overrides both), grids,
    constexprs and persistent workspaces."""
    layout = batch.layout
    B, K, V = layout.batch_size, layout.max_drafts, layout.vocab_size
    device = batch.target.device
    logits = batch.temperature is not None
    draft = None if kernels.typical else batch.draft
    if not kernels.typical and batch.seeds is None:
        raise input_error("seeds", f"per-request seeds ({kernels.method} draws random numbers)", None)
    if draft is not None and batch.draft_rows is not None:
        # indexed draft rows (ragged logits): the launches read them in place
        if not (layout.ragged and logits and not batch.filtered):
            raise input_error("draft_rows", "None outside the ragged logits layout without filters", "a tensor")
    index = batch.draft_rows if draft is not None else None
    target = vocab_contiguous(batch.target)
    draft = None if draft is None else vocab_contiguous(draft)
    # draft probabilities (draft_kind "probs") need no statistics and no temperature: read as given
    logit_draft = draft is not None and logits and not batch.draft_is_probs
    # logits entries: the kernels read T == 0 as greedy from the temperatures themselves
    # (verify_kernels.request_greedy), so no eager comparison op runs per call
    greedy_mask = not kernels.typical and not logits and batch.is_greedy is not None
    if split is not None:
        stats_split, pass_split = split, split
    else:  # the partials passes run (B, K+1, NB) programs: their split is sized by B * (K+1) rows
        stats_split, pass_split = vocab_splits(V, B, device, num_sms, K + 1)
    if kernels.typical:  # its partials run (B, K+1, NB) programs, as the statistics
        pass_split = stats_split
    stats = stats_shape(layout, stats_split, device, logit_draft) if logits else None
    t_stats, d_stats = (None, None) if stats is None else stats.stats
    cuts = None
    if stats is not None and batch.filtered and target.numel() > 0:
        t_stats = stats.stats.target
        assert t_stats is not None
        cuts = cuts_shape(layout, target, draft if logit_draft else None, t_stats, d_stats)
    amax_val, amax_idx = (stats.parts.logit_max, stats.parts.logit_argmax) if stats is not None else (None, None)
    # The statistics pass (logits) keeps its split. A pass whose last program per request
    # finishes that request takes the widest vector step at every B, on the program's warps (4).
    NB, amax_nb = pass_split.num_blocks, stats_split.num_blocks
    if greedy_mask:
        amax_nb = NB  # the argmax partials below take the pass's split
    dims = dict(K=K, V=V, num_rows=layout.num_rows)
    argmax = None
    if kernels.typical:
        grid: tuple[int, ...] = (B, K + 1, NB)

        def make() -> tuple[torch.Tensor | None, ...]:
            return partials(device, grid, torch.float64, torch.float32, torch.int32)

        entropy, q_max, q_argmax = workspaces(kernels.name, (grid,), device, make)
        parts: Any = TypicalParts(
            entropy=entropy, max=q_max, argmax=q_argmax, logit_max=amax_val, logit_argmax=amax_idx
        )
        assert posterior is not None
        # fp32 values: a Triton float argument is fp32, and the reference rounds alike
        extra: dict[str, Any] = dict(
            posterior=Posterior(threshold=fp32_value(posterior[0]), alpha=fp32_value(posterior[1]))
        )
        tail_k, tail_nb, _ = combine_blocks(K + 1, NB)
        warps = 4
    else:
        # the residual-mass partials (the partials kernel's grid is their shape), the fp64
        # race-group sums of the residual and of q per (request[, position]), then the greedy
        # argmax partials
        grid = (B, K + 1, NB) if kernels.per_position else (B, NB)
        groups = (*grid[:-1], rng.race_num_groups(V))

        def make() -> tuple[torch.Tensor | None, ...]:
            amax = partials(device, (B, K + 1, NB), torch.float32, torch.int32) if greedy_mask else ()
            return partials(device, grid, torch.float32) + partials(device, groups, torch.float64, torch.float64) + amax

        mass, r_sums, q_sums, *amax = workspaces(kernels.name, (grid, groups, K, NB, greedy_mask), device, make)
        if amax:
            amax_val, amax_idx = amax
        parts = VerifyParts(mass=mass, r_sums=r_sums, q_sums=q_sums, amax_val=amax_val, amax_idx=amax_idx)
        if greedy_mask:
            from spec_samplers.kernels.rejection_kernels import argmax_partials_kernel

            constants = dict(parts=parts, **dims, chunk=pass_split.chunk, NB=NB, BLOCK_V=pass_split.block_v)
            argmax = (argmax_partials_kernel, (B, K + 1, NB), constants)
        positions = K + 1 if kernels.per_position else max(K, 1)
        tail_k, tail_nb, _ = combine_blocks(K + 1, max(NB, amax_nb))
        extra = dict(NB_AMAX=amax_nb, BLOCK_K=triton_next_pow2(positions))
        # one warp per 256 entries of a vector step (as the statistics pass): each thread then
        # loads 8 consecutive entries, 128 bits of bf16, also at the narrow steps of small batches
        warps = max(1, pass_split.block_v // 256)
    constants = dict(
        parts=parts,
        arrivals=backend.arrival_counters(device, B),
        **dims,
        **extra,
        chunk=pass_split.chunk,
        NB=NB,
        BLOCK_V=pass_split.block_v,
        TAIL_K=tail_k,
        TAIL_NB=tail_nb,
        PRECISE=precise_math(),
    )
    target_rows = rows(layout, target, t_stats)._replace(ptr=None)
    draft_rows = NO_ROWS
    if draft is not None:
        draft_rows = rows(layout, draft, d_stats, index)._replace(ptr=None, row_index=None)
    return VerifyPlan(
        copy_target=target is not batch.target,
        copy_draft=draft is not None and draft is not batch.draft,
        target=target_rows,
        draft=draft_rows,
        ids=row_strides(layout, batch.draft_token_ids),
        stride_bonus=batch.bonus_token_ids.stride(0),
        logit_draft=logit_draft,
        greedy_mask=greedy_mask,
        stats=stats,
        cuts=cuts,
        argmax=argmax,
        grid=grid,
        constants=constants,
        warps=warps,
        kernel=kernels.partials_kernel(),
        options=dict(kernels.options),
    )


class VerifyLaunches(NamedTuple):
    """One call's launches, bound to its tensors, in launch order (None: not launched)."""

    stats: KernelLaunch | None  # softmax_partials_kernel (logits inputs)
    cuts: KernelLaunch | None  # filter_cut_kernel (logits inputs with SamplingParams filters)
    argmax: KernelLaunch | None  # argmax_partials_kernel (probability inputs with a greedy mask)
    partials: KernelLaunch | None  # the method's partials kernel; its last program per request finishes it


NO_LAUNCHES = VerifyLaunches(None, None, None, None)


def bind_verify(
    batch: VerifyBatch,
    kernels: VerifyKernels,
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
    posterior: tuple[float, float] | None = None,  # typical acceptance's (threshold, alpha)
) -> tuple[torch.Tensor, VerifyLaunches]:
    """The [B, K+1] int64 output of one call and its launches: one key (shapes, strides, which
    optional tensors are present, the method, ``split``, the planned-for SM count), one lookup of
    its :class:`VerifyPlan` (made by :func:`verify_plan` on a miss, with the checks that shapes
    decide), then the call's tensors bound to it. Every value check is the kernels' own."""
    layout = batch.layout
    B, K = layout.batch_size, layout.max_drafts
    target, draft, index = batch.target, None if kernels.typical else batch.draft, batch.draft_rows
    device = target.device
    out = torch.empty((B, K + 1), dtype=torch.int64, device=device)
    if B == 0:
        return out, NO_LAUNCHES
    num_sms = None if config is None else config.num_sms
    key = (
        kernels.name, layout.ragged, B, K, layout.vocab_size, layout.num_rows, target.stride(),
        None if draft is None else (draft.shape[0], draft.stride()), batch.draft_token_ids.stride(),
        batch.bonus_token_ids.stride(0), batch.temperature is None, batch.draft_is_probs, index is None,
        batch.is_greedy is None, batch.top_k is None, batch.seeds is None, split, num_sms, posterior,
    )  # fmt: skip
    plan = plan_cache("verify", key, device, lambda: verify_plan(batch, kernels, split, num_sms, posterior))
    if plan.copy_target:
        target = target.contiguous()
    if draft is not None and plan.copy_draft:
        draft = draft.contiguous()
    cu, temperature = layout.cu_num_draft_tokens, batch.temperature
    d_temperature = batch.draft_temperature if plan.logit_draft else None
    stats = cuts = argmax = None
    t, d = plan.target, plan.draft
    if plan.stats is not None:  # logits inputs
        shape = plan.stats
        args = dict(
            target=Rows(target, t.stride_b, t.stride_k, None, None, None, None),
            draft=Rows(draft, d.stride_b, d.stride_k, None, index, d.num_index_rows, None)
            if plan.logit_draft
            else NO_ROWS,
            req=StatsRequest(cu=cu, temperature=temperature, draft_temperature=d_temperature),
            parts=shape.parts,
            stats=shape.stats,
            **shape.constants,
        )
        stats = KernelLaunch(shape.kernel, shape.grid, args, shape.warps, "softmax_partials")
        if plan.cuts is not None:
            cuts = cuts_launch(plan.cuts, batch, target, draft)
    seqs = Seqs(
        target=Rows(target, t.stride_b, t.stride_k, t.stats, None, None, None),
        draft=Rows(draft, d.stride_b, d.stride_k, d.stats, index, d.num_index_rows, d_temperature)
        if draft is not None
        else NO_ROWS,
        ids=Ids(batch.draft_token_ids, *plan.ids),
    )
    if kernels.typical:  # typical acceptance draws no random numbers and reads no greedy mask
        req = Request(cu, None, None, temperature, None, batch.bonus_token_ids, plan.stride_bonus)
    else:
        greedy = batch.is_greedy if plan.greedy_mask else None
        req = Request(cu, batch.seeds, batch.offsets, temperature, greedy, batch.bonus_token_ids, plan.stride_bonus)
    if plan.argmax is not None:
        kernel, grid, constants = plan.argmax
        args = dict(target=seqs.target, req=req, **constants)
        argmax = KernelLaunch(kernel, grid, args, name="argmax_partials")
    args = dict(seqs=seqs, req=req, out_ptr=out, counts=batch.counters, **plan.constants)
    main = KernelLaunch(plan.kernel, plan.grid, args, plan.warps, kernels.name, plan.options)
    return out, VerifyLaunches(stats, cuts, argmax, main)


def plan_verify(
    batch: VerifyBatch, kernels: VerifyKernels, split: VocabSplit | None, config: LaunchConfig | None = None
) -> tuple[list[KernelLaunch], torch.Tensor]:
    """The launches of one rejection or block call, in order, and the [B, K+1] int64 output they
    fill (what :func:`rejection_triton` and :func:`block_triton` launch; tests and tools read it)."""
    out, launches = bind_verify(batch, kernels, split, config)
    return [launch for launch in launches if launch is not None], out


def plan_typical(
    batch: VerifyBatch,
    posterior_threshold: float,
    posterior_alpha: float,
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
) -> tuple[list[KernelLaunch], torch.Tensor]:
    """The launches of one typical-acceptance call and the [B, K+1] int64 output they fill."""
    out, launches = bind_verify(batch, TYPICAL, split, config, (posterior_threshold, posterior_alpha))
    return [launch for launch in launches if launch is not None], out


# -- the launchers ----------------------------------------------------------------------------------
#
# ``split`` overrides the vocabulary split (tests use it to cross block boundaries); ``config``
# (:class:`~spec_samplers.kernels.backend.LaunchConfig`): ``config.num_sms`` plans for a GPU with
# that many SMs, and with ``config.launches`` a list the planned launches are appended to it and
# not run (:func:`~spec_samplers.kernels.backend.recorded`).


def rejection_triton(
    batch: VerifyBatch, *, split: VocabSplit | None = None, config: LaunchConfig | None = None
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.rejection_reference`. Returns [B, K+1] int64."""
    from spec_samplers.kernels.rejection_kernels import argmax_partials_kernel, residual_partials_kernel
    from spec_samplers.kernels.sampling_kernels import filter_cut_kernel
    from spec_samplers.kernels.softmax_kernels import softmax_partials_kernel

    out, (stats, cuts, argmax, partials) = bind_verify(batch, REJECTION, split, config)
    if stats is not None and not recorded(config, stats):
        softmax_partials_kernel[stats.grid](**stats.args, num_warps=stats.num_warps)
    if cuts is not None and not recorded(config, cuts):
        filter_cut_kernel[cuts.grid](**cuts.args, num_warps=cuts.num_warps)
    if argmax is not None and not recorded(config, argmax):
        argmax_partials_kernel[argmax.grid](**argmax.args, num_warps=argmax.num_warps)
    if partials is not None and not recorded(config, partials):
        residual_partials_kernel[partials.grid](**partials.args, num_warps=partials.num_warps)
    return out


def block_triton(
    batch: VerifyBatch, *, split: VocabSplit | None = None, config: LaunchConfig | None = None
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.block_reference`. Returns [B, K+1] int64."""
    from spec_samplers.kernels.block_kernels import block_partials_kernel
    from spec_samplers.kernels.rejection_kernels import argmax_partials_kernel
    from spec_samplers.kernels.sampling_kernels import filter_cut_kernel
    from spec_samplers.kernels.softmax_kernels import softmax_partials_kernel

    out, (stats, cuts, argmax, partials) = bind_verify(batch, BLOCK, split, config)
    if stats is not None and not recorded(config, stats):
        softmax_partials_kernel[stats.grid](**stats.args, num_warps=stats.num_warps)
    if cuts is not None and not recorded(config, cuts):
        filter_cut_kernel[cuts.grid](**cuts.args, num_warps=cuts.num_warps)
    if argmax is not None and not recorded(config, argmax):
        argmax_partials_kernel[argmax.grid](**argmax.args, num_warps=argmax.num_warps)
    if partials is not None and not recorded(config, partials):
        # rho * q - p rounds as the reference's separate multiply and subtract: no FMA contraction
        block_partials_kernel[partials.grid](**partials.args, num_warps=partials.num_warps, enable_fp_fusion=False)
    return out


def typical_triton(
    batch: VerifyBatch,
    posterior_threshold: float,
    posterior_alpha: float,
    *,
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.reference.typical_reference`. Returns [B, K+1] int64."""
    from spec_samplers.kernels.sampling_kernels import filter_cut_kernel
    from spec_samplers.kernels.softmax_kernels import softmax_partials_kernel
    from spec_samplers.kernels.typical_kernels import typical_partials_kernel

    posterior = (posterior_threshold, posterior_alpha)
    out, (stats, cuts, _, partials) = bind_verify(batch, TYPICAL, split, config, posterior)
    if stats is not None and not recorded(config, stats):
        softmax_partials_kernel[stats.grid](**stats.args, num_warps=stats.num_warps)
    if cuts is not None and not recorded(config, cuts):
        filter_cut_kernel[cuts.grid](**cuts.args, num_warps=cuts.num_warps)
    if partials is not None and not recorded(config, partials):
        typical_partials_kernel[partials.grid](**partials.args, num_warps=partials.num_warps)
    return out
