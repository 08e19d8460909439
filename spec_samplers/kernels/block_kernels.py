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
   The last of request b's (K+1) * NB programs to finish (an arrival counter:
   :func:`spec_samplers.kernels.common.last_to_arrive`) then finishes the request
   (:func:`block_finish`): sums the mass partials into Z_m, computes the thresholds, the accepted
   length tau (the last m with u_m < h_m), races position tau's group sums (the two-level race
   of :func:`spec_samplers.kernels.verify_kernels.race_recovered`) and writes the row; the
   partials are read in a fixed order, so which program finishes does not change a token.

Cost against token-wise rejection: rejection reads one (q, p) vocabulary row pair per request,
and only when a draft is rejected; block verification with full drafts reads all k_b row pairs
of every random request (k_b times the traffic of a rejected request, plus the k_b exponential
races), because the threshold at every position needs that position's residual mass. With
point-mass drafts both read one q row.

The NamedTuple arguments (seqs, req, parts: :mod:`spec_samplers.kernels.abi`) and the flags
that follow from absent tensors are described in :mod:`spec_samplers.kernels.verify_kernels`;
here ``parts.mass`` holds one partial per (request, position, vocab block), [B, K+1, NB].

``enable_fp_fusion=False`` at launch (``KernelLaunch.options``): rho * q - p must round like the reference's separate
multiply and subtract (an FMA would change the last bit and, rarely, a token).
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.kernels import verify_kernels as vk
from spec_samplers.kernels.abi import Drafts, PassFlags
from spec_samplers.kernels.common import last_to_arrive, row_offset
from spec_samplers.kernels.rng import random_words, uniform_from_words
from spec_samplers.rng import STREAM_ACCEPT

_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)


