"""Triton kernels of lossless rejection sampling (docs/design.md section 3), both layouts.

Three launches with fixed grids (CUDA-graph friendly, no host synchronisation):

1. ``argmax_partials_kernel`` grid (B, K+1, NB), only when greedy rows may exist: per vocab block,
   (max, argmax) of q_i for every position of greedy requests (random requests exit at once).
2. ``residual_partials_kernel`` grid (B, NB): each program finds its request's first rejected
   position j from gathered scalars, then races its vocab block of the residual (q_j - p_j)+
   (and of q_j, for the zero-mass fallback). Requests that accept everything (with a valid bonus
   id), and greedy requests, exit without reading the vocabulary.
3. ``finalize_kernel`` grid (B,): recomputes j, combines the NB block partials in block order
   (ties to the lowest vocab index, as torch.argmax) and writes the output row.

NB vocab blocks per request keep the GPU busy at B = 1; the combination is a second kernel, not
atomics, so results do not depend on scheduling.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.constants import RESIDUAL_MASS_EPS
from spec_samplers.kernels.common import (
    clean,
    combine_argmax,
    draft_ids_at,
    fold_argmax,
    load_q,
    request_span,
    row_offset,
    row_stats,
)
from spec_samplers.kernels.rng import exponential_from_words, random_words, uniform_from_words
from spec_samplers.kernels.softmax_kernels import effective_temperature
from spec_samplers.rng import RACE_SCALE, STREAM_ACCEPT, STREAM_RECOVER

_MASS_EPS = tl.constexpr(RESIDUAL_MASS_EPS)
_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)
_STREAM_RECOVER = tl.constexpr(STREAM_RECOVER)
_RACE_SCALE = tl.constexpr(RACE_SCALE)


@triton.jit
def load_probs(ptr, offs, mask):
    """Cleaned fp32 probabilities (any float dtype read as stored)."""
    return clean(tl.load(ptr + offs, mask=mask, other=0.0))


@triton.jit
def random_accepts(
    b,
    pos,
    start,
    n,
    K,
    V,
    num_rows,
    target_ptr,
    stride_tb,
    stride_tk,
    draft_ptr,
    stride_db,
    stride_dk,
    ids_ptr,
    stride_ib,
    stride_ik,
    seed,
    offset,
    temp,
    t_stats_ptr,
    d_stats_ptr,  # logits only: T and [B, K+1, 3] row statistics (common.row_stats)
    RAGGED: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    LOGITS: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Accept test of the random rule at positions ``pos`` from gathered scalars only.

    Returns (accepted, draft ids as given (int64), id in [0, V) and inside the request)."""
    in_req = pos < n
    ids, valid = draft_ids_at(b, pos, start, n, V, num_rows, ids_ptr, stride_ib, stride_ik, RAGGED)
    safe = tl.where(valid, ids, 0)
    t_max, t_sum, t_cut = row_stats(t_stats_ptr, b * (K + 1) + pos, in_req)
    d_max, d_sum, d_cut = row_stats(d_stats_ptr, b * (K + 1) + pos, in_req)
    t_off, t_ok = row_offset(b, pos, start, n, num_rows, stride_tb, stride_tk, RAGGED)
    q_x = load_q(target_ptr, t_off + safe, valid & t_ok, temp, t_max, t_sum, t_cut, LOGITS, PRECISE)
    if HAS_DRAFT:
        d_off, d_ok = row_offset(b, pos, start, n, num_rows, stride_db, stride_dk, RAGGED)
        p_x = load_q(draft_ptr, d_off + safe, valid & d_ok, temp, d_max, d_sum, d_cut, LOGITS, PRECISE)
    else:
        p_x = tl.full(q_x.shape, 1.0, tl.float32)
    w0, w1, _, _ = random_words(seed, offset, pos, _STREAM_ACCEPT)
    # u < q/p (as the reference): q >= p always accepts, subnormal p included
    ratio = tl.math.div_rn(q_x, tl.where(p_x > 0.0, p_x, 1.0))
    accepted = valid & (p_x > 0.0) & (uniform_from_words(w0, w1) < ratio)
    return accepted, ids, valid


@triton.jit
def request_stream(seed_ptr, offset_ptr, temp_ptr, b, HAS_OFFSETS: tl.constexpr, LOGITS: tl.constexpr):
    """Request b's (seed, counter offset, temperature); offset 0 and T = 1 when not given."""
    seed = tl.load(seed_ptr + b).to(tl.int64)
    if HAS_OFFSETS:
        offset = tl.load(offset_ptr + b).to(tl.int64)
    else:
        offset = seed * 0
    temp = 1.0
    if LOGITS:
        temp = effective_temperature(temp_ptr, b)
    return seed, offset, temp


