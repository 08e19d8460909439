"""Triton kernels of block verification (Sun et al. 2024; ``block_reference`` in
:mod:`spec_samplers.reference` is the definition), both layouts, probabilities or logits.

Launches with fixed grids (CUDA-graph friendly, no host synchronisation):

1. (greedy rows or logits only) the rejection sampler's argmax partials, or the fused-softmax
   statistics (:mod:`spec_samplers.kernels.softmax_kernels`);
2. ``block_partials_kernel`` grid (B, K+1, NB): program (b, m, blk) computes the running ratios
   of request b from gathered scalars, then makes ONE pass over vocab block blk of position m:
   the partial residual mass sum (rho_m q_m - p_m)+, the exponential race of that residual and
   the race of q_m (the fallback). With full draft distributions every position with a draft
   needs its pass (every threshold h_m needs Z_m); with point-mass drafts Z_m has a closed form,
   so each program computes the accepted length tau itself and only position tau's programs
   read the vocabulary;
3. ``block_finalize_kernel`` grid (B,): sums the mass partials into Z_m, computes the
   thresholds, the accepted length tau (the last m with u_m < h_m), combines position tau's race
   partials in block order (ties to the lowest index, as torch.argmax) and writes the row.

Cost against token-wise rejection: rejection reads one (q, p) vocabulary row pair per request,
and only when a draft is rejected; block verification with full drafts reads all k_b row pairs
of every random request (k_b times the traffic of a rejected request, plus the k_b exponential
races), because the threshold at every position needs that position's residual mass. With
point-mass drafts both read one q row.

``enable_fp_fusion=False`` at launch (``KernelLaunch.options``): rho * q - p must round like the reference's separate
multiply and subtract (an FMA would change the last bit and, rarely, a token).
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.constants import RESIDUAL_MASS_EPS
from spec_samplers.kernels.common import (
    combine_argmax,
    draft_ids_at,
    fold_argmax,
    load_q,
    request_span,
    row_offset,
    row_stats,
)
from spec_samplers.kernels.rejection_kernels import bonus_info, first_rejection, request_stream
from spec_samplers.kernels.rng import exponential_from_words, random_words, uniform_from_words
from spec_samplers.rng import RACE_SCALE, STREAM_ACCEPT, STREAM_RECOVER

_MASS_EPS = tl.constexpr(RESIDUAL_MASS_EPS)
_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)
_STREAM_RECOVER = tl.constexpr(STREAM_RECOVER)
_RACE_SCALE = tl.constexpr(RACE_SCALE)


@triton.jit
def block_scalars(
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
    temp,
    t_stats_ptr,
    d_stats_ptr,
    RAGGED: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    LOGITS: tl.constexpr,
    PRECISE: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Per-position scalars of request b at ``pos`` (0 .. BLOCK_K-1, BLOCK_K >= K + 1).

    Returns (draft ids (int64), id valid and inside the request, q_m(x_m), rho_m): rho as
    :func:`spec_samplers.reference.running_ratios`, same operations, same order."""
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
    ok = valid & (p_x > 0.0)
    ratio = tl.where(ok, tl.math.div_rn(q_x, tl.where(ok, p_x, 1.0)), 0.0)
    rho = tl.full([], 1.0, tl.float32)
    rho_vec = tl.where(pos == 0, 1.0, 0.0)
    for i in range(0, BLOCK_K - 1):
        r = tl.sum(tl.where(pos == i, ratio, 0.0), axis=0)  # one non-zero term: exact
        rho = tl.where(rho > 0.0, tl.minimum(rho * r, 1.0), 0.0)
        rho_vec = tl.where(pos == i + 1, rho, rho_vec)
    return ids, valid, q_x, rho_vec


@triton.jit
def block_tau(pos, n, valid, rho_vec, mass, seed, offset):
    """Accepted length: the last m in [1, n] with u_m < h_m (u_m: the accept uniform of
    position m - 1), 0 if none. ``mass``: Z_m at positions with a valid draft."""
    full = rho_vec >= 1.0  # h = 1 (Z / Z, or 0 / 0)
    thr = tl.where(full, 1.0, tl.math.div_rn(mass, tl.where(full, 1.0, mass + (1.0 - rho_vec))))
    h = tl.where(valid, thr, rho_vec)
    # u_m: the accept uniform of position m - 1 (the clamp keeps position 0's unused counter valid)
    w0, w1, _, _ = random_words(seed, offset, tl.maximum(pos - 1, 0), _STREAM_ACCEPT)
    u = uniform_from_words(w0, w1)
    stop = (pos >= 1) & (pos <= n) & (u < h)
    return tl.max(tl.where(stop, pos, 0), axis=0).to(tl.int64)


