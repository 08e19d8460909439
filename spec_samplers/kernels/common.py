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

from spec_samplers.constants import LOG2E_FP32, WEIGHT_MIN
from spec_samplers.kernels.rng import precise_exp2

_LOG2E = tl.constexpr(LOG2E_FP32)
_WEIGHT_MIN = tl.constexpr(WEIGHT_MIN)


@triton.jit
def clean(x):
    """fp32 copy with NaN, Inf and negative entries set to 0 (as reference.clean_probs)."""
    x = x.to(tl.float32)
    # NaN < inf is false, and max(x, 0) clears negatives: one compare, one max, one select
    return tl.where(x < float("inf"), tl.maximum(x, 0.0), 0.0)


@triton.jit
def mask_if(cond, m):
    """The block mask ``m`` where the scalar ``cond`` holds, all False elsewhere. Written as a select,
    not ``m & cond``: Triton's interpreter gives a scalar comparison its operands' dtype, so
    ``m & (row >= 0)`` (or a bare scalar comparison as the mask of a one-element load) reaches
    ``tl.load`` as an integer array, which Triton 3.9's interpreter refuses ("mask has unsupported
    dtype"). The select keeps the block's boolean payload; compiled code is the same either way."""
    return tl.where(cond, m, False)


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
def indexed_row_offset(b, i, start, n, num_rows, stride_b, stride_k, index_ptr, num_index_rows, RAGGED: tl.constexpr):
    """:func:`row_offset` of rows that may be indexed: with ``index_ptr`` ([T] int32/int64, the
    row of an [N, ...] matrix that flat row t reads, N = ``num_index_rows``; ragged only) the row
    is loaded, once per row, its offset is row * ``stride_b`` (so the compiler keeps the stride's
    divisibility, hence vector-wide loads), and a row outside [0, N) does not exist (it is never
    read)."""
    if index_ptr is not None:
        t, ok = row_offset(b, i, start, n, num_rows, 1, 0, RAGGED)
        row = tl.load(index_ptr + t, mask=ok, other=-1).to(tl.int64)
        ok = ok & (row >= 0) & (row < num_index_rows)
        off = tl.where(ok, row, 0) * stride_b
    else:
        off, ok = row_offset(b, i, start, n, num_rows, stride_b, stride_k, RAGGED)
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
def logits_scale(temp):
    """c = fp32(log2 e) / T of the shared logits rule (:func:`spec_samplers.torch_ops.logits_scale`):
    one IEEE division per request or row, none per entry (T = +inf gives 0, a tiny T +inf)."""
    return tl.math.div_rn(_LOG2E, temp)


@triton.jit
def rule_max(row_max):
    """The rule's m: the row max, or +inf for a row without mass (no finite or +inf logit), whose
    weights are then all 0 (x - m = -inf everywhere)."""
    return tl.where(row_max > float("-inf"), row_max, float("inf"))


@triton.jit
def logits_rule(row_max, temp, row_sum, cut):
    """:func:`rule_constants` with c = :func:`logits_scale` (temp)."""
    return rule_constants(row_max, logits_scale(temp), row_sum, cut)


@triton.jit
def rule_constants(row_max, scale, row_sum, cut):
    """The per-row constants ``rule = (m, c, r, cut)`` of the shared logits rule, computed once per
    row so that an element costs no division: m = :func:`rule_max` (row_max), c = ``scale``
    (:func:`logits_scale` of T, once per request), r = 1 / row_sum (IEEE; 0 when the sum is not positive:
    :func:`spec_samplers.torch_ops.reciprocal_sum`) and the cut raised to WEIGHT_MIN (the rule's
    lightest weight, so that one comparison per entry applies both)."""
    has = row_sum > 0.0
    r = tl.where(has, tl.math.div_rn(1.0, tl.where(has, row_sum, 1.0)), 0.0)
    return rule_max(row_max), scale, r, tl.maximum(cut, _WEIGHT_MIN)


@triton.jit
def weight_parts(x, m, c, PRECISE: tl.constexpr):
    """(finite, e): the weight of the shared logits rule (:func:`spec_samplers.torch_ops.scaled_exp`,
    whose docstring states the limits and the precision) is e where ``finite`` and e >= WEIGHT_MIN,
    else 0: e = 2**z, z = min((x - m) * c, 0) (NaN, from inf - inf or 0 * inf, becomes 0: weight
    1), finite iff x - m > -inf. x fp32 without NaN; m, c from :func:`logits_rule`. Three
    instructions and one MUFU.EX2 per entry, then the test: the same IEEE operations as torch's,
    so the same floats on CUDA (in the interpreter the exp2 is numpy's, which may differ from
    torch's in the last bit)."""
    d = x - m
    return d != float("-inf"), precise_exp2(tl.minimum(d * c, 0.0), PRECISE)


