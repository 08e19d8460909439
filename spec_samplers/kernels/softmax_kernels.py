"""Row statistics of the fused softmax for logits inputs: q = exp((x - max) / T) / sum.

``softmax_partials_kernel`` grid (B, K+1, NB): per vocab block, the online (max, sum) of the
logits x (max of x itself, so x / T never overflows; sum of exp((x - max) / T)) for target row
(b, i) and draft row (b, i), plus the (max, argmax) of the raw logits (the greedy token). Each
lane keeps its own online (max, sum, where its max was first seen), one exp2 per element, and the
lanes combine once per block: 16 SASS instructions per element on sm_90 (bf16, 128-bit loads;
benchmarks/results/2026-11-26-sm90-softmax-sass.md). The max and argmax are exact; the sum
differs from torch's in rounding only (order, exp2 and 1 / T; docs/contract.md).
The last of the NB programs of a (request, position) to finish (an arrival counter:
:func:`spec_samplers.kernels.common.last_to_arrive`) combines their blocks into the per-row
statistics (max, sum, cut = 0) of that position's target and draft rows, [B, K+1, 3] (layout:
:func:`spec_samplers.kernels.common.row_stats`; :func:`combine_position`): one launch, the
B * (K+1) small combines in parallel, and the blocks combined in a fixed order whichever
program does it.
Logits are read once here and once more where the consumers need q. Temperature 0 marks a
greedy request: its statistics use T = 1 and only its argmax is used. The limits (+inf logits,
T = +inf, rows all -inf) follow :func:`spec_samplers.torch_ops.probs_from_logits`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.kernels.common import (
    indexed_row_offset,
    last_to_arrive,
    logits_scale,
    request_span,
    row_offset,
    rule_max,
    weights,
)


@triton.jit
def effective_temperature(temp_ptr, b):
    """T of request b as fp32; greedy requests (T = 0), negative and NaN T use 1 (+inf stays:
    the uniform limit)."""
    t = tl.load(temp_ptr + b).to(tl.float32)
    return tl.where(t > 0.0, t, 1.0)


@triton.jit
def inverse_temperature(temp):
    """(inv, scale) with inv * scale = 1 / temp and inv finite: a temperature below 2^-64
    (whose reciprocal may overflow) is scaled by 2^64 first, so that d * inv * scale is 0 at
    d = 0 (a tie with the max weighs 1) and never 0 * inf."""
    scale = tl.where(temp < 5.421010862427522e-20, 1.8446744073709552e19, 1.0)
    # an approximate division (once per program: no IEEE slow path in the launch), within an ulp
    # or two of the rule's c (common.logits_scale), which is all a sum needs
    return 1.4426950408889634 / (temp * scale), scale


@triton.jit
def weight_below(x, m, inv_temp, temp_scale):
    """exp(-|x - m| / T), the weight of x under a maximum m (or of m under a new maximum x), with
    ``inv_temp`` * ``temp_scale`` = 1 / T (:func:`inverse_temperature`): x = m weighs 1 (also
    between +inf maxima); NaN x, and x infinitely far from m (also at T = +inf, where 1 / T = 0),
    weigh 0. One exp2 of a product (``inv_temp`` holds log2(e) / T), the shared rule's arithmetic
    (:func:`spec_samplers.kernels.common.weights`) on |x - m| from the running max: within a few
    fp32 ulps of it, which is all a sum needs (its order already differs from torch's), and 3
    instructions per element."""
    d = tl.where(x == m, 0.0, x - m)
    # NaN (x NaN, or inf * 0 at T = +inf) -> -inf: tl.maximum drops NaN
    z = tl.maximum((-tl.abs(d) * inv_temp) * temp_scale, float("-inf"))
    return tl.exp2(z)


@triton.jit
def lane_step(x, m, s, best_at, at, inv_temp, temp_scale):
    """One element per lane of the per-lane online softmax: (max m, sum s of exp((x - m) / T),
    the step ``best_at`` (``at`` is this one's) where m was first reached). One exp per element:
    a new maximum rescales the sum by exp(-(x - m) / T) and adds 1, any other entry adds
    exp(-(m - x) / T). NaN x is never taken and weighs 0; a lane whose m is still -inf may count
    -inf entries, but lanes at -inf weigh 0 when they combine (:func:`row_partials`)."""
    take = x > m
    e = weight_below(x, m, inv_temp, temp_scale)
    s = tl.where(take, s * e + 1.0, s + e)
    return tl.where(take, x, m), s, tl.where(take, at, best_at)


@triton.jit
def row_partials(ptr, off, lo, hi, temp, BLOCK_V: tl.constexpr):
    """Online (max, sum of exp((x - max) / temp), max again, its index) of logits ptr[off + lo:off + hi]
    (the shared logits rule; NaN counts as -inf): one block's partials of a fused softmax.

    Each lane keeps its own (max, sum, step of its max) and the lanes combine once at the end
    (no reduction per vector step); ``lo`` is a multiple of BLOCK_V (the split's chunks are), so
    the loads are vector-wide. The max and argmax are exact (ties to the lowest index, as
    torch.argmax); the sum differs from torch's in rounding only (order, exp2, 1 / T)."""
    lanes = tl.arange(0, BLOCK_V)
    inv_temp, temp_scale = inverse_temperature(temp)
    m = tl.full([BLOCK_V], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_V], tl.float32)
    best_at = tl.zeros([BLOCK_V], tl.int32) + lo
    for start in range(lo, hi, BLOCK_V):
        start = tl.multiple_of(start, BLOCK_V)
        offs = start + lanes
        x = tl.load(ptr + off + offs, mask=offs < hi, other=float("-inf")).to(tl.float32)
        m, s, best_at = lane_step(x, m, s, best_at, start, inv_temp, temp_scale)
    row_max = tl.max(m, axis=0)
    # lanes weighted by exp((m_lane - row_max) / T); lanes still at -inf weigh 0
    w = weight_below(m, row_max, inv_temp, temp_scale)
    total = tl.sum(tl.where(m > float("-inf"), s * w, 0.0), axis=0)
    # the lowest index holding the maximum (lanes at -inf hold their own first index)
    idx = tl.min(tl.where(m == row_max, best_at + lanes, hi), axis=0)
    return row_max, total, row_max, idx


# num_rows (T), chunk and NB follow the batch size, which changes every engine step: left
# unspecialised so that a new batch size reuses the compiled variant.
@triton.jit(do_not_specialize=["num_rows", "chunk", "NB"])
def softmax_partials_kernel(
    target,
    draft,
    req,
    parts,
    stats,
    arrivals,  # [>= B] int32 arrival counters, 0 at launch (backend.arrival_counters)
    K,
    V,
    num_rows,
    chunk,
    NB,
    BLOCK_V: tl.constexpr,
    TAIL_NB: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """``target``, ``draft``: the logits rows (:class:`~spec_samplers.kernels.abi.Rows`; the
    draft's ``row_index`` the [T] rows of an [N, V] matrix that indexed draft rows read,
    :func:`spec_samplers.kernels.common.indexed_row_offset`; all None without a draft); ``req``
    (:class:`~spec_samplers.kernels.abi.StatsRequest`): ragged counts, T, the draft rows' T;
    ``parts`` (:class:`~spec_samplers.kernels.abi.SoftmaxParts`), [B, K+1, NB] each; ``stats``
    (:class:`~spec_samplers.kernels.abi.Stats`) [B, K+1, 3], written by the last of the NB
    programs of each (request, position) (:func:`combine_position`, rows of TAIL_NB >= NB
    partials)."""
    b = tl.program_id(0)
    i = tl.program_id(1)
    blk = tl.program_id(2)
    RAGGED: tl.constexpr = req.cu is not None
    start, n = request_span(req.cu, b, K, num_rows, RAGGED)
    temp = effective_temperature(req.temperature, b)
    # chunk is a multiple of BLOCK_V (spec_samplers.kernels.backend.plan_vocab_split): telling the
    # compiler keeps the loads vector-wide
    lo = tl.multiple_of(blk * chunk, BLOCK_V)
    hi = tl.minimum(tl.multiple_of(lo + chunk, BLOCK_V), V)
    slot = (b * (K + 1) + i) * NB + blk
    t_off, t_ok = row_offset(b, i, start, n, num_rows, target.stride_b, target.stride_k, RAGGED)
    if t_ok:
        m, s, best, best_idx = row_partials(target.ptr, t_off, lo, hi, temp, BLOCK_V)
        tl.store(parts.t_max + slot, m)
        tl.store(parts.t_sum + slot, s)
        tl.store(parts.logit_max + slot, best)
        tl.store(parts.logit_argmax + slot, best_idx.to(tl.int32))
    if draft.ptr is not None:
        d_temp = temp
        if req.draft_temperature is not None:
            d_temp = effective_temperature(req.draft_temperature, b)
        d_off, d_ok = indexed_row_offset(
            b, i, start, n, num_rows, draft.stride_b, draft.stride_k, draft.row_index, draft.num_index_rows, RAGGED
        )
        if d_ok & (i < n):
            m, s, _, _ = row_partials(draft.ptr, d_off, lo, hi, d_temp, BLOCK_V)
            tl.store(parts.d_max + slot, m)
            tl.store(parts.d_sum + slot, s)
    if last_to_arrive(arrivals + b * (K + 1) + i, NB):
        combine_position(req, parts, stats, K, num_rows, NB, TAIL_NB, PRECISE)


@triton.jit
def _combine_row(m_ptr, s_ptr, stats_ptr, row, NB, ok, temp, BLOCK_NB: tl.constexpr, PRECISE: tl.constexpr):
    """Combine the NB block partials of flat row ``row`` (none when not ``ok``) and store its
    (max, sum, cut = 0): each block's sum weighs the rule's weight of its max
    (:func:`spec_samplers.kernels.common.weights`)."""
    blocks = tl.arange(0, BLOCK_NB)
    # (scalar & vector masks trip the interpreter: fold the row test into the bound)
    mask = blocks < tl.where(ok, NB, 0)
    m = tl.load(m_ptr + row * NB + blocks, mask=mask, other=float("-inf"))
    s = tl.load(s_ptr + row * NB + blocks, mask=mask, other=0.0)
    row_max = tl.max(m, axis=0)
    # empty partials (m = -inf, s = 0) and rows all -inf give 0, never NaN
    w = tl.where(mask, s * weights(m, rule_max(row_max), logits_scale(temp), PRECISE), 0.0)
    tl.store(stats_ptr + row * 3, row_max)
    tl.store(stats_ptr + row * 3 + 1, tl.sum(w, axis=0))
    tl.store(stats_ptr + row * 3 + 2, 0.0)  # no truncation: keep every entry


@triton.jit
def combine_position(req, parts, stats, K, num_rows, NB, BLOCK_NB: tl.constexpr, PRECISE: tl.constexpr):
    """``req``, ``parts`` as softmax_partials_kernel's: writes the statistics of the target and
    draft rows of request b = program_id(0) at position i = program_id(1) into ``stats``
    (:class:`~spec_samplers.kernels.abi.Stats`: [B, K+1, 3] per-row (max, sum, cut); draft None
    without a draft)."""
    b = tl.program_id(0)
    i = tl.program_id(1).to(tl.int64)
    RAGGED: tl.constexpr = req.cu is not None
    start, n = request_span(req.cu, b, K, num_rows, RAGGED)
    temp = effective_temperature(req.temperature, b)
    row = b * (K + 1) + i
    _, t_ok = row_offset(b, i, start, n, num_rows, 0, 0, RAGGED)
    _combine_row(parts.t_max, parts.t_sum, stats.target, row, NB, t_ok, temp, BLOCK_NB, PRECISE)
    if stats.draft is not None:
        d_temp = temp
        if req.draft_temperature is not None:
            d_temp = effective_temperature(req.draft_temperature, b)
        # draft rows whose index is out of range wrote no partials: what combines here for them
        # is never read (locate_row masks such a row out, and its draft is rejected)
        _combine_row(parts.d_max, parts.d_sum, stats.draft, row, NB, t_ok & (i < n), d_temp, BLOCK_NB, PRECISE)
