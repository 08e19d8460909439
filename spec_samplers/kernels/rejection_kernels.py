"""Triton kernels of lossless rejection sampling (docs/design.md section 3), both layouts.

Fixed grids (CUDA-graph friendly, no host synchronisation):

1. ``argmax_partials_kernel`` grid (B, K+1, NB), only when greedy rows may exist: per vocab block,
   (max, argmax) of q_i for every position of greedy requests (random requests exit at once).
2. ``residual_partials_kernel`` grid (B, NB): each program finds its request's first rejected
   position j from gathered scalars, then reads its vocab block of q_j (and p_j) once, storing
   the fp64 race-group sums of the residual (q_j - p_j)+ and of q_j (the zero-mass fallback).
   No random numbers are drawn there. Requests that accept everything (with a valid bonus id),
   and greedy requests, exit without reading the vocabulary. The last of a request's NB
   programs to finish (an arrival counter: :func:`spec_samplers.kernels.common.last_to_arrive`)
   then finishes the request (:func:`finish`): recomputes j, runs the two-level race
   (:func:`spec_samplers.kernels.verify_kernels.race_recovered`: level 1 over the group sums,
   level 2 over the one chosen group, re-read) and writes the output row.

NB vocab blocks per request keep the GPU busy at B = 1. The request is finished in the same
launch (one CUDA-graph node fewer than a separate finalize kernel); whichever program finishes
it reads the partials in the same fixed order, so results do not depend on scheduling. The
NamedTuple arguments (seqs, req, parts: :mod:`spec_samplers.kernels.abi`) and the flags that
follow from absent tensors are described in :mod:`spec_samplers.kernels.verify_kernels`; here
``parts.mass`` holds one partial per (request, vocab block), [B, NB].
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.kernels import verify_kernels as vk
from spec_samplers.kernels.abi import Drafts, PassFlags
from spec_samplers.kernels.common import clean, fold_argmax, last_to_arrive, request_span, row_offset
from spec_samplers.kernels.rng import random_words, uniform_from_words
from spec_samplers.rng import STREAM_ACCEPT

_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)


@triton.jit
def random_accepts(rq, pos, seqs, RAGGED: tl.constexpr, PRECISE: tl.constexpr):
    """Accept test of the random rule at positions ``pos`` from gathered scalars only.

    Returns (accepted, draft ids as given (int64), id in [0, V) and inside the request)."""
    x, valid, q_x, p_x = vk.gather_at_drafts(rq, pos, seqs, RAGGED, PRECISE)
    w0, w1, _, _ = random_words(rq.seed, rq.offset, pos, _STREAM_ACCEPT)
    # u < q/p (as the reference): q >= p always accepts, subnormal p included
    ratio = tl.math.div_rn(q_x, tl.where(p_x > 0.0, p_x, 1.0))
    accepted = valid & (p_x > 0.0) & (uniform_from_words(w0, w1) < ratio)
    return accepted, x, valid


# num_rows (T), chunk and NB follow the batch size, which changes every engine step: left
# unspecialised so that a new batch size reuses the compiled variant.
@triton.jit(do_not_specialize=["num_rows", "chunk", "NB"])
def argmax_partials_kernel(target, req, parts, K, V, num_rows, chunk, NB, BLOCK_V: tl.constexpr):
    """Program (b, i, blk): (max, argmax) of q_i over vocab block blk of a greedy request into
    ``parts.amax_val`` / ``parts.amax_idx`` ([B, K+1, NB] fp32 / int32); ``target``: probability
    rows (:class:`~spec_samplers.kernels.abi.Rows`, no statistics)."""
    RAGGED: tl.constexpr = req.cu is not None
    b = tl.program_id(0)
    i = tl.program_id(1)
    blk = tl.program_id(2)
    start, n = request_span(req.cu, b, K, num_rows, RAGGED)
    off, ok = row_offset(b, i, start, n, num_rows, target.stride_b, target.stride_k, RAGGED)
    if vk.request_greedy(req, b) & ok:
        lo = blk * chunk
        hi = tl.minimum(lo + chunk, V)
        best = -1.0
        best_idx = lo
        for s in range(lo, hi, BLOCK_V):
            offs = s + tl.arange(0, BLOCK_V)
            m = offs < hi
            vals = tl.where(m, clean(tl.load(target.ptr + off + offs, mask=m, other=0.0)), -1.0)
            best, best_idx = fold_argmax(vals, s, best, best_idx)
        slot = (b * (K + 1) + i) * NB + blk
        tl.store(parts.amax_val + slot, best)
        tl.store(parts.amax_idx + slot, best_idx.to(tl.int32))


# num_rows (T), chunk and NB follow the batch size: left unspecialised (as above).
@triton.jit(do_not_specialize=["num_rows", "chunk", "NB", "NB_AMAX"])
def residual_partials_kernel(
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
    """Program (b, blk): the residual partials of vocab block blk, then, in the last of request
    b's NB programs, :func:`finish` (TAIL_K >= K + 1, TAIL_NB >= NB and NB_AMAX: its tile)."""
    RAGGED: tl.constexpr = req.cu is not None
    rq = vk.open_request(req, K, V, num_rows)
    b = rq.b
    pos = tl.arange(0, BLOCK_K)
    accepted, x, valid = random_accepts(rq, pos, seqs, RAGGED, PRECISE)
    j = vk.first_rejection(accepted, pos, rq.n, BLOCK_K)
    _, has_row = row_offset(b, j, rq.start, rq.n, num_rows, seqs.target.stride_b, seqs.target.stride_k, RAGGED)
    if vk.needs_pass(rq, req, j, has_row):
        blk = tl.program_id(1)
        drafts = Drafts(pos, x, valid, 1.0)  # no rho: the residual is not scaled
        vk.residual_pass(
            rq, j, drafts, seqs, parts, b * NB + blk, b, blk, chunk, PassFlags(RAGGED, False, PRECISE), BLOCK_V
        )
    if last_to_arrive(arrivals + b, NB):
        finish(seqs, req, parts, out_ptr, counts, K, V, num_rows, NB, NB_AMAX, TAIL_K, TAIL_NB, PRECISE)


@triton.jit
def finish(
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
    b = rq.b
    pos = tl.arange(0, BLOCK_K)  # positions 0..K (BLOCK_K >= K + 1)
    accepted, x, valid = random_accepts(rq, pos, seqs, RAGGED, PRECISE)
    greedy_token = -1
    if MAY_BE_GREEDY:
        greedy = vk.request_greedy(req, b)
        blocks = tl.arange(0, BLOCK_NB)
        target_argmax, row_ok = vk.greedy_targets(parts, b, pos, blocks, greedy, K, NB_AMAX, LOGITS)
        accepted = tl.where(greedy, valid & (x == target_argmax) & row_ok, accepted)
    j = vk.first_rejection(accepted, pos, rq.n, BLOCK_K)
    if MAY_BE_GREEDY:
        greedy_token = vk.token_at(pos, j, target_argmax, row_ok)
    drafts = Drafts(pos, x, valid, 1.0)
    flags = PassFlags(RAGGED, False, PRECISE)
    vk.finish_request(rq, req, seqs, parts, out_ptr, counts, j, drafts, greedy_token, b, flags)
