"""Triton helpers shared by the kernels: probability cleaning, layout addressing, partial
reductions. Both layouts are addressed by (request b, position i):

* padded (RAGGED=False): row (b, i) starts at ``b * stride_b + i * stride_k``; every request has
  K drafts and a bonus row at i = K;
* ragged (RAGGED=True): row (b, i) is flat row ``start_b + i`` (``start_b`` from the inclusive
  cumulative draft counts), present only for i < k_b; there are no bonus rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.kernels.rng import precise_exp


@triton.jit
def clean(x):
    """fp32 copy with NaN, Inf and negative entries set to 0 (as reference.clean_probs)."""
    x = x.to(tl.float32)
    # NaN < inf is false, and max(x, 0) clears negatives: one compare, one max, one select
    return tl.where(x < float("inf"), tl.maximum(x, 0.0), 0.0)


@triton.jit
def request_span(cu_ptr, b, K, num_rows, RAGGED: tl.constexpr):
    """(first flat row, k_b) of request b. A malformed ragged request (not 0 <= start <= end <=
    num_rows, or end - start > K; spec_samplers.layout) gets k_b = -1: no position i >= 0
    satisfies i < k_b, so it reads no row, and its first rejection j = min(., k_b) = -1 makes
    the output row all -1 (no token). Comparisons come before the subtraction (no overflow)."""
    if RAGGED:
        end = tl.load(cu_ptr + b).to(tl.int64)
        start = tl.load(cu_ptr + b - 1, mask=b > 0, other=0).to(tl.int64)
        ok = (start >= 0) & (end >= start) & (end <= num_rows)
        n = tl.where(ok, end - start, 0)
        n = tl.where(ok & (n <= K), n, -1)
    else:
        start = (b * 0).to(tl.int64)
        n = (b * 0 + K).to(tl.int64)
    return start, n


@triton.jit
def row_offset(b, i, start, n, num_rows, stride_b, stride_k, RAGGED: tl.constexpr):
    """(element offset of row (b, i), row exists). ``i`` may be a scalar or a vector.

    Padded: every i in [0, K] exists (the caller masks i < k for draft rows). Ragged: i < k_b
    and the flat row inside [0, num_rows): out-of-range rows are never addressed."""
    i = i.to(tl.int64)
    if RAGGED:
        row = start + i
        ok = (i < n) & (row >= 0) & (row < num_rows)
        off = tl.where(ok, row, 0) * stride_b
    else:
        ok = i >= 0
        off = b.to(tl.int64) * stride_b + i * stride_k
    return off, ok


@triton.jit
def fold_argmax(vals, base, best, best_idx):
    """Fold one vector step (``vals`` at vocab indices base + 0..) into a running (max, argmax).
    A strict > keeps the earlier index on ties, so the result is torch.argmax's."""
    step_max = tl.max(vals, axis=0)
    step_arg = tl.argmax(vals, axis=0, tie_break_left=True) + base
    take = step_max > best
    return tl.where(take, step_max, best), tl.where(take, step_arg, best_idx)


@triton.jit
def combine_argmax(vals, idxs, lanes, axis: tl.constexpr):
    """Combine block partial (max, argmax) pairs laid out in block order along ``axis``
    (``lanes`` = tl.arange over that axis): the largest value wins, ties go to the lowest block,
    hence to the lowest vocab index, as torch.argmax."""
    best = tl.argmax(vals, axis=axis, tie_break_left=True)
    if axis == 0:
        sel = lanes == best
    else:
        sel = lanes[None, :] == best[:, None]
    return tl.sum(tl.where(sel, idxs, 0), axis=axis)


@triton.jit
def scaled_exp(x, row_max, temp, PRECISE: tl.constexpr):
    """exp((x - m) / T) of the shared logits rule (spec_samplers.torch_ops.scaled_exp): with
    m = +inf the +inf entries get 1 and the others 0; x - m = -inf gives 0 (never a NaN from
    -inf / +inf). x, m fp32 (NaN logits already -inf); T > 0, +inf allowed."""
    d = tl.where(row_max == float("inf"), tl.where(x == float("inf"), 0.0, float("-inf")), x - row_max)
    z = tl.where(d > float("-inf"), tl.math.div_rn(d, temp), float("-inf"))
    return precise_exp(z, PRECISE)


@triton.jit
def row_stats(stats_ptr, stat, mask):
    """(row_max, row_sum, cut) of the rows ``stat`` (a scalar or vector index b * (K+1) + i).

    ``stats_ptr`` is a [B, K+1, 3] fp32 tensor holding per row (max, sum, cut) of the fused
    softmax of a logits row (written by :mod:`spec_samplers.kernels.softmax_kernels`,
    allocated by :func:`spec_samplers.kernels.launch_common.plan_softmax_stats`):

    * max: the largest logit x (max of x itself, so x / T never overflows);
    * sum: the sum of the kept weights e = exp((x - max) / T);
    * cut: the smallest weight kept (weights e < cut count as 0); 0 keeps every entry, which
      is what the plain softmax writes. A truncating sampler (top-k, top-p, min-p) passes its
      per-row cut and the kept sum, and :func:`load_q` gives the truncated distribution.

    ``stats_ptr`` None (probability inputs, no draft) and masked-off rows give (0, 1, 0), the
    values :func:`load_q` ignores outside LOGITS mode."""
    row_max, row_sum, cut = 0.0, 1.0, 0.0
    if stats_ptr is not None:
        row = stats_ptr + stat * 3
        row_max = tl.load(row, mask=mask, other=0.0)
        row_sum = tl.load(row + 1, mask=mask, other=1.0)
        cut = tl.load(row + 2, mask=mask, other=0.0)
    return row_max, row_sum, cut


@triton.jit
def load_q(ptr, offs, mask, temp, row_max, row_sum, cut, LOGITS: tl.constexpr, PRECISE: tl.constexpr):
    """Cleaned fp32 probabilities at ``offs`` (any float dtype, read as stored).

    LOGITS: the entries are logits and q = e / row_sum with e = exp((x - row_max) / temp) where
    e >= cut, else 0: the softmax fused (statistics from :func:`row_stats`), so no probability
    tensor is ever written; cut = 0 keeps every entry (e >= 0). A row without a finite or +inf
    logit has row_sum 0 and q = 0. Otherwise temp, row_max, row_sum, cut are unused."""
    if LOGITS:
        x = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
        x = tl.where(x == x, x, float("-inf"))
        e = scaled_exp(x, row_max, temp, PRECISE)
        e = tl.where(e >= cut, e, 0.0)
        return tl.where(mask, clean(tl.math.div_rn(e, row_sum)), 0.0)
    else:
        return clean(tl.load(ptr + offs, mask=mask, other=0.0))


@triton.jit
def draft_ids_at(b, pos, start, n, V, num_rows, ids_ptr, stride_ib, stride_ik, RAGGED: tl.constexpr):
    """(draft ids as given (int64), id in [0, V) and inside the request) at positions ``pos``;
    ids outside [0, V) are never used to address memory."""
    id_off, row_ok = row_offset(b, pos, start, n, num_rows, stride_ib, stride_ik, RAGGED)
    in_req = (pos < n) & row_ok
    ids = tl.load(ids_ptr + id_off, mask=in_req, other=-1).to(tl.int64)
    return ids, in_req & (ids >= 0) & (ids < V)
