"""Triton helpers shared by the rejection and block-verification kernels: per-request setup, the
draft-position gather, the vocabulary pass (residual mass and the race-group sums of the
two-level race), the race itself in the finalize and the output row.

Kernel arguments travel in NamedTuples declared in :mod:`spec_samplers.kernels.abi` (Triton
passes them to kernels and jit functions alike) and are read by attribute: ``seqs``
(:class:`~spec_samplers.kernels.abi.Seqs`: target and draft
:class:`~spec_samplers.kernels.abi.Rows`, the draft ids), ``req``
(:class:`~spec_samplers.kernels.abi.Request`), ``parts``
(:class:`~spec_samplers.kernels.abi.VerifyParts`). Absent tensors are None, which Triton
specialises on, so the flags follow from them: RAGGED (``req.cu``), HAS_OFFSETS
(``req.offsets``), LOGITS (``req.temperature``; a row's statistics ``rows.stats``), a greedy mask
(``req.is_greedy``, probabilities only: with temperatures T == 0 marks a greedy request), HAS_DRAFT
(``seqs.draft.ptr``), indexed draft rows (``seqs.draft.row_index``).

Inside a kernel, ``rq`` (:class:`~spec_samplers.kernels.abi.ProgramRequest`, :func:`open_request`)
describes the program's request and the batch's sizes; its ``scale`` is c = log2(e) / T, the
logits rule's scale (1 for probabilities).
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.constants import RESIDUAL_MASS_EPS
from spec_samplers.kernels import common as kc
from spec_samplers.kernels.abi import ProgramRequest, ResidualRow
from spec_samplers.kernels.rng import group_tile, pick_group, race_in_group
from spec_samplers.kernels.softmax_kernels import effective_temperature
from spec_samplers.rng import RACE_GROUP, STREAM_RECOVER

_MASS_EPS = tl.constexpr(RESIDUAL_MASS_EPS)
_STREAM_RECOVER = tl.constexpr(STREAM_RECOVER)
_RACE_GROUP = tl.constexpr(RACE_GROUP)
#: groups per step of the level-1 race in the finalize
_LEVEL1_BLOCK = tl.constexpr(256)


@triton.jit
def open_request(req, K, V, num_rows):
    """``rq`` (:class:`~spec_samplers.kernels.abi.ProgramRequest`) of request b = program_id(0):
    its first flat row, k_b, seed, counter offset and c = log2(e) / T, the logits rule's scale
    (:func:`spec_samplers.kernels.common.logits_scale`, one division per program); seed and
    offset 0 and c = 1 when not given."""
    b = tl.program_id(0)
    start, n = kc.request_span(req.cu, b, K, num_rows, req.cu is not None)
    seed = b.to(tl.int64) * 0
    if req.seeds is not None:
        seed = tl.load(req.seeds + b).to(tl.int64)
    offset = seed * 0
    if req.offsets is not None:
        offset = tl.load(req.offsets + b).to(tl.int64)
    scale = 1.0
    if req.temperature is not None:
        scale = kc.logits_scale(effective_temperature(req.temperature, b))
    return ProgramRequest(b, start, n, seed, offset, scale, K, V, num_rows)


@triton.jit
def request_greedy(req, b):
    """Whether request b is greedy: T == 0 with temperatures (logits), the greedy mask with
    probabilities, else a false scalar tensor."""
    greedy = b < 0
    if req.temperature is not None:
        greedy = tl.load(req.temperature + b) == 0
    elif req.is_greedy is not None:
        greedy = tl.load(req.is_greedy + b) != 0
    return greedy


@triton.jit
def bonus_info(req, rq):
    """(bonus id of the request as given (int64), id in [0, V))."""
    bonus = tl.load(req.bonus + rq.b * req.stride_bonus).to(tl.int64)
    return bonus, (bonus >= 0) & (bonus < rq.V)


@triton.jit
def locate_row(rows, rq, i, RAGGED: tl.constexpr):
    """(element offset of row (b, i) of ``rows`` (:class:`~spec_samplers.kernels.abi.Rows`), row
    exists, its logits-rule constants (m, c, r, cut) from its statistics and c of the request's
    T, or of the rows' own T when they have one: :func:`spec_samplers.kernels.common.row_stats`,
    once per row, never per element). ``i`` a scalar or a vector; statistics outside the row or
    past K are the defaults; indexed rows take their offset from ``rows.row_index``
    (:func:`spec_samplers.kernels.common.indexed_row_offset`)."""
    off, ok = kc.indexed_row_offset(
        rq.b, i, rq.start, rq.n, rq.num_rows, rows.stride_b, rows.stride_k, rows.row_index, rows.num_index_rows, RAGGED
    )
    scale = rq.scale
    if rows.temperature is not None:
        scale = kc.logits_scale(effective_temperature(rows.temperature, rq.b))
    rule = kc.row_stats(rows.stats, rq.b * (rq.K + 1) + i, ok & (i <= rq.K), scale)
    return off, ok, rule


@triton.jit
def q_at(rows, off, mask, rule, PRECISE: tl.constexpr):
    """Cleaned fp32 q at ``off`` of ``rows`` (:func:`spec_samplers.kernels.common.load_q`;
    logits when the rows have statistics, ``rule`` their constants from :func:`locate_row`)."""
    return kc.load_q(rows.ptr, off, mask, rule, rows.stats is not None, PRECISE)


@triton.jit
def gather_at_drafts(rq, pos, seqs, RAGGED: tl.constexpr, PRECISE: tl.constexpr):
    """(draft ids as given (int64), id in [0, V) and inside the request, and for indexed draft
    rows the row's index in range, q_i(x_i), p_i(x_i)) at positions ``pos``; p = 1 for
    point-mass drafts."""
    ids = seqs.ids
    x, valid = kc.draft_ids_at(
        rq.b, pos, rq.start, rq.n, rq.V, rq.num_rows, ids.ptr, ids.stride_b, ids.stride_k, RAGGED
    )
    safe = tl.where(valid, x, 0)
    t_off, t_ok, t_rule = locate_row(seqs.target, rq, pos, RAGGED)
    q_x = q_at(seqs.target, t_off + safe, valid & t_ok, t_rule, PRECISE)
    if seqs.draft.ptr is not None:
        d_off, d_ok, d_rule = locate_row(seqs.draft, rq, pos, RAGGED)
        if seqs.draft.row_index is not None:
            # a draft whose row index is out of range was never a sample of p: rejected, as an
            # out-of-range id (its residual is q)
            valid = valid & d_ok
        p_x = q_at(seqs.draft, d_off + safe, valid & d_ok, d_rule, PRECISE)
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
    return has_row & ((j < rq.n) | (~bonus_valid)) & (~request_greedy(req, rq.b))


@triton.jit
def residual_row(rq, j, drafts, seqs, RAGGED: tl.constexpr):
    """What the residual of position j needs besides the vocabulary
    (:class:`~spec_samplers.kernels.abi.ResidualRow`), from ``drafts``
    (:class:`~spec_samplers.kernels.abi.Drafts`). The draft row is read only where p_keep (it
    exists and x_j is valid: an out-of-range draft was never a sample of p, so the residual is q
    there)."""
    pos = drafts.pos
    x_j = at(pos, j, drafts.ids)
    valid_j = at(pos, j, drafts.valid.to(tl.int32)) != 0
    rho_j = at(pos, j, drafts.rho)
    q_off, _, q_rule = locate_row(seqs.target, rq, j, RAGGED)
    p_off, p_keep, p_rule = q_off, valid_j, q_rule
    if seqs.draft.ptr is not None:
        p_off, p_ok, p_rule = locate_row(seqs.draft, rq, j, RAGGED)
        p_keep = p_ok & valid_j
    return ResidualRow(q_off, q_rule, p_off, p_rule, p_keep, tl.where(valid_j, x_j, -1), valid_j, rho_j)


@triton.jit
def residual_values(rq, rrow, seqs, offs, hi, SCALED: tl.constexpr, PRECISE: tl.constexpr):
    """(residual r, q_j) at vocab entries ``offs`` below ``hi`` (0 elsewhere), fp32.

    The residual without a valid draft x_j (the bonus row, an out-of-range draft) is q_j. With a
    valid draft it is (q_j - p_j)+, or with point-mass drafts q_j without x_j; SCALED (block
    verification) scales q_j by rho_j first: (rho_j q_j - p_j)+, and (rho_j q_j(x_j) - 1)+ at
    x_j."""
    m = offs < hi
    q = q_at(seqs.target, rrow.q_off + offs, m, rrow.q_rule, PRECISE)
    if seqs.draft.ptr is not None:
        # (scalar & vector masks trip the interpreter: fold the row test into the bound)
        p = q_at(seqs.draft, rrow.p_off + offs, offs < tl.where(rrow.p_keep, hi, 0), rrow.p_rule, PRECISE)
        if SCALED:
            r = tl.where(rrow.valid, tl.maximum(rrow.rho * q - p, 0.0), q)
        else:
            r = tl.maximum(q - p, 0.0)  # p = 0 without a valid draft
    elif SCALED:
        scaled = tl.where(rrow.valid, rrow.rho, 1.0) * q
        r = tl.where(offs == rrow.x_removed, tl.maximum(scaled - 1.0, 0.0), tl.where(rrow.valid, scaled, q))
    else:
        r = tl.where(offs == rrow.x_removed, 0.0, q)
    return r, q


@triton.jit
def residual_pass(rq, j, drafts, seqs, parts, slot, row_slot, blk, chunk, FLAGS: tl.constexpr, BLOCK_V: tl.constexpr):
    """One pass over vocab block ``blk`` of ``chunk`` entries (a multiple of RACE_GROUP:
    :func:`spec_samplers.rng.chunk_alignment`) of position j: stores at ``slot`` of
    ``parts.mass`` the block's residual mass (fp32) and, for each race group of the block, the
    fp64 sums of the residual and of q_j (the zero-mass fallback) at ``row_slot * G1 + group``
    of ``parts.r_sums`` / ``parts.q_sums``. No random numbers: the race runs in the finalize
    (:func:`race_recovered`). FLAGS: :class:`~spec_samplers.kernels.abi.PassFlags`."""
    RAGGED: tl.constexpr = FLAGS.RAGGED
    SCALED: tl.constexpr = FLAGS.SCALED
    PRECISE: tl.constexpr = FLAGS.PRECISE
    V = rq.V
    num_groups = (V + _RACE_GROUP - 1) // _RACE_GROUP
    rrow = residual_row(rq, j, drafts, seqs, RAGGED)
    # chunk holds whole race groups: telling the compiler so keeps the bound (hence the masks)
    # aligned, and the loads 128 bits wide
    lo = tl.multiple_of(blk * chunk, _RACE_GROUP)
    hi = tl.minimum(tl.multiple_of(lo + chunk, _RACE_GROUP), V)
    sums_base = row_slot * num_groups
    # the mass accumulates per lane and is reduced once (a cross-warp reduction per step costs
    # more than the step's arithmetic); the group sums are reduced per group, in fp64
    if BLOCK_V >= _RACE_GROUP:
        tile = group_tile(BLOCK_V)  # [BLOCK_V // RACE_GROUP, RACE_GROUP]: one group per row
        mass_acc = tl.zeros(tile.shape, tl.float32)
        for s in range(lo, hi, BLOCK_V):
            r, q = residual_values(rq, rrow, seqs, s + tile, hi, SCALED, PRECISE)
            mass_acc += r
            g = s // _RACE_GROUP + tl.arange(0, BLOCK_V // _RACE_GROUP)
            tl.store(parts.r_sums + sums_base + g, tl.sum(r.to(tl.float64), axis=1), mask=g < num_groups)
            tl.store(parts.q_sums + sums_base + g, tl.sum(q.to(tl.float64), axis=1), mask=g < num_groups)
        mass = tl.sum(tl.sum(mass_acc, axis=1), axis=0)
    else:
        mass_vec = tl.zeros([BLOCK_V], tl.float32)
        for g0 in range(lo, hi, _RACE_GROUP):
            r_acc = tl.zeros([BLOCK_V], tl.float64)
            q_acc = tl.zeros([BLOCK_V], tl.float64)
            for s in range(g0, g0 + _RACE_GROUP, BLOCK_V):
                r, q = residual_values(rq, rrow, seqs, s + tl.arange(0, BLOCK_V), hi, SCALED, PRECISE)
                mass_vec += r
                r_acc += r.to(tl.float64)
                q_acc += q.to(tl.float64)
            tl.store(parts.r_sums + sums_base + g0 // _RACE_GROUP, tl.sum(r_acc, axis=0))
            tl.store(parts.q_sums + sums_base + g0 // _RACE_GROUP, tl.sum(q_acc, axis=0))
        mass = tl.sum(mass_vec, axis=0)
    tl.store(parts.mass + slot, mass)


@triton.jit
def race_recovered(rq, j, drafts, seqs, parts, row_slot, need, FLAGS: tl.constexpr):
    """The recovered token of position j (:func:`spec_samplers.reference._recover`): the
    two-level race over the residual's group sums (those of q_j when the residual's fp64 mass is
    <= RESIDUAL_MASS_EPS), then over the chosen group, re-read; -1 when q_j has no mass or no
    pass ran (``need`` false: nothing is read)."""
    RAGGED: tl.constexpr = FLAGS.RAGGED
    SCALED: tl.constexpr = FLAGS.SCALED
    PRECISE: tl.constexpr = FLAGS.PRECISE
    V = rq.V
    num_groups = (V + _RACE_GROUP - 1) // _RACE_GROUP
    base = j.to(tl.int64) << 32
    row = row_slot * num_groups
    g_r, g_q, mass_r, mass_q = pick_group(
        parts.r_sums + row,
        parts.q_sums + row,
        num_groups,
        need,
        rq.seed,
        rq.offset,
        base,
        _STREAM_RECOVER,
        PRECISE,
        _LEVEL1_BLOCK,
    )
    no_mass = mass_r <= _MASS_EPS
    group = tl.where(no_mass, g_q, g_r)
    rrow = residual_row(rq, j, drafts, seqs, RAGGED)
    offs = group * _RACE_GROUP + tl.arange(0, _RACE_GROUP)
    r, q = residual_values(rq, rrow, seqs, offs, tl.where(need, V, 0), SCALED, PRECISE)
    w = tl.where(no_mass, q, r)
    token = group * _RACE_GROUP + race_in_group(w, offs < V, rq.seed, rq.offset, base, _STREAM_RECOVER, PRECISE)
    return tl.where(need & (mass_q > 0.0), token, -1)


@triton.jit
def greedy_targets(parts, b, pos, blocks, greedy, K, NB, LOGITS: tl.constexpr):
    """(argmax of q_i, q_i has mass) per position from the argmax partials (``parts.amax_val``,
    ``parts.amax_idx``) of a greedy request.

    A row without mass (all-zero q; logits all -inf) has no greedy token: its argmax 0 is never
    accepted, and recovering there emits -1."""
    slots = (b * (K + 1) + pos[:, None]) * NB + blocks[None, :]
    pmask = (pos[:, None] <= tl.where(greedy, K, -1)) & (blocks[None, :] < NB)
    vals = tl.load(parts.amax_val + slots, mask=pmask, other=float("-inf"))
    vals = tl.where(vals == vals, vals, float("-inf"))  # stale slots of absent rows (never used)
    idxs = tl.load(parts.amax_idx + slots, mask=pmask, other=0).to(tl.int64)
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
    return out


@triton.jit
def count_row(counts, out, pos, K):
    """Adds output row ``out`` (positions ``pos``, 0..K valid) to the sampler's counters ``counts``
    [2 + >= K] int64 (``VerifyBatch.counters``): [0] accepted drafts (slots 1..K holding a token),
    [1] emitted tokens, [2 + i] draft i accepted (slot i + 1 holds a token). What
    ``SpecDecodeBaseSampler._update_counters`` derives from the output, as atomics (exact in any
    order): no eager op per call."""
    emitted = (out != -1) & (pos <= K)
    accepted = emitted & (pos >= 1)
    tl.atomic_add(counts, tl.sum(accepted.to(tl.int64), axis=0))
    tl.atomic_add(counts + 1, tl.sum(emitted.to(tl.int64), axis=0))
    tl.atomic_add(counts + 1 + pos, accepted.to(tl.int64), mask=accepted)


@triton.jit
def finish_request(rq, req, seqs, parts, out_ptr, counts, j, drafts, greedy_token, row_slot, FLAGS: tl.constexpr):
    """Race position j's group sums (at ``row_slot``) into the recovered token (``greedy_token``
    for greedy requests), write the output row (``drafts``: :class:`~spec_samplers.kernels.abi.Drafts`)
    and add it to ``counts`` (:func:`count_row`; None: not counted)."""
    target = seqs.target
    bonus, bonus_valid = bonus_info(req, rq)
    _, has_row = kc.row_offset(
        rq.b, j, rq.start, rq.n, rq.num_rows, target.stride_b, target.stride_k, req.cu is not None
    )
    # Position j's sums were written iff a pass was needed; read nothing otherwise.
    need = needs_pass(rq, req, j, has_row)
    recovered = race_recovered(rq, j, drafts, seqs, parts, row_slot, need, FLAGS)
    recovered = tl.where(request_greedy(req, rq.b), greedy_token, recovered)
    out = write_row(out_ptr, rq.b, rq.K, drafts.pos, j, rq.n, drafts.ids, recovered, has_row, bonus, bonus_valid)
    if counts is not None:
        count_row(counts, out, drafts.pos, rq.K)