@triton.jit
def block_scalars(rq, pos, seqs, RAGGED: tl.constexpr, PRECISE: tl.constexpr, BLOCK_K: tl.constexpr):
    """Per-position scalars of request b at ``pos`` (0 .. BLOCK_K-1, BLOCK_K >= K + 1).

    Returns (draft ids (int64), id valid and inside the request, q_m(x_m), rho_m): rho as
    :func:`spec_samplers.reference.running_ratios`, same operations, same order."""
    x, valid, q_x, p_x = vk.gather_at_drafts(rq, pos, seqs, RAGGED, PRECISE)
    ok = valid & (p_x > 0.0)
    ratio = tl.where(ok, tl.math.div_rn(q_x, tl.where(ok, p_x, 1.0)), 0.0)
    rho = tl.full([], 1.0, tl.float32)
    rho_vec = tl.where(pos == 0, 1.0, 0.0)
    for i in range(0, BLOCK_K - 1):
        r = vk.at(pos, i, ratio)
        rho = tl.where(rho > 0.0, tl.minimum(rho * r, 1.0), 0.0)
        rho_vec = tl.where(pos == i + 1, rho, rho_vec)
    return x, valid, q_x, rho_vec


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
@triton.jit(do_not_specialize=["num_rows", "chunk", "NB", "NB_AMAX"])
def block_partials_kernel(
    seqs,
    req,
    parts,
    out_ptr,  # [B, K+1] int64, written by the last program of each request
    arrivals,  # [>= B] int32 arrival counters, 0 at launch (backend.arrival_counters)
    counts,  # [2 + >= K] int64 acceptance counters (VerifyBatch.counters), or None
    K,
    V,
    num_rows,
    chunk,
    NB,
    NB_AMAX,  # vocab blocks of parts.amax_val / amax_idx (greedy): the statistics pass's, for logits
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    TAIL_K: tl.constexpr,
    TAIL_NB: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Program (b, m, blk): position m's partials over vocab block blk, then, in the last of
    request b's (K+1) * NB programs, :func:`block_finish` (TAIL_K >= K + 1, TAIL_NB >= NB and NB_AMAX)."""
    m = tl.program_id(1).to(tl.int64)
    RAGGED: tl.constexpr = req.cu is not None
    rq = vk.open_request(req, K, V, num_rows)
    b = rq.b
    pos = tl.arange(0, BLOCK_K)
    x, valid, q_x, rho_vec = block_scalars(rq, pos, seqs, RAGGED, PRECISE, BLOCK_K)
    _, has_row = row_offset(b, m, rq.start, rq.n, num_rows, seqs.target.stride_b, seqs.target.stride_k, RAGGED)
    need = vk.needs_pass(rq, req, m, has_row)
    if seqs.draft.ptr is None:
        # Point-mass drafts: Z_m = rho_m (1 - q_m(x_m)) from scalars, so tau is known here and
        # only its position needs the vocabulary.
        mass = tl.maximum(rho_vec * (1.0 - q_x), 0.0)
        need = need & (m == block_tau(pos, rq.n, valid, rho_vec, mass, rq.seed, rq.offset))
    if need:
        blk = tl.program_id(2)
        row_slot = b * (K + 1) + m
        drafts = Drafts(pos, x, valid, rho_vec)
        # the flags built inline: Triton 3.6 loses the constexprs of a tuple variable bound in an if
        vk.residual_pass(
            rq,
            m,
            drafts,
            seqs,
            parts,
            row_slot * NB + blk,
            row_slot,
            blk,
            chunk,
            PassFlags(RAGGED, True, PRECISE),
            BLOCK_V,
        )
    if last_to_arrive(arrivals + b, (K + 1) * NB):
        block_finish(seqs, req, parts, out_ptr, counts, K, V, num_rows, NB, NB_AMAX, TAIL_K, TAIL_NB, PRECISE)


@triton.jit
def block_finish(
    seqs,
    req,
    parts,
    out_ptr,
    counts,
    K,
    V,
    num_rows,
    NB,
    NB_AMAX,
    BLOCK_K: tl.constexpr,
    BLOCK_NB: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Finishes request b = program_id(0) from its partials: writes row b of out_ptr [B, K+1] int64
    and adds it to ``counts`` (None: not counted)."""
    RAGGED: tl.constexpr = req.cu is not None
    # greedy requests are possible: T == 0 (logits) or a greedy mask (probabilities)
    MAY_BE_GREEDY: tl.constexpr = (req.temperature is not None) | (req.is_greedy is not None)
    LOGITS: tl.constexpr = req.temperature is not None
    rq = vk.open_request(req, K, V, num_rows)
    b, n = rq.b, rq.n
    pos = tl.arange(0, BLOCK_K)  # positions 0..K (BLOCK_K >= K + 1)
    x, valid, q_x, rho_vec = block_scalars(rq, pos, seqs, RAGGED, PRECISE, BLOCK_K)
    blocks = tl.arange(0, BLOCK_NB)
    greedy = vk.request_greedy(req, b)
    if seqs.draft.ptr is not None:
        # Partials exist where a pass ran: positions with a valid draft of a random request.
        passed = valid & (pos <= tl.where(greedy, -1, K))
        tile = (b * (K + 1) + pos[:, None]) * NB + blocks[None, :]
        tmask = passed[:, None] & (blocks[None, :] < NB)
        mass = tl.sum(tl.load(parts.mass + tile, mask=tmask, other=0.0), axis=1)
    else:
        mass = tl.maximum(rho_vec * (1.0 - q_x), 0.0)
    j = block_tau(pos, n, valid, rho_vec, mass, rq.seed, rq.offset)
    greedy_token = -1
    if MAY_BE_GREEDY:
        target_argmax, row_ok = vk.greedy_targets(parts, b, pos, blocks, greedy, K, NB_AMAX, LOGITS)
        greedy_ok = valid & (x == target_argmax) & row_ok
        j = tl.where(greedy, vk.first_rejection(greedy_ok, pos, n, BLOCK_K), j)
    j = tl.minimum(j, n)  # a malformed ragged request (k_b = -1) emits no token
    if MAY_BE_GREEDY:
        greedy_token = vk.token_at(pos, j, target_argmax, row_ok)
    drafts = Drafts(pos, x, valid, rho_vec)
    # the flags built inline (see block_partials_kernel)
    vk.finish_request(
        rq,
        req,
        seqs,
        parts,
        out_ptr,
        counts,
        j,
        drafts,
        greedy_token,
        b * (K + 1) + j,
        PassFlags(RAGGED, True, PRECISE),
    )
