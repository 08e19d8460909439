"""Triton kernels of typical acceptance (Medusa section 3.3.1, vLLM V0 semantics), both layouts.

``typical_partials_kernel`` grid (B, K+1, NB): ONE pass over each target row's vocab block gives
the partial entropy sum q log(q + eps) and the partial (max, argmax). ``typical_finalize_kernel``
grid (B,): combines the NB partials per position, applies the threshold test to the gathered
q_i(x_i), finds the first rejection and writes the output row.

The vocabulary is split across program instances as in the rejection kernels rather than looped
over by one program per row: with B * (K+1) rows a row loop would leave most of a large GPU idle
at small B (B = 1, K = 4 is 5 programs), while the split costs one tiny combine per position.
Every position is read (no laziness): a position's threshold needs its entropy, and reading the
K + 1 rows in parallel is faster than a dependent chain.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.constants import ENTROPY_EPS_FP32
from spec_samplers.kernels.common import (
    combine_argmax,
    draft_ids_at,
    fold_argmax,
    load_q,
    request_span,
    row_offset,
    row_stats,
)
from spec_samplers.kernels.rng import precise_exp, precise_log
from spec_samplers.kernels.softmax_kernels import effective_temperature

# fp32-representable, so every route into float64 (literal, fp32 constant) gives the same value
_ENTROPY_EPS = tl.constexpr(ENTROPY_EPS_FP32)


# num_rows (T), chunk and NB follow the batch size, which changes every engine step: left
# unspecialised so that a new batch size reuses the compiled variant.
@triton.jit(do_not_specialize=["num_rows", "chunk", "NB"])
def typical_partials_kernel(
    target_ptr,
    stride_tb,
    stride_tk,  # probabilities, or logits when LOGITS
    cu_ptr,
    temp_ptr,
    t_stats_ptr,  # ragged counts; logits only: [B] T, [B, K+1, 3] statistics (common.row_stats)
    ent_ptr,
    amax_val_ptr,
    amax_idx_ptr,  # [B, K+1, NB] fp64 / fp32 / int32
    K,
    V,
    num_rows,
    chunk,
    NB,
    RAGGED: tl.constexpr,
    LOGITS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    b = tl.program_id(0)
    i = tl.program_id(1)
    blk = tl.program_id(2)
    start, n = request_span(cu_ptr, b, K, num_rows, RAGGED)
    off, ok = row_offset(b, i, start, n, num_rows, stride_tb, stride_tk, RAGGED)
    temp = 1.0
    if LOGITS:
        ok = ok & (tl.load(temp_ptr + b) != 0)  # greedy requests: one-hot q, done in finalize
        temp = effective_temperature(temp_ptr, b)
    row_max, row_sum, cut = row_stats(t_stats_ptr, b * (K + 1) + i, ok)
    if ok:
        lo = blk * chunk
        hi = tl.minimum(lo + chunk, V)
        ent = tl.full([], 0.0, tl.float64)
        best = -1.0
        best_idx = lo
        for s in range(lo, hi, BLOCK_V):
            offs = s + tl.arange(0, BLOCK_V)
            m = offs < hi
            q = load_q(target_ptr, off + offs, m, temp, row_max, row_sum, cut, LOGITS, PRECISE)
            # float64 terms and sum (as reference.typical_accepts): the blocked order then moves
            # the entropy by ~1e-16 relative instead of fp32's ~1e-7, so decisions match torch's
            q64 = q.to(tl.float64)
            ent += tl.sum(q64 * precise_log(q64 + _ENTROPY_EPS, PRECISE), axis=0)
            vals = tl.where(m, q, -1.0)
            best, best_idx = fold_argmax(vals, s, best, best_idx)
        slot = (b * (K + 1) + i) * NB + blk
        tl.store(ent_ptr + slot, ent)
        tl.store(amax_val_ptr + slot, best)
        tl.store(amax_idx_ptr + slot, best_idx.to(tl.int32))


# num_rows (T), chunk and NB follow the batch size, which changes every engine step: left
# unspecialised so that a new batch size reuses the compiled variant.
@triton.jit(do_not_specialize=["num_rows", "NB"])
def typical_finalize_kernel(
    target_ptr,
    stride_tb,
    stride_tk,
    ids_ptr,
    stride_ib,
    stride_ik,
    bonus_ptr,
    stride_bonus,
    cu_ptr,
    temp_ptr,
    t_stats_ptr,
    ent_ptr,
    amax_val_ptr,
    amax_idx_ptr,  # [B, K+1, NB] fp64 / fp32 / int32 from typical_partials_kernel
    lamax_val_ptr,
    lamax_idx_ptr,  # [B, K+1, NB] logits argmax (greedy requests; LOGITS only)
    out_ptr,  # [B, K+1] int64
    posterior_threshold,
    posterior_alpha,  # fp32 values (the launcher rounds them)
    K,
    V,
    num_rows,
    NB,
    RAGGED: tl.constexpr,
    LOGITS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_NB: tl.constexpr,
    PRECISE: tl.constexpr,
):
    b = tl.program_id(0)
    start, n = request_span(cu_ptr, b, K, num_rows, RAGGED)
    pos = tl.arange(0, BLOCK_K)  # positions 0..K
    blocks = tl.arange(0, BLOCK_NB)
    ids, valid = draft_ids_at(b, pos, start, n, V, num_rows, ids_ptr, stride_ib, stride_ik, RAGGED)
    safe = tl.where(valid, ids, 0)
    t_off, t_ok = row_offset(b, pos, start, n, num_rows, stride_tb, stride_tk, RAGGED)
    t_ok = t_ok & (pos <= K)
    slots = (b * (K + 1) + pos[:, None]) * NB + blocks[None, :]
    temp = 1.0
    greedy = b < 0
    if LOGITS:
        greedy = tl.load(temp_ptr + b) == 0
        temp = effective_temperature(temp_ptr, b)
    row_max, row_sum, cut = row_stats(t_stats_ptr, b * (K + 1) + pos, t_ok)
    pmask = t_ok[:, None] & (blocks[None, :] < tl.where(greedy, 0, NB))
    ent = tl.load(ent_ptr + slots, mask=pmask, other=0.0)
    entropy = -tl.sum(ent, axis=1)  # [BLOCK_K] fp64
    vals = tl.load(amax_val_ptr + slots, mask=pmask, other=-2.0)
    idxs = tl.load(amax_idx_ptr + slots, mask=pmask, other=0).to(tl.int64)
    target_argmax = combine_argmax(vals, idxs, blocks, 1)
    row_ok = tl.max(vals, axis=1) > 0.0  # q has mass (else the argmax 0 has probability 0)
    candidate = load_q(target_ptr, t_off + safe, valid & t_ok, temp, row_max, row_sum, cut, LOGITS, PRECISE)
    if LOGITS:
        # Greedy requests: q is the one-hot of the logits' argmax (reference.probs_from_logits),
        # the zero row when every logit is -inf.
        gmask = t_ok[:, None] & (blocks[None, :] < tl.where(greedy, NB, 0))
        lvals = tl.load(lamax_val_ptr + slots, mask=gmask, other=float("-inf"))
        lidxs = tl.load(lamax_idx_ptr + slots, mask=gmask, other=0).to(tl.int64)
        logit_argmax = combine_argmax(lvals, lidxs, blocks, 1)
        logit_ok = tl.max(lvals, axis=1) > float("-inf")
        one = tl.full(entropy.shape, 1.0, tl.float64)
        one_hot_entropy = tl.where(logit_ok, -(one * precise_log(one + _ENTROPY_EPS, PRECISE)), 0.0)
        entropy = tl.where(greedy, one_hot_entropy, entropy)
        target_argmax = tl.where(greedy, logit_argmax, target_argmax)
        row_ok = tl.where(greedy, logit_ok, row_ok)
        candidate = tl.where(greedy, tl.where((ids == logit_argmax) & logit_ok, 1.0, 0.0), candidate)
    # float64 threshold and test, options as given (fp32 values): reference.typical_accepts
    # (adding to a float64 zero: the options are fp32 tensors when compiled, Python floats when
    # interpreted; their values are fp32 either way, so the conversion is exact)
    zero64 = tl.zeros(entropy.shape, tl.float64)
    threshold = tl.minimum((zero64 + posterior_alpha) * precise_exp(-entropy, PRECISE), zero64 + posterior_threshold)
    accepted = valid & (candidate.to(tl.float64) > threshold)
    j = tl.min(tl.where(accepted, BLOCK_K, pos), axis=0)
    j = tl.minimum(j.to(tl.int64), n)
    recovered = tl.sum(tl.where(pos == j, target_argmax, 0), axis=0)
    recovered_ok = tl.sum(tl.where(pos == j, row_ok.to(tl.int32), 0), axis=0) != 0
    recovered = tl.where(recovered_ok, recovered, -1)
    bonus = tl.load(bonus_ptr + b * stride_bonus).to(tl.int64)
    bonus_valid = (bonus >= 0) & (bonus < V)
    has_row = tl.sum(tl.where(pos == j, t_ok.to(tl.int32), 0), axis=0) != 0
    fallback = tl.where(has_row, recovered, -1)
    final = tl.where(j < n, recovered, tl.where(bonus_valid, bonus, fallback))
    out = tl.where(pos < j, ids, tl.where(pos == j, final, -1))
    tl.store(out_ptr + b * (K + 1) + pos, out, mask=pos <= K)
