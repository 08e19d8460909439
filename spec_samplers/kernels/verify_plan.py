"""The launch plans of the verification launchers (:mod:`~spec_samplers.kernels.rejection_launch`,
:mod:`~spec_samplers.kernels.block_launch`, :mod:`~spec_samplers.kernels.typical_launch`).

Rejection sampling and block verification share one plan (:func:`plan_verify`): the same
inputs, the same NamedTuple arguments (:mod:`spec_samplers.kernels.abi`), one partials
kernel over the vocabulary whose last program per request finishes that request (an arrival
counter: no separate finalize launch); they differ in their kernels (:data:`REJECTION`,
:data:`BLOCK`) and in whether the vocabulary partials are per request or per (request,
position). Typical acceptance has its own (:func:`plan_typical`).

A plan is a pure function of the inputs' shapes, dtypes and which optional tensors are present:
``tests/kernel_compile_check.py`` compiles exactly the variants it can produce. It imports the
kernels (hence triton); the launchers import it when they run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from spec_samplers import rng
from spec_samplers.constants import fp32_value, input_error
from spec_samplers.kernels import block_kernels as bk
from spec_samplers.kernels import launch_common as lc
from spec_samplers.kernels import rejection_kernels as rk
from spec_samplers.kernels import sampling_kernels
from spec_samplers.kernels import softmax_kernels as sk
from spec_samplers.kernels import typical_kernels as tk
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
    LaunchConfig,
    VocabSplit,
    combine_blocks,
    triton_next_pow2,
    vocab_splits,
)
from spec_samplers.layout import RowLayout, VerifyBatch


@dataclass(frozen=True)
class VerifyKernels:
    """What one verification method launches."""

    method: str  # for messages
    #: triton JITFunction: (seqs, req, parts, out_ptr, arrivals, K, V, num_rows, chunk, NB, BLOCK_K,
    #: BLOCK_V, TAIL_K, TAIL_NB, PRECISE); its last program per request writes the output row
    partials: Any
    name: str  # launch name
    #: partials per (request, position), grid (B, K+1, NB), each program seeing positions 0..K;
    #: else per request, grid (B, NB), each program seeing the K draft positions
    per_position: bool
    options: dict[str, Any] = field(default_factory=dict)  # compile options of the launch


#: one residual pass per request (at its first rejection), partials [B, NB]
REJECTION = VerifyKernels("rejection sampling", rk.residual_partials_kernel, "residual_partials", False)

#: one pass per (request, position), partials [B, K+1, NB]; rho * q - p must round as in the
#: reference's separate multiply and subtract: no FMA contraction
BLOCK = VerifyKernels(
    "block verification",
    bk.block_partials_kernel,
    "block_partials",
    True,
    {"enable_fp_fusion": False},
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

    # written here, read by the launches after it: allocated once per shape (launch_common.workspaces)
    t_max, t_sum, d_max, d_sum, logit_max, logit_argmax, t_stats, d_stats = lc.workspaces(
        "softmax_stats", (grid, has_draft), device, make
    )
    parts = SoftmaxParts(
        t_max=t_max, t_sum=t_sum, d_max=d_max, d_sum=d_sum, logit_max=logit_max, logit_argmax=logit_argmax
    )
    _, block_nb, _ = combine_blocks(K + 1, NB)
    constants = dict(
        arrivals=lc.arrival_counters(device, B * (K + 1)),  # one per (request, position)
        K=K,
        V=layout.vocab_size,
        num_rows=layout.num_rows,
        chunk=split.chunk,
        NB=NB,
        BLOCK_V=split.block_v,
        TAIL_NB=block_nb,
        PRECISE=lc.precise_math(),
    )
    # 8 entries per thread per step at every BLOCK_V (one 128-bit load of bf16), and no
    # cross-warp reduction for the small-batch split's BLOCK_V = 256; the last program of each
    # (request, position) combines its rows' blocks (no second launch)
    warps = max(1, split.block_v // 256)
    return StatsShape(grid, parts, Stats(target=t_stats, draft=d_stats), constants, warps)


def stats_launch(
    shape: StatsShape,
    layout: RowLayout,
    target: torch.Tensor,
    draft: torch.Tensor | None,
    temperature: torch.Tensor,
    draft_index: torch.Tensor | None,
    draft_temperature: torch.Tensor | None,
) -> lc.KernelLaunch:
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
    return lc.KernelLaunch(sk.softmax_partials_kernel, shape.grid, args, shape.warps, "softmax_partials")


def plan_softmax_stats(
    layout: RowLayout,
    target: torch.Tensor,  # logits, [B, K+1, V] padded or [T, V] ragged
    draft: torch.Tensor | None,  # logits, [B, K, V] padded or [T, V] ragged
    temperature: torch.Tensor,  # [B] float
    split: VocabSplit,
    filters: VerifyBatch | None = None,
    draft_index: torch.Tensor | None = None,  # [T] int32/int64: indexed draft rows (VerifyBatch.draft_rows)
    draft_temperature: torch.Tensor | None = None,  # [B] float: T of the draft rows (None: temperature)
) -> tuple[list[lc.KernelLaunch], torch.Tensor, torch.Tensor, Stats]:
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


#: the statistics of probability inputs (none), one instance (a NamedTuple per call costs ~1 us)
NO_STATS = Stats(target=None, draft=None)


@dataclass
class PlanStart:
    """What every verification launcher starts from (:func:`plan_start`)."""

    out: torch.Tensor  # [B, K+1] int64, what the launches fill
    #: the split of the passes that store partials (statistics, argmax, typical); None for an
    #: empty batch: nothing to launch
    split: VocabSplit | None
    #: the split of a pass whose last program per request finishes it (backend.vocab_splits)
    finish_split: VocabSplit | None
    target: torch.Tensor  # vocab-contiguous
    draft: torch.Tensor | None  # vocab-contiguous
    draft_index: torch.Tensor | None  # [T] int32/int64 rows of indexed draft rows (batch.draft_rows), or None
    launches: list[lc.KernelLaunch]  # the fused-softmax statistics of logits inputs (else none)
    stats: Stats  # of the target and draft rows (None for probabilities)
    amax: tuple[torch.Tensor | None, torch.Tensor | None]  # (max, argmax) partials of the logits [B, K+1, NB]


def verified_inputs(
    batch: VerifyBatch, draft: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(target, ``draft``: vocab-contiguous; the indexed draft rows ``batch.draft_rows`` or None)
    of a launcher that reads ``draft`` (None for a draft it does not read)."""
    target = lc.vocab_contiguous(batch.target)
    draft = None if draft is None else lc.vocab_contiguous(draft)
    index = None
    if draft is not None and batch.draft_rows is not None:
        # indexed draft rows (ragged logits): the launches read them in place
        layout = batch.layout
        if not (layout.ragged and batch.target_kind == "logits" and not batch.filtered):
            raise input_error("draft_rows", "None outside the ragged logits layout without filters", "a tensor")
        index = batch.draft_rows
    return target, draft, index