# num_rows (T), chunk and NB follow the batch size, which changes every engine step: left
# unspecialised so that a new batch size reuses the compiled variant.
@triton.jit(do_not_specialize=["num_rows", "chunk", "NB"])
def block_partials_kernel(
    target_ptr,
    stride_tb,
    stride_tk,  # target rows, vocab stride 1
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
    part_qmax_ptr,  # [B, K+1, NB]
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
    m = tl.program_id(1).to(tl.int64)
    blk = tl.program_id(2)
    start, n = request_span(cu_ptr, b, K, num_rows, RAGGED)
    seed, offset, temp = request_stream(seed_ptr, offset_ptr, temp_ptr, b, HAS_OFFSETS, LOGITS)
    pos = tl.arange(0, BLOCK_K)
    ids, valid, q_x, rho_vec = block_scalars(
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
        temp,
        t_stats_ptr,
        d_stats_ptr,
        RAGGED,
        HAS_DRAFT,
        LOGITS,
        PRECISE,
        BLOCK_K,
    )
    _, bonus_valid = bonus_info(bonus_ptr, stride_bonus, b, V)
    q_off, has_row = row_offset(b, m, start, n, num_rows, stride_tb, stride_tk, RAGGED)
    need = has_row & ((m < n) | (~bonus_valid))
    if not HAS_DRAFT:
        # Point-mass drafts: Z_m = rho_m (1 - q_m(x_m)) from scalars, so tau is known here and
        # only its position needs the vocabulary.
        mass = tl.maximum(rho_vec * (1.0 - q_x), 0.0)
        need = need & (m == block_tau(pos, n, valid, rho_vec, mass, seed, offset))
    if HAS_GREEDY:
        need = need & (tl.load(greedy_ptr + b) == 0)
    if need:
        at_m = pos == m
        rho_m = tl.sum(tl.where(at_m, rho_vec, 0.0), axis=0)
        valid_m = tl.sum(tl.where(at_m, valid.to(tl.int32), 0), axis=0) != 0
        x_m = tl.sum(tl.where(at_m, ids, 0), axis=0)
        q_max, q_sum, q_cut = row_stats(t_stats_ptr, b * (K + 1) + m, has_row)
        p_max, p_sum, p_cut = row_stats(d_stats_ptr, b * (K + 1) + m, has_row)
        lo = blk * chunk
        hi = tl.minimum(lo + chunk, V)
        if HAS_DRAFT:
            p_off, p_ok = row_offset(b, m, start, n, num_rows, stride_db, stride_dk, RAGGED)
            # (scalar & vector masks trip the interpreter: fold the row test into the bound)
            p_hi = tl.where(p_ok & valid_m, hi, 0)
        # Without a valid draft at m (the bonus row, an out-of-range draft) the residual is q_m.
        x_removed = tl.where(valid_m, x_m, -1)
        resid_scale = tl.where(valid_m, rho_m, 1.0)
        mass_acc = 0.0
        qmax = 0.0  # > 0 iff q_m has probability mass (a race key of q may underflow; this cannot)
        best_r = -1.0
        best_r_idx = 0
        best_q = -1.0
        best_q_idx = 0
        for s in range(lo, hi, BLOCK_V):
            offs = s + tl.arange(0, BLOCK_V)
            msk = offs < hi
            q = load_q(target_ptr, q_off + offs, msk, temp, q_max, q_sum, q_cut, LOGITS, PRECISE)
            if HAS_DRAFT:
                p = load_q(draft_ptr, p_off + offs, offs < p_hi, temp, p_max, p_sum, p_cut, LOGITS, PRECISE)
                w = tl.where(valid_m, tl.maximum(rho_m * q - p, 0.0), q)
            else:
                scaled = resid_scale * q
                w = tl.where(offs == x_removed, tl.maximum(scaled - 1.0, 0.0), tl.where(valid_m, scaled, q))
            mass_acc += tl.sum(w, axis=0)
            qmax = tl.maximum(qmax, tl.max(q, axis=0))
            # one Philox call per vocab pair (s is even): words (0, 1) for even, (2, 3) for odd ids
            pairs = (m << 32) + s // 2 + tl.arange(0, BLOCK_V // 2)
            r0, r1, r2, r3 = random_words(seed, offset, pairs, _STREAM_RECOVER)
            e = tl.interleave(exponential_from_words(r0, r1, PRECISE), exponential_from_words(r2, r3, PRECISE))
            inv = tl.math.div_rn(tl.full(e.shape, _RACE_SCALE, tl.float32), e)  # one division, both races
            rk = tl.where(msk, w * inv, -1.0)
            qk = tl.where(msk, q * inv, -1.0)
            best_r, best_r_idx = fold_argmax(rk, s, best_r, best_r_idx)
            best_q, best_q_idx = fold_argmax(qk, s, best_q, best_q_idx)
        slot = (b * (K + 1) + m) * NB + blk
        tl.store(part_mass_ptr + slot, mass_acc)
        tl.store(part_rkey_ptr + slot, best_r)
        tl.store(part_ridx_ptr + slot, best_r_idx.to(tl.int32))  # type: ignore[attr-defined]  # a tensor after the loop
        tl.store(part_qkey_ptr + slot, best_q)
        tl.store(part_qidx_ptr + slot, best_q_idx.to(tl.int32))  # type: ignore[attr-defined]  # a tensor after the loop
        tl.store(part_qmax_ptr + slot, qmax)


@triton.jit(do_not_specialize=["num_rows", "NB"])  # as block_partials_kernel
def block_finalize_kernel(
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
    part_qmax_ptr,  # [B, K+1, NB]
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
    ids, valid, q_x, rho_vec = block_scalars(
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
        temp,
        t_stats_ptr,
        d_stats_ptr,
        RAGGED,
        HAS_DRAFT,
        LOGITS,
        PRECISE,
        BLOCK_K,
    )
    blocks = tl.arange(0, BLOCK_NB)
    greedy = b < 0  # a false scalar tensor
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + b) != 0
    if HAS_DRAFT:
        # Partials exist where a pass ran: positions with a valid draft of a random request.
        passed = valid & (pos <= tl.where(greedy, -1, K))
        tile = (b * (K + 1) + pos[:, None]) * NB + blocks[None, :]
        tmask = passed[:, None] & (blocks[None, :] < NB)
        mass = tl.sum(tl.load(part_mass_ptr + tile, mask=tmask, other=0.0), axis=1)
    else:
        mass = tl.maximum(rho_vec * (1.0 - q_x), 0.0)
    j = block_tau(pos, n, valid, rho_vec, mass, seed, offset)
    if HAS_GREEDY:
        slots = (b * (K + 1) + pos[:, None]) * NB + blocks[None, :]
        pmask = (pos[:, None] <= tl.where(greedy, K, -1)) & (blocks[None, :] < NB)
        vals = tl.load(amax_val_ptr + slots, mask=pmask, other=float("-inf"))
        vals = tl.where(vals == vals, vals, float("-inf"))
        idxs = tl.load(amax_idx_ptr + slots, mask=pmask, other=0).to(tl.int64)
        target_argmax = combine_argmax(vals, idxs, blocks, 1)  # [BLOCK_K]
        # A row without mass has no greedy token (as in the rejection kernels).
        if LOGITS:
            row_ok = tl.max(vals, axis=1) > float("-inf")  # partials of the raw logits
        else:
            row_ok = tl.max(vals, axis=1) > 0.0  # partials of q
        greedy_ok = valid & (ids == target_argmax) & row_ok
        j = tl.where(greedy, first_rejection(greedy_ok, pos, n, BLOCK_K), j)
    j = tl.minimum(j, n)  # a malformed ragged request (k_b = -1) emits no token
    has_draft = j < n
    bonus, bonus_valid = bonus_info(bonus_ptr, stride_bonus, b, V)
    _, has_row = row_offset(b, j, start, n, num_rows, stride_tb, stride_tk, RAGGED)
    need = has_row & (has_draft | (~bonus_valid)) & (~greedy)
    # Position j's partials were written iff ``need``; read nothing otherwise (the bound folds the
    # scalar condition into the vector mask).
    nb_hi = tl.where(need, NB, 0)
    bmask = blocks < nb_hi
    jslot = (b * (K + 1) + j) * NB + blocks
    rmass = tl.sum(tl.load(part_mass_ptr + jslot, mask=bmask, other=0.0), axis=0)
    rkey = tl.load(part_rkey_ptr + jslot, mask=bmask, other=-2.0)
    ridx = tl.load(part_ridx_ptr + jslot, mask=bmask, other=0).to(tl.int64)
    qkey = tl.load(part_qkey_ptr + jslot, mask=bmask, other=-2.0)
    qidx = tl.load(part_qidx_ptr + jslot, mask=bmask, other=0).to(tl.int64)
    recovered = tl.where(
        rmass <= _MASS_EPS, combine_argmax(qkey, qidx, blocks, 0), combine_argmax(rkey, ridx, blocks, 0)
    )
    qmax = tl.load(part_qmax_ptr + jslot, mask=bmask, other=0.0)
    q_ok = tl.max(tl.where(qmax == qmax, qmax, 0.0), axis=0) > 0.0
    recovered = tl.where(q_ok, recovered, -1)  # q_j without mass: no token
    if HAS_GREEDY:
        greedy_row_ok = tl.sum(tl.where(pos == j, row_ok.to(tl.int32), 0), axis=0) != 0
        greedy_token = tl.where(greedy_row_ok, tl.sum(tl.where(pos == j, target_argmax, 0), axis=0), -1)
        recovered = tl.where(greedy, greedy_token, recovered)
    fallback = tl.where(has_row, recovered, -1)
    final = tl.where(has_draft, recovered, tl.where(bonus_valid, bonus, fallback))
    out = tl.where(pos < j, ids, tl.where(pos == j, final, -1))
    tl.store(out_ptr + b * (K + 1) + pos, out, mask=pos <= K)