@triton.jit
def first_rejection(accepted, pos, n, BLOCK_K: tl.constexpr):
    """Length of the accepted prefix (<= k_b)."""
    j = tl.min(tl.where(accepted, BLOCK_K, pos), axis=0)
    return tl.minimum(j.to(tl.int64), n)


@triton.jit
def hi_of_block(blk, chunk, V):
    return tl.minimum(blk * chunk + chunk, V)


@triton.jit
def bonus_info(bonus_ptr, stride_bonus, b, V):
    bonus = tl.load(bonus_ptr + b * stride_bonus).to(tl.int64)
    return bonus, (bonus >= 0) & (bonus < V)


# num_rows (T), chunk and NB follow the batch size, which changes every engine step: left
# unspecialised so that a new batch size reuses the compiled variant.
@triton.jit(do_not_specialize=["num_rows", "chunk", "NB"])
def argmax_partials_kernel(
    target_ptr,
    stride_tb,
    stride_tk,  # target rows, vocab stride 1
    cu_ptr,  # [B] inclusive cumsum of k_b (ragged only)
    greedy_ptr,  # [B] bool
    part_val_ptr,
    part_idx_ptr,  # [B, K+1, NB] fp32 / int32
    K,
    V,
    num_rows,
    chunk,
    NB,
    RAGGED: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0)
    i = tl.program_id(1)
    blk = tl.program_id(2)
    start, n = request_span(cu_ptr, b, K, num_rows, RAGGED)
    off, ok = row_offset(b, i, start, n, num_rows, stride_tb, stride_tk, RAGGED)
    greedy = tl.load(greedy_ptr + b) != 0
    if greedy & ok:
        lo = blk * chunk
        hi = tl.minimum(lo + chunk, V)
        best = -1.0
        best_idx = lo
        for s in range(lo, hi, BLOCK_V):
            offs = s + tl.arange(0, BLOCK_V)
            m = offs < hi
            vals = tl.where(m, load_probs(target_ptr, off + offs, m), -1.0)
            best, best_idx = fold_argmax(vals, s, best, best_idx)
        slot = (b * (K + 1) + i) * NB + blk
        tl.store(part_val_ptr + slot, best)
        tl.store(part_idx_ptr + slot, best_idx.to(tl.int32))