def plan_start(
    batch: VerifyBatch, split: VocabSplit | None, draft: torch.Tensor | None, num_sms: int | None = None
) -> PlanStart:
    """The output, the vocabulary splits (once per call; ``split``, from tests, overrides both)
    and, for logits inputs, the fused-softmax statistics of the target and ``draft`` rows (a
    launcher passes None for a draft it does not read)."""
    layout = batch.layout
    B, V, device = layout.batch_size, layout.vocab_size, batch.target.device
    out = torch.empty((B, layout.max_drafts + 1), dtype=torch.int64, device=device)
    target, draft, index = verified_inputs(batch, draft)
    start = PlanStart(out, None, None, target, draft, index, [], Stats(target=None, draft=None), (None, None))
    if B == 0:
        return start
    if split is not None:
        start.split, start.finish_split = split, split
    else:  # the partials passes run (B, K+1, NB) programs: their split is sized by B * (K+1) rows
        start.split, start.finish_split = vocab_splits(V, B, device, num_sms, layout.max_drafts + 1)
    if batch.temperature is not None:
        # draft probabilities (draft_kind "probs") need no statistics: the kernels read them as given
        logit_draft = draft if batch.draft_kind == "logits" else None
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
) -> list[lc.KernelLaunch]:
    """The launch that overwrites (sum, cut) of every target and draft row with its request's
    top-k / top-p / min-p (``batch.top_k`` ...;
    :func:`spec_samplers.sampling.reference.filtered_softmax_reference`), so the verification
    kernels read filtered probabilities straight from the logits: one launch for both inputs
    (grid axis 2). Run after the softmax statistics (they read the row max)."""
    assert batch.filtered and batch.temperature is not None
    layout = batch.layout
    B, K = layout.batch_size, layout.max_drafts
    if t_stats is None or B == 0 or target.numel() == 0:
        return []
    has_draft = draft is not None and d_stats is not None and draft.numel() > 0
    sides = 2 if has_draft else 1
    cap = sampling_kernels.search_scratch(sides * B * (K + 1), layout.vocab_size)
    # one scratch row per (input, request, position) for its searches' candidates (pivot_search)
    scratch = torch.empty((sides, B, K + 1, cap), dtype=torch.float32, device=target.device)
    stride_b, stride_k = row_strides(layout, target)
    d_stride_b, d_stride_k = row_strides(layout, draft) if has_draft else (0, 0)
    args = dict(
        x_ptr=target,
        stride_b=stride_b,
        stride_k=stride_k,
        d_ptr=draft if has_draft else None,
        d_stride_b=d_stride_b,
        d_stride_k=d_stride_k,
        cu_ptr=layout.cu_num_draft_tokens,
        temp_ptr=batch.temperature,
        top_k_ptr=batch.top_k,
        top_p_ptr=batch.top_p,
        min_p_ptr=batch.min_p,
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
        PRECISE=lc.precise_math(),
    )
    grid = (B, K + 1, sides)
    return [
        lc.KernelLaunch(sampling_kernels.filter_cut_kernel, grid, args, sampling_kernels.SEARCH_WARPS, "filter_cut")
    ]