@triton.jit
def weights(x, m, c, PRECISE: tl.constexpr):
    """The shared logits rule's weights (:func:`weight_parts`; 0 where not kept)."""
    finite, e = weight_parts(x, m, c, PRECISE)
    return tl.where(finite & (e >= _WEIGHT_MIN), e, 0.0)


@triton.jit
def row_stats(stats_ptr, stat, mask, scale):
    """The :func:`rule_constants` (m, c, r, cut) of the rows ``stat`` (a scalar or vector index
    b * (K+1) + i) with c = ``scale`` (:func:`logits_scale` of the request's T), from their
    statistics.

    ``stats_ptr`` is a [B, K+1, 3] fp32 tensor holding per row (max, sum, cut) of the fused
    softmax of a logits row (written by :mod:`spec_samplers.kernels.softmax_kernels`,
    allocated by :func:`spec_samplers.kernels.verify_launch.plan_softmax_stats`):

    * max: the largest logit x (max of x itself, so x / T never overflows);
    * sum: the sum of the kept weights e = exp((x - max) / T) (:func:`weights`);
    * cut: the smallest weight kept (weights e < cut count as 0); 0 keeps every entry, which
      is what the plain softmax writes. A truncating sampler (top-k, top-p, min-p) passes its
      per-row cut and the kept sum, and :func:`load_q` gives the truncated distribution.

    ``stats_ptr`` None (probability inputs, no draft) gives (0, 1, 1, 0), which :func:`load_q`
    ignores outside LOGITS mode; masked-off rows read (max 0, sum 1, cut 0)."""
    rule = (0.0, 1.0, 1.0, 0.0)
    if stats_ptr is not None:
        row = stats_ptr + stat * 3
        row_max = tl.load(row, mask=mask, other=0.0)
        row_sum = tl.load(row + 1, mask=mask, other=1.0)
        cut = tl.load(row + 2, mask=mask, other=0.0)
        rule = rule_constants(row_max, scale, row_sum, cut)
    return rule


@triton.jit
def load_q(ptr, offs, mask, rule, LOGITS: tl.constexpr, PRECISE: tl.constexpr):
    """Cleaned fp32 probabilities at ``offs`` (any float dtype, read as stored).

    LOGITS: the entries are logits and q = e * r where e >= cut, else 0, with e the shared rule's
    weight (:func:`weight_parts`) and ``rule = (m, c, r, cut)`` from :func:`logits_rule` /
    :func:`row_stats`: the softmax fused, so no probability tensor is ever written; cut = 0
    keeps every entry. q is in [0, r] by construction (no NaN, no inf: nothing to clean); a row
    without a finite or +inf logit has r = 0 and q = 0; masked lanes read -inf and weigh 0. The
    product sits under the select, so a later q - p cannot be contracted into an FMA (it stays
    the two roundings torch makes). Otherwise ``rule`` is unused."""
    if LOGITS:
        m, c, r, cut = rule
        x = tl.load(ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
        x = tl.maximum(x, float("-inf"))  # NaN -> -inf (maxnum drops a NaN)
        finite, e = weight_parts(x, m, c, PRECISE)
        return tl.where(finite & (e >= cut), e * r, 0.0)  # cut >= WEIGHT_MIN (logits_rule)
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


@triton.jit
def last_to_arrive(counter_ptr, expected):
    """Whether this program is the last of the ``expected`` programs sharing the int32 counter
    at ``counter_ptr`` to get here: the one that may read what all of them stored.

    Every thread's stores precede the arrival (a CTA barrier), and the arrival is one atomic
    with acquire-release semantics at GPU scope (Triton issues a scalar atomic from one thread
    and broadcasts its result through a barrier): the last program sees every other program's
    stores, as in CUTLASS's semaphore and PyTorch Inductor's grid barrier. The last program
    resets the counter, so it is 0 again for the next launch on the stream
    (:func:`spec_samplers.kernels.backend.arrival_counters`)."""
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = ticket == expected - 1
    if last:
        tl.store(counter_ptr, 0)
    return last