# num_rows (T), chunk and NB follow the batch size, which changes every engine step: left
# unspecialised so that a new batch size reuses the compiled variant.
@triton.jit(do_not_specialize=["num_rows", "chunk", "NB"])
def residual_partials_kernel(
    target_ptr,
    stride_tb,
    stride_tk,
    draft_ptr,
    stride_db,
    stride_dk,  # target_ptr again when HAS_DRAFT is False
    ids_ptr,
    stride_ib,
    stride_ik,
    bonus_ptr,
    stride_bonus,
    cu_ptr,
    seed_ptr,
    offset_ptr,
    greedy_ptr,
    part_mass_ptr,
    part_rkey_ptr,
    part_ridx_ptr,
    part_qkey_ptr,
    part_qidx_ptr,
    part_qmax_ptr,  # [B, NB]
    temp_ptr,
    t_stats_ptr,
    d_stats_ptr,  # logits only: [B] T, [B, K+1, 3] statistics (common.row_stats)
    K,
    V,
    num_rows,
    chunk,
    NB,
    RAGGED: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    HAS_OFFSETS: tl.constexpr,
    HAS_GREEDY: tl.constexpr,
    LOGITS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    b = tl.program_id(0)
    blk = tl.program_id(1)
    start, n = request_span(cu_ptr, b, K, num_rows, RAGGED)
    seed, offset, temp = request_stream(seed_ptr, offset_ptr, temp_ptr, b, HAS_OFFSETS, LOGITS)
    pos = tl.arange(0, BLOCK_K)
    accepted, ids, valid = random_accepts(
        b,
        pos,
        start,
        n,
        K,
        V,
        num_rows,
        target_ptr,
        stride_tb,
        stride_tk,
        draft_ptr,
        stride_db,
        stride_dk,
        ids_ptr,
        stride_ib,
        stride_ik,
        seed,
        offset,
        temp,
        t_stats_ptr,
        d_stats_ptr,
        RAGGED,
        HAS_DRAFT,
        LOGITS,
        PRECISE,
    )
    j = first_rejection(accepted, pos, n, BLOCK_K)
    has_draft = j < n
    _, bonus_valid = bonus_info(bonus_ptr, stride_bonus, b, V)
    q_off, has_row = row_offset(b, j, start, n, num_rows, stride_tb, stride_tk, RAGGED)
    need = has_row & (has_draft | (~bonus_valid))
    if HAS_GREEDY:
        need = need & (tl.load(greedy_ptr + b) == 0)
    if need:
        q_max, q_sum, q_cut = row_stats(t_stats_ptr, b * (K + 1) + j, has_row)
        p_max, p_sum, p_cut = row_stats(d_stats_ptr, b * (K + 1) + j, has_row)
        x_j = tl.sum(tl.where(pos == j, ids, 0), axis=0)
        remove = has_draft & (tl.sum(tl.where(pos == j, valid.to(tl.int32), 0), axis=0) != 0)
        if HAS_DRAFT:
            p_off, p_ok = row_offset(b, j, start, n, num_rows, stride_db, stride_dk, RAGGED)
            # An out-of-range draft was never a sample of p: recover from q (p row treated as 0).
            # (scalar & vector masks trip the interpreter: fold the row test into the bound)
            p_hi = tl.where(p_ok & remove, hi_of_block(blk, chunk, V), 0)
        x_removed = tl.where(remove, x_j, -1)  # point-mass draft: q_j without x_j
        lo = blk * chunk
        hi = tl.minimum(lo + chunk, V)
        mass = 0.0
        qmax = 0.0  # > 0 iff q_j has probability mass (a race key of q may underflow; this cannot)
        best_r = -1.0
        best_r_idx = 0
        best_q = -1.0
        best_q_idx = 0
        for s in range(lo, hi, BLOCK_V):
            offs = s + tl.arange(0, BLOCK_V)
            m = offs < hi
            q = load_q(target_ptr, q_off + offs, m, temp, q_max, q_sum, q_cut, LOGITS, PRECISE)
            if HAS_DRAFT:
                p = load_q(draft_ptr, p_off + offs, offs < p_hi, temp, p_max, p_sum, p_cut, LOGITS, PRECISE)
                r = tl.maximum(q - p, 0.0)
            else:
                r = tl.where(offs == x_removed, 0.0, q)
            mass += tl.sum(r, axis=0)
            qmax = tl.maximum(qmax, tl.max(q, axis=0))
            # one Philox call per vocab pair (s is even): words (0, 1) for even, (2, 3) for odd ids
            pairs = (j << 32) + s // 2 + tl.arange(0, BLOCK_V // 2)
            w0, w1, w2, w3 = random_words(seed, offset, pairs, _STREAM_RECOVER)
            e = tl.interleave(exponential_from_words(w0, w1, PRECISE), exponential_from_words(w2, w3, PRECISE))
            inv = tl.math.div_rn(tl.full(e.shape, _RACE_SCALE, tl.float32), e)  # one division, both races
            rk = tl.where(m, r * inv, -1.0)
            qk = tl.where(m, q * inv, -1.0)
            best_r, best_r_idx = fold_argmax(rk, s, best_r, best_r_idx)
            best_q, best_q_idx = fold_argmax(qk, s, best_q, best_q_idx)
        slot = b * NB + blk
        tl.store(part_mass_ptr + slot, mass)
        tl.store(part_rkey_ptr + slot, best_r)
        tl.store(part_ridx_ptr + slot, best_r_idx.to(tl.int32))  # type: ignore[attr-defined]  # a tensor after the loop
        tl.store(part_qkey_ptr + slot, best_q)
        tl.store(part_qidx_ptr + slot, best_q_idx.to(tl.int32))  # type: ignore[attr-defined]  # a tensor after the loop
        tl.store(part_qmax_ptr + slot, qmax)


# num_rows (T), chunk and NB follow the batch size, which changes every engine step: left
# unspecialised so that a new batch size reuses the compiled variant.
@triton.jit(do_not_specialize=["num_rows", "NB"])
def finalize_kernel(
    target_ptr,
    stride_tb,
    stride_tk,
    draft_ptr,
    stride_db,
    stride_dk,
    ids_ptr,
    stride_ib,
    stride_ik,
    bonus_ptr,
    stride_bonus,
    cu_ptr,
    seed_ptr,
    offset_ptr,
    greedy_ptr,
    part_mass_ptr,
    part_rkey_ptr,
    part_ridx_ptr,
    part_qkey_ptr,
    part_qidx_ptr,
    part_qmax_ptr,  # [B, NB]
    temp_ptr,
    t_stats_ptr,
    d_stats_ptr,  # logits only: [B] T, [B, K+1, 3] statistics (common.row_stats)
    amax_val_ptr,
    amax_idx_ptr,  # [B, K+1, NB] (greedy only)
    out_ptr,  # [B, K+1] int64
    K,
    V,
    num_rows,
    NB,
    RAGGED: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    HAS_OFFSETS: tl.constexpr,
    HAS_GREEDY: tl.constexpr,
    LOGITS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_NB: tl.constexpr,
    PRECISE: tl.constexpr,
):
    b = tl.program_id(0)
    start, n = request_span(cu_ptr, b, K, num_rows, RAGGED)
    seed, offset, temp = request_stream(seed_ptr, offset_ptr, temp_ptr, b, HAS_OFFSETS, LOGITS)
    pos = tl.arange(0, BLOCK_K)  # positions 0..K (BLOCK_K >= K + 1)
    accepted, ids, valid = random_accepts(
        b,
        pos,
        start,
        n,
        K,
        V,
        num_rows,
        target_ptr,
        stride_tb,
        stride_tk,
        draft_ptr,
        stride_db,
        stride_dk,
        ids_ptr,
        stride_ib,
        stride_ik,
        seed,
        offset,
        temp,
        t_stats_ptr,
        d_stats_ptr,
        RAGGED,
        HAS_DRAFT,
        LOGITS,
        PRECISE,
    )
    blocks = tl.arange(0, BLOCK_NB)
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + b) != 0
        slots = (b * (K + 1) + pos[:, None]) * NB + blocks[None, :]
        pmask = (pos[:, None] <= tl.where(greedy, K, -1)) & (blocks[None, :] < NB)
        vals = tl.load(amax_val_ptr + slots, mask=pmask, other=float("-inf"))
        vals = tl.where(vals == vals, vals, float("-inf"))  # stale slots of absent rows (never used)
        idxs = tl.load(amax_idx_ptr + slots, mask=pmask, other=0).to(tl.int64)
        target_argmax = combine_argmax(vals, idxs, blocks, 1)  # [BLOCK_K]
        # A row without mass (all-zero q; logits all -inf) has no greedy token: its argmax 0
        # is never accepted, and recovering there emits -1.
        if LOGITS:
            row_ok = tl.max(vals, axis=1) > float("-inf")  # partials of the raw logits
        else:
            row_ok = tl.max(vals, axis=1) > 0.0  # partials of q
        accepted = tl.where(greedy, valid & (ids == target_argmax) & row_ok, accepted)
    j = first_rejection(accepted, pos, n, BLOCK_K)
    has_draft = j < n
    bonus, bonus_valid = bonus_info(bonus_ptr, stride_bonus, b, V)
    _, has_row = row_offset(b, j, start, n, num_rows, stride_tb, stride_tk, RAGGED)

    # Partials exist only for requests that needed a vocabulary pass; other slots hold stale
    # memory, read (harmlessly) but never used: NaN is masked so no reduction sees it.
    bmask = blocks < NB
    mass = tl.load(part_mass_ptr + b * NB + blocks, mask=bmask, other=0.0)
    mass = tl.sum(tl.where(mass == mass, mass, 0.0), axis=0)
    rkey = tl.load(part_rkey_ptr + b * NB + blocks, mask=bmask, other=-2.0)
    rkey = tl.where(rkey == rkey, rkey, -2.0)
    ridx = tl.load(part_ridx_ptr + b * NB + blocks, mask=bmask, other=0).to(tl.int64)
    qkey = tl.load(part_qkey_ptr + b * NB + blocks, mask=bmask, other=-2.0)
    qkey = tl.where(qkey == qkey, qkey, -2.0)
    qidx = tl.load(part_qidx_ptr + b * NB + blocks, mask=bmask, other=0).to(tl.int64)
    recovered = tl.where(
        mass <= _MASS_EPS, combine_argmax(qkey, qidx, blocks, 0), combine_argmax(rkey, ridx, blocks, 0)
    )
    qmax = tl.load(part_qmax_ptr + b * NB + blocks, mask=bmask, other=0.0)
    q_ok = tl.max(tl.where(qmax == qmax, qmax, 0.0), axis=0) > 0.0
    recovered = tl.where(q_ok, recovered, -1)  # q_j without mass: no token
    if HAS_GREEDY:
        greedy_ok = tl.sum(tl.where(pos == j, row_ok.to(tl.int32), 0), axis=0) != 0
        greedy_token = tl.where(greedy_ok, tl.sum(tl.where(pos == j, target_argmax, 0), axis=0), -1)
        recovered = tl.where(greedy, greedy_token, recovered)
    fallback = tl.where(has_row, recovered, -1)
    final = tl.where(has_draft, recovered, tl.where(bonus_valid, bonus, fallback))
    out = tl.where(pos < j, ids, tl.where(pos == j, final, -1))
    tl.store(out_ptr + b * (K + 1) + pos, out, mask=pos <= K)