@dataclass(frozen=True)
class VerifyShape:
    """What :func:`plan_verify` decides from shapes alone, made once per shape, device, stream and
    planned-for SM count (:func:`spec_samplers.kernels.launch_common.plan_cache`)."""

    stats: StatsShape | None  # the fused-softmax statistics launch of logits inputs, else None
    parts: VerifyParts  # persistent workspaces
    grid: tuple[int, ...]  # of the partials launch: (B, NB) or (B, K+1, NB)
    constants: dict[str, Any]  # every argument of the partials launch that is not a per-call tensor
    warps: int
    #: (grid, constants) of the greedy argmax partials of probability inputs with a greedy mask
    argmax: tuple[tuple[int, ...], dict[str, Any]] | None


def verify_shape(
    layout: RowLayout,
    kernels: VerifyKernels,
    split: VocabSplit | None,
    device: torch.device,
    num_sms: int | None,
    logits: bool,  # logits inputs: the statistics launch
    logit_draft: bool,  # a draft read as logits
    greedy_mask: bool,  # probability inputs with a greedy mask: the argmax launch
) -> VerifyShape:
    """The splits (``split``, from tests, overrides both), grids, constexprs and persistent
    workspaces of a :func:`plan_verify` call with these shapes."""
    B, K, V = layout.batch_size, layout.max_drafts, layout.vocab_size
    if split is not None:
        stats_split, pass_split = split, split
    else:  # the partials passes run (B, K+1, NB) programs: their split is sized by B * (K+1) rows
        stats_split, pass_split = vocab_splits(V, B, device, num_sms, K + 1)
    stats = stats_shape(layout, stats_split, device, logit_draft) if logits else None
    amax_val, amax_idx = (stats.parts.logit_max, stats.parts.logit_argmax) if stats is not None else (None, None)
    # The statistics pass (logits) keeps its split. This pass takes the widest vector step at
    # every B: its last program per request finishes that request, on the program's warps (4).
    NB, amax_nb = pass_split.num_blocks, stats_split.num_blocks
    if greedy_mask:
        amax_nb = NB  # the argmax partials below take the pass's split
    # the residual-mass partials (the partials kernel's grid is their shape), the fp64 race-group
    # sums of the residual and of q per (request[, position]), then the greedy argmax partials
    shape: tuple[int, ...] = (B, K + 1, NB) if kernels.per_position else (B, NB)
    groups = (*shape[:-1], rng.race_num_groups(V))

    def make() -> tuple[torch.Tensor | None, ...]:
        amax = partials(device, (B, K + 1, NB), torch.float32, torch.int32) if greedy_mask else ()
        return partials(device, shape, torch.float32) + partials(device, groups, torch.float64, torch.float64) + amax

    # (launch_common.workspaces: once per shape; the key holds every size make() reads)
    mass, r_sums, q_sums, *amax = lc.workspaces(kernels.name, (shape, groups, K, NB, greedy_mask), device, make)
    if amax:
        amax_val, amax_idx = amax
    parts = VerifyParts(mass=mass, r_sums=r_sums, q_sums=q_sums, amax_val=amax_val, amax_idx=amax_idx)
    dims = dict(K=K, V=V, num_rows=layout.num_rows)
    argmax = None
    if greedy_mask:
        argmax = ((B, K + 1, NB), dict(parts=parts, **dims, chunk=pass_split.chunk, NB=NB, BLOCK_V=pass_split.block_v))
    positions = K + 1 if kernels.per_position else max(K, 1)
    tail_k, tail_nb, _ = combine_blocks(K + 1, max(NB, amax_nb))
    constants = dict(
        parts=parts,
        arrivals=lc.arrival_counters(device, B),
        **dims,
        chunk=pass_split.chunk,
        NB=NB,
        NB_AMAX=amax_nb,
        BLOCK_K=triton_next_pow2(positions),
        BLOCK_V=pass_split.block_v,
        TAIL_K=tail_k,
        TAIL_NB=tail_nb,
        PRECISE=lc.precise_math(),
    )
    # one warp per 256 entries of a vector step (as the statistics pass): each thread then loads
    # 8 consecutive entries, 128 bits of bf16, also at the narrow steps of small batches
    warps = max(1, pass_split.block_v // 256)
    return VerifyShape(stats, parts, shape, constants, warps, argmax)


def plan_verify(
    batch: VerifyBatch, kernels: VerifyKernels, split: VocabSplit | None, config: LaunchConfig | None = None
) -> tuple[list[lc.KernelLaunch], torch.Tensor]:
    """The launches of one call and the [B, K+1] int64 output they fill. ``split`` (tests)
    overrides the vocabulary split of every pass; ``config.num_sms`` the device's SM count.
    What shapes decide is planned once per shape (:func:`verify_shape`); a call binds its
    tensors to it."""
    layout = batch.layout
    B, K = layout.batch_size, layout.max_drafts
    device = batch.target.device
    out = torch.empty((B, K + 1), dtype=torch.int64, device=device)
    target, draft, index = verified_inputs(batch, batch.draft)
    if B == 0:
        return [], out
    if batch.seeds is None:
        raise input_error("seeds", f"per-request seeds ({kernels.method} draws random numbers)", None)
    logits = batch.temperature is not None
    # draft probabilities (draft_kind "probs") need no statistics and no temperature: read as given
    logit_draft = draft if batch.draft_kind == "logits" else None
    # logits entries: the kernels read T == 0 as greedy from the temperatures themselves
    # (verify_kernels.request_greedy), so no eager comparison op runs per call
    greedy_mask = batch.is_greedy if not logits else None
    num_sms = None if config is None else config.num_sms
    shape_args = (layout, kernels, split, device, num_sms, logits, logit_draft is not None, greedy_mask is not None)
    if split is None:
        key = (kernels.name, B, K, layout.vocab_size, layout.num_rows, *shape_args[4:], lc.precise_math())
        plan = lc.plan_cache("verify", key, device, lambda: verify_shape(*shape_args))
    else:
        plan = verify_shape(*shape_args)
    launches = []
    stats = NO_STATS
    draft_index = index if logit_draft is not None else None
    draft_temperature = batch.draft_temperature if logit_draft is not None else None
    temperature = batch.temperature
    if plan.stats is not None and temperature is not None:  # (logits inputs: both)
        launches.append(
            stats_launch(plan.stats, layout, target, logit_draft, temperature, draft_index, draft_temperature)
        )
        stats = plan.stats.stats
        if batch.filtered:
            launches += plan_filter_cuts(batch, target, logit_draft, stats.target, stats.draft)
    seqs = Seqs(
        target=rows(layout, target, stats.target),
        draft=rows(layout, draft, stats.draft, index, draft_temperature),
        ids=draft_ids(layout, batch.draft_token_ids),
    )
    req = request(batch, batch.seeds, batch.offsets, greedy_mask)
    if plan.argmax is not None:
        grid, constants = plan.argmax
        args = dict(target=seqs.target, req=req, **constants)
        launches.append(lc.KernelLaunch(rk.argmax_partials_kernel, grid, args, name="argmax_partials"))
    args = dict(seqs=seqs, req=req, out_ptr=out, counts=batch.counters, **plan.constants)
    launches.append(lc.KernelLaunch(kernels.partials, plan.grid, args, plan.warps, kernels.name, dict(kernels.options)))
    return launches, out


def plan_typical(
    batch: VerifyBatch,
    posterior_threshold: float,
    posterior_alpha: float,
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
) -> tuple[list[lc.KernelLaunch], torch.Tensor]:
    """The launches of one typical-acceptance call and the [B, K+1] int64 output they fill."""
    layout = batch.layout
    B, K = layout.batch_size, layout.max_drafts
    num_sms = None if config is None else config.num_sms
    start = plan_start(batch, split, None, num_sms)  # drafts are point masses here: no draft rows
    out, split, launches = start.out, start.split, start.launches
    if split is None:
        return [], out
    NB = split.num_blocks
    target = rows(layout, start.target, start.stats.target)
    seqs = Seqs(target=target, draft=rows(layout, None), ids=draft_ids(layout, batch.draft_token_ids))
    req = request(batch)  # typical acceptance draws no random numbers and reads no greedy mask
    # (entropy, max, argmax) partials of q, then the logits (max, argmax) partials (greedy requests)
    entropy, q_max, q_argmax = partials(out.device, (B, K + 1, NB), torch.float64, torch.float32, torch.int32)
    logit_max, logit_argmax = start.amax
    parts = TypicalParts(entropy=entropy, max=q_max, argmax=q_argmax, logit_max=logit_max, logit_argmax=logit_argmax)
    tail_k, tail_nb, _ = combine_blocks(K + 1, NB)
    # fp32 values: a Triton float argument is fp32, and the reference rounds alike
    posterior = Posterior(threshold=fp32_value(posterior_threshold), alpha=fp32_value(posterior_alpha))
    # its last program per request finishes the request (typical_kernels.finish): one launch
    args: dict[str, Any] = dict(seqs=seqs, req=req, parts=parts, out_ptr=out)
    args.update(arrivals=lc.arrival_counters(out.device, B))
    args.update(counts=batch.counters, posterior=posterior, K=K, V=layout.vocab_size, num_rows=layout.num_rows)
    args.update(chunk=split.chunk, NB=NB, BLOCK_V=split.block_v, TAIL_K=tail_k, TAIL_NB=tail_nb)
    args["PRECISE"] = lc.precise_math()
    launches.append(lc.KernelLaunch(tk.typical_partials_kernel, (B, K + 1, NB), args, name="typical_partials"))
    return launches, out
