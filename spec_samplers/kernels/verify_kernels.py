"""Triton helpers shared by the rejection and block-verification kernels: per-request setup, the
draft-position gather, the vocabulary pass (residual mass and the two exponential races), the
combination of its block partials and the output row.

Kernel arguments travel in tuples (Triton passes tuples to kernels and jit functions alike);
absent tensors are None, which Triton specialises on, so the flags follow from them:

* ``seqs = (target, draft, ids)``: ``target`` and ``draft`` are ``(ptr, stride_b, stride_k,
  stats_ptr)`` over q / p rows (vocab stride 1) of a padded [B, K(+1), V] or ragged [T, V]
  tensor (:func:`spec_samplers.kernels.common.row_offset`), with their [B, K+1, 3] fused-softmax
  statistics (:func:`spec_samplers.kernels.common.row_stats`; None for probabilities, and
  LOGITS follows from it); ``draft`` is all None for point-mass drafts (HAS_DRAFT); ``ids`` is
  ``(ptr, stride_b, stride_k)`` of the draft ids;
* ``req = (cu_ptr, seed_ptr, offset_ptr, temp_ptr, greedy_ptr, bonus_ptr, stride_bonus)``: [B]
  inclusive cumsum of k_b (ragged only: RAGGED), [B] seeds, [B] counter offsets (HAS_OFFSETS),
  [B] T (logits only), [B] bool greedy mask (HAS_GREEDY), [B, 1] bonus ids;
* ``parts = (mass, rkey, ridx, qkey, qidx, qmax, amax_val, amax_idx)``: the vocabulary-pass
  partials fp32 / int32, one per (request[, position], vocab block), then the [B, K+1, NB]
  argmax partials of greedy requests (None without greedy requests).

Inside a kernel, ``rq = (b, start, k_b, seed, offset, T, K, V, num_rows)`` (:func:`open_request`)
describes the program's request and the batch's sizes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.constants import RESIDUAL_MASS_EPS
from spec_samplers.kernels import common as kc
from spec_samplers.kernels.rng import exponential_from_words, random_words
from spec_samplers.kernels.softmax_kernels import effective_temperature
from spec_samplers.rng import RACE_SCALE, STREAM_RECOVER

_MASS_EPS = tl.constexpr(RESIDUAL_MASS_EPS)
_STREAM_RECOVER = tl.constexpr(STREAM_RECOVER)
_RACE_SCALE = tl.constexpr(RACE_SCALE)


@triton.jit
def open_request(req, K, V, num_rows):
    """``rq`` of request b = program_id(0): (b, first flat row, k_b, seed, counter offset, T,
    K, V, num_rows); seed and offset 0 and T = 1 when not given."""
    cu_ptr, seed_ptr, offset_ptr, temp_ptr = req[0], req[1], req[2], req[3]
    b = tl.program_id(0)
    start, n = kc.request_span(cu_ptr, b, K, num_rows, cu_ptr is not None)
    seed = b.to(tl.int64) * 0
    if seed_ptr is not None:
        seed = tl.load(seed_ptr + b).to(tl.int64)
    offset = seed * 0
    if offset_ptr is not None:
        offset = tl.load(offset_ptr + b).to(tl.int64)
    temp = 1.0
    if temp_ptr is not None:
        temp = effective_temperature(temp_ptr, b)
    return b, start, n, seed, offset, temp, K, V, num_rows


@triton.jit
def request_greedy(req, b):
    """Whether request b is greedy (a false scalar tensor without a greedy mask)."""
    greedy = b < 0
    if req[4] is not None:
        greedy = tl.load(req[4] + b) != 0
    return greedy


@triton.jit
def bonus_info(req, rq):
    """(bonus id of the request as given (int64), id in [0, V))."""
    bonus = tl.load(req[5] + rq[0] * req[6]).to(tl.int64)
    return bonus, (bonus >= 0) & (bonus < rq[7])


@triton.jit
def locate_row(rows, rq, i, RAGGED: tl.constexpr):
    """(element offset of row (b, i) of ``rows`` = (ptr, stride_b, stride_k, stats_ptr), row
    exists, its (max, sum, cut) statistics). ``i`` a scalar or a vector; statistics outside the
    row or past K are the defaults."""
    b, start, n, K = rq[0], rq[1], rq[2], rq[6]
    off, ok = kc.row_offset(b, i, start, n, rq[8], rows[1], rows[2], RAGGED)
    st = kc.row_stats(rows[3], b * (K + 1) + i, ok & (i <= K))
    return off, ok, st


@triton.jit
def q_at(rows, off, mask, temp, st, PRECISE: tl.constexpr):
    """Cleaned fp32 q at ``off`` of ``rows`` (:func:`spec_samplers.kernels.common.load_q`;
    logits when the rows have statistics)."""
    return kc.load_q(rows[0], off, mask, temp, st[0], st[1], st[2], rows[3] is not None, PRECISE)


@triton.jit
def gather_at_drafts(rq, pos, seqs, RAGGED: tl.constexpr, PRECISE: tl.constexpr):
    """(draft ids as given (int64), id in [0, V) and inside the request, q_i(x_i), p_i(x_i)) at
    positions ``pos``; p = 1 for point-mass drafts."""
    target, draft, ids = seqs
    b, start, n, temp = rq[0], rq[1], rq[2], rq[5]
    x, valid = kc.draft_ids_at(b, pos, start, n, rq[7], rq[8], ids[0], ids[1], ids[2], RAGGED)
    safe = tl.where(valid, x, 0)
    t_off, t_ok, t_st = locate_row(target, rq, pos, RAGGED)
    q_x = q_at(target, t_off + safe, valid & t_ok, temp, t_st, PRECISE)
    if draft[0] is not None:
        d_off, d_ok, d_st = locate_row(draft, rq, pos, RAGGED)
        p_x = q_at(draft, d_off + safe, valid & d_ok, temp, d_st, PRECISE)
    else:
        p_x = tl.full(q_x.shape, 1.0, tl.float32)
    return x, valid, q_x, p_x


@triton.jit
def first_rejection(accepted, pos, n, BLOCK_K: tl.constexpr):
    """Length of the accepted prefix (<= k_b)."""
    j = tl.min(tl.where(accepted, BLOCK_K, pos), axis=0)
    return tl.minimum(j.to(tl.int64), n)


@triton.jit
def at(pos, j, vals):
    """vals[j] of a per-position vector (one non-zero term: exact)."""
    return tl.sum(tl.where(pos == j, vals, 0), axis=0)


@triton.jit
def needs_pass(rq, req, j, has_row):
    """Whether position j needs a recovered token from the vocabulary: a random request whose
    row j exists and whose prefix stops at a draft (j < k_b) or at a bonus row without a valid
    bonus id."""
    _, bonus_valid = bonus_info(req, rq)
    return has_row & ((j < rq[2]) | (~bonus_valid)) & (~request_greedy(req, rq[0]))


@triton.jit
def residual_pass(rq, j, drafts, seqs, parts, slot, vocab, FLAGS: tl.constexpr, BLOCK_V: tl.constexpr):
    """One pass over vocab block ``vocab = (blk, chunk)`` of position j: stores at ``slot`` of
    ``parts`` the partial residual mass, the exponential races of the residual and of q_j (the
    zero-mass fallback; both from one Philox call per vocab pair) and the partial max of q_j.

    ``drafts = (pos, draft ids, id valid, rho)`` per position; FLAGS = (RAGGED, SCALED,
    PRECISE). The residual without a valid draft x_j (the bonus row, an out-of-range draft) is
    q_j. With a valid draft it is (q_j - p_j)+, or with point-mass drafts q_j without x_j;
    SCALED (block verification) scales q_j by rho_j first: (rho_j q_j - p_j)+, and
    (rho_j q_j(x_j) - 1)+ at x_j (rho is unused otherwise)."""
    RAGGED: tl.constexpr = FLAGS[0]
    SCALED: tl.constexpr = FLAGS[1]
    PRECISE: tl.constexpr = FLAGS[2]
    target, draft = seqs[0], seqs[1]
    seed, offset, temp = rq[3], rq[4], rq[5]
    pos = drafts[0]
    x_j = at(pos, j, drafts[1])
    valid_j = at(pos, j, drafts[2].to(tl.int32)) != 0
    rho_j = at(pos, j, drafts[3])
    q_off, _, q_st = locate_row(target, rq, j, RAGGED)
    lo = vocab[0] * vocab[1]
    hi = tl.minimum(lo + vocab[1], rq[7])
    if draft[0] is not None:
        p_off, p_ok, p_st = locate_row(draft, rq, j, RAGGED)
        # An out-of-range draft was never a sample of p: recover from q (p row treated as 0).
        # (scalar & vector masks trip the interpreter: fold the row test into the bound)
        p_hi = tl.where(p_ok & valid_j, hi, 0)
    x_removed = tl.where(valid_j, x_j, -1)
    resid_scale = tl.where(valid_j, rho_j, 1.0)
    mass = 0.0
    qmax = 0.0  # > 0 iff q_j has probability mass (a race key of q may underflow; this cannot)
    best_r = -1.0
    best_r_idx = 0
    best_q = -1.0
    best_q_idx = 0
    for s in range(lo, hi, BLOCK_V):
        offs = s + tl.arange(0, BLOCK_V)
        m = offs < hi
        q = q_at(target, q_off + offs, m, temp, q_st, PRECISE)
        if draft[0] is not None:
            p = q_at(draft, p_off + offs, offs < p_hi, temp, p_st, PRECISE)
            if SCALED:
                r = tl.where(valid_j, tl.maximum(rho_j * q - p, 0.0), q)
            else:
                r = tl.maximum(q - p, 0.0)  # p = 0 without a valid draft
        elif SCALED:
            scaled = resid_scale * q
            r = tl.where(offs == x_removed, tl.maximum(scaled - 1.0, 0.0), tl.where(valid_j, scaled, q))
        else:
            r = tl.where(offs == x_removed, 0.0, q)
        mass += tl.sum(r, axis=0)
        qmax = tl.maximum(qmax, tl.max(q, axis=0))
        # one Philox call per vocab pair (s is even): words (0, 1) for even, (2, 3) for odd ids
        pairs = (j << 32) + s // 2 + tl.arange(0, BLOCK_V // 2)
        w0, w1, w2, w3 = random_words(seed, offset, pairs, _STREAM_RECOVER)
        e = tl.interleave(exponential_from_words(w0, w1, PRECISE), exponential_from_words(w2, w3, PRECISE))
        inv = tl.math.div_rn(tl.full(e.shape, _RACE_SCALE, tl.float32), e)  # one division, both races
        best_r, best_r_idx = kc.fold_argmax(tl.where(m, r * inv, -1.0), s, best_r, best_r_idx)
        best_q, best_q_idx = kc.fold_argmax(tl.where(m, q * inv, -1.0), s, best_q, best_q_idx)
    tl.store(parts[0] + slot, mass)
    tl.store(parts[1] + slot, best_r)
    tl.store(parts[2] + slot, best_r_idx.to(tl.int32))  # type: ignore[attr-defined]  # a tensor after the loop
    tl.store(parts[3] + slot, best_q)
    tl.store(parts[4] + slot, best_q_idx.to(tl.int32))  # type: ignore[attr-defined]  # a tensor after the loop
    tl.store(parts[5] + slot, qmax)


@triton.jit
def combine_recovered(parts, slots, blocks, mask):
    """The recovered token from the block partials of one position at ``slots`` (``blocks`` =
    their block numbers, in order): the residual race's winner, q_j's when the residual has no
    mass, -1 when q_j has none. Only slots a pass wrote may be in ``mask``; NaN is masked all
    the same."""
    mass = tl.load(parts[0] + slots, mask=mask, other=0.0)
    mass = tl.sum(tl.where(mass == mass, mass, 0.0), axis=0)
    rkey = tl.load(parts[1] + slots, mask=mask, other=-2.0)
    rkey = tl.where(rkey == rkey, rkey, -2.0)
    ridx = tl.load(parts[2] + slots, mask=mask, other=0).to(tl.int64)
    qkey = tl.load(parts[3] + slots, mask=mask, other=-2.0)
    qkey = tl.where(qkey == qkey, qkey, -2.0)
    qidx = tl.load(parts[4] + slots, mask=mask, other=0).to(tl.int64)
    recovered = tl.where(
        mass <= _MASS_EPS, kc.combine_argmax(qkey, qidx, blocks, 0), kc.combine_argmax(rkey, ridx, blocks, 0)
    )
    qmax = tl.load(parts[5] + slots, mask=mask, other=0.0)
    q_ok = tl.max(tl.where(qmax == qmax, qmax, 0.0), axis=0) > 0.0
    return tl.where(q_ok, recovered, -1)  # q_j without mass: no token


@triton.jit
def greedy_targets(parts, b, pos, blocks, greedy, K, NB, LOGITS: tl.constexpr):
    """(argmax of q_i, q_i has mass) per position from the argmax partials (``parts[6:8]``) of a
    greedy request.

    A row without mass (all-zero q; logits all -inf) has no greedy token: its argmax 0 is never
    accepted, and recovering there emits -1."""
    slots = (b * (K + 1) + pos[:, None]) * NB + blocks[None, :]
    pmask = (pos[:, None] <= tl.where(greedy, K, -1)) & (blocks[None, :] < NB)
    vals = tl.load(parts[6] + slots, mask=pmask, other=float("-inf"))
    vals = tl.where(vals == vals, vals, float("-inf"))  # stale slots of absent rows (never used)
    idxs = tl.load(parts[7] + slots, mask=pmask, other=0).to(tl.int64)
    target_argmax = kc.combine_argmax(vals, idxs, blocks, 1)  # [BLOCK_K]
    if LOGITS:
        row_ok = tl.max(vals, axis=1) > float("-inf")  # partials of the raw logits
    else:
        row_ok = tl.max(vals, axis=1) > 0.0  # partials of q
    return target_argmax, row_ok


@triton.jit
def token_at(pos, j, tokens, ok):
    """tokens[j] where ok[j], else -1 (no token)."""
    return tl.where(at(pos, j, ok.to(tl.int32)) != 0, at(pos, j, tokens), -1)


@triton.jit
def write_row(out_ptr, b, K, pos, j, n, ids, recovered, has_row, bonus, bonus_valid):
    """Output row b ([B, K+1] int64): the accepted drafts, then at j the recovered token (the
    bonus id when every draft was accepted and it is valid; -1 where row j is missing), then -1."""
    fallback = tl.where(has_row, recovered, -1)
    final = tl.where(j < n, recovered, tl.where(bonus_valid, bonus, fallback))
    out = tl.where(pos < j, ids, tl.where(pos == j, final, -1))
    tl.store(out_ptr + b * (K + 1) + pos, out, mask=pos <= K)


@triton.jit
def finish_request(rq, req, seqs, parts, out_ptr, j, pos, x, greedy_token, slot0, NB, BLOCK_NB: tl.constexpr):
    """Combine position j's vocabulary partials (at ``slot0`` + block) into the recovered token
    (``greedy_token`` for greedy requests) and write the output row."""
    b, start, n, K = rq[0], rq[1], rq[2], rq[6]
    target = seqs[0]
    bonus, bonus_valid = bonus_info(req, rq)
    _, has_row = kc.row_offset(b, j, start, n, rq[8], target[1], target[2], req[0] is not None)
    # Position j's partials were written iff a pass was needed; read nothing otherwise (the
    # bound folds the scalar condition into the vector mask).
    need = needs_pass(rq, req, j, has_row)
    blocks = tl.arange(0, BLOCK_NB)
    recovered = combine_recovered(parts, slot0 + blocks, blocks, blocks < tl.where(need, NB, 0))
    recovered = tl.where(request_greedy(req, b), greedy_token, recovered)
    write_row(out_ptr, b, K, pos, j, n, x, recovered, has_row, bonus, bonus_valid)
