"""Row statistics of the fused softmax for logits inputs: q = exp((x - max) / T) / sum.

``softmax_partials_kernel`` grid (B, K+1, NB): per vocab block, the online (max, sum) of the
logits x (max of x itself, so x / T never overflows; sum of exp((x - max) / T)) for target row
(b, i) and draft row (b, i), plus the (max, argmax) of the raw logits (the greedy token).
``softmax_combine_kernel`` grid (B,): combines blocks into the per-row statistics (max, sum,
cut = 0), [B, K+1, 3] (layout: :func:`spec_samplers.kernels.common.row_stats`).
Logits are read once here and once more where the consumers need q. Temperature 0 marks a
greedy request: its statistics use T = 1 and only its argmax is used. The limits (+inf logits,
T = +inf, rows all -inf) follow :func:`spec_samplers.torch_ops.probs_from_logits`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.kernels.common import fold_argmax, request_span, row_offset, scaled_exp


@triton.jit
def effective_temperature(temp_ptr, b):
    """T of request b as fp32; greedy requests (T = 0), negative and NaN T use 1 (+inf stays:
    the uniform limit)."""
    t = tl.load(temp_ptr + b).to(tl.float32)
    return tl.where(t > 0.0, t, 1.0)


@triton.jit
def row_partials(ptr, off, lo, hi, temp, BLOCK_V: tl.constexpr, PRECISE: tl.constexpr):
    """Online (max, sum of exp((x - max) / temp), max again, its index) of logits ptr[off + lo:off + hi]
    (the shared logits rule; NaN counts as -inf): one block's partials of a fused softmax."""
    m = float("-inf")
    s = 0.0
    best = float("-inf")
    best_idx = lo
    for start in range(lo, hi, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < hi
        x = tl.load(ptr + off + offs, mask=mask, other=float("-inf")).to(tl.float32)
        x = tl.where(x == x, x, float("-inf"))  # NaN logits: never sampled, never the argmax
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # scaled_exp(m, m_new) rescales the running sum: 0 while it is empty (no NaN from
        # -inf - -inf), 0 for finite entries once a +inf entry appears, 1 between +inf maxima
        e = tl.where(mask, scaled_exp(x, m_new, temp, PRECISE), 0.0)
        s = s * scaled_exp(m, m_new, temp, PRECISE) + tl.sum(e, axis=0)
        m = m_new
        best, best_idx = fold_argmax(x, start, best, best_idx)
    return m, s, best, best_idx


# num_rows (T), chunk and NB follow the batch size, which changes every engine step: left
# unspecialised so that a new batch size reuses the compiled variant.
@triton.jit(do_not_specialize=["num_rows", "chunk", "NB"])
def softmax_partials_kernel(
    target, draft, req, parts, K, V, num_rows, chunk, NB, BLOCK_V: tl.constexpr, PRECISE: tl.constexpr
):
    """``target``, ``draft``: (ptr, stride_b, stride_k) of the logits rows (draft all None
    without a draft); ``req`` = (cu_ptr, temp_ptr): [B] ragged counts (None padded), [B] T;
    ``parts`` = (target max, target sum, draft max, draft sum, logit max, logit argmax),
    [B, K+1, NB] fp32 (int32 argmax)."""
    b = tl.program_id(0)
    i = tl.program_id(1)
    blk = tl.program_id(2)
    RAGGED: tl.constexpr = req[0] is not None
    start, n = request_span(req[0], b, K, num_rows, RAGGED)
    temp = effective_temperature(req[1], b)
    lo = blk * chunk
    hi = tl.minimum(lo + chunk, V)
    slot = (b * (K + 1) + i) * NB + blk
    t_off, t_ok = row_offset(b, i, start, n, num_rows, target[1], target[2], RAGGED)
    if t_ok:
        m, s, best, best_idx = row_partials(target[0], t_off, lo, hi, temp, BLOCK_V, PRECISE)
        tl.store(parts[0] + slot, m)
        tl.store(parts[1] + slot, s)
        tl.store(parts[4] + slot, best)
        tl.store(parts[5] + slot, best_idx.to(tl.int32))
    if draft[0] is not None:
        d_off, d_ok = row_offset(b, i, start, n, num_rows, draft[1], draft[2], RAGGED)
        if d_ok & (i < n):
            m, s, _, _ = row_partials(draft[0], d_off, lo, hi, temp, BLOCK_V, PRECISE)
            tl.store(parts[2] + slot, m)
            tl.store(parts[3] + slot, s)


@triton.jit
def _combine(m_ptr, s_ptr, stats_ptr, b, K, pos, slots, mask, temp, PRECISE: tl.constexpr):
    """Combine the block partials of rows (b, pos) and store their (max, sum, cut = 0)."""
    m = tl.load(m_ptr + slots, mask=mask, other=float("-inf"))
    s = tl.load(s_ptr + slots, mask=mask, other=0.0)
    row_max = tl.max(m, axis=1)
    # empty partials (m = -inf, s = 0) and rows all -inf give 0, never NaN
    w = tl.where(mask, s * scaled_exp(m, row_max[:, None], temp, PRECISE), 0.0)
    row = stats_ptr + (b * (K + 1) + pos) * 3
    tl.store(row, row_max, mask=pos <= K)
    tl.store(row + 1, tl.sum(w, axis=1), mask=pos <= K)
    tl.store(row + 2, tl.zeros_like(row_max), mask=pos <= K)  # no truncation: keep every entry


# num_rows (T) and NB follow the batch size: left unspecialised (as above).
@triton.jit(do_not_specialize=["num_rows", "NB"])
def softmax_combine_kernel(
    req, parts, stats, K, num_rows, NB, BLOCK_K: tl.constexpr, BLOCK_NB: tl.constexpr, PRECISE: tl.constexpr
):
    """``req``, ``parts`` as softmax_partials_kernel's; writes ``stats`` = (target, draft)
    [B, K+1, 3] per-row (max, sum, cut) (draft None without a draft)."""
    b = tl.program_id(0)
    RAGGED: tl.constexpr = req[0] is not None
    start, n = request_span(req[0], b, K, num_rows, RAGGED)
    temp = effective_temperature(req[1], b)
    pos = tl.arange(0, BLOCK_K)
    blocks = tl.arange(0, BLOCK_NB)
    slots = (b * (K + 1) + pos[:, None]) * NB + blocks[None, :]
    _, t_ok = row_offset(b, pos, start, n, num_rows, 0, 0, RAGGED)
    t_ok = t_ok & (pos <= K)
    mask = t_ok[:, None] & (blocks < NB)[None, :]
    _combine(parts[0], parts[1], stats[0], b, K, pos, slots, mask, temp, PRECISE)
    if stats[1] is not None:
        d_ok = t_ok & (pos < n)
        mask = d_ok[:, None] & (blocks < NB)[None, :]
        _combine(parts[2], parts[3], stats[1], b, K, pos, slots, mask, temp, PRECISE)
