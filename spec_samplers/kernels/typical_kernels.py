"""Triton kernels of typical acceptance (Medusa section 3.3.1, vLLM V0 semantics), both layouts.

``typical_partials_kernel`` grid (B, K+1, NB): ONE pass over each target row's vocab block gives
the partial entropy sum q log(q + eps) and the partial (max, argmax). The last of a request's
(K+1) NB programs to finish (an arrival counter: :func:`spec_samplers.kernels.common.last_to_arrive`,
as the rejection kernel) then finishes the request (:func:`finish`): combines the NB partials per
position in a fixed order (whichever program finishes, the same result), applies the threshold
test to the gathered q_i(x_i), finds the first rejection and writes the output row. One launch:
no separate finalize kernel.

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
from spec_samplers.kernels import verify_kernels as vk
from spec_samplers.kernels.common import combine_argmax, fold_argmax, last_to_arrive
from spec_samplers.kernels.rng import precise_exp, precise_log

# fp32-representable, so every route into float64 (literal, fp32 constant) gives the same value
_ENTROPY_EPS = tl.constexpr(ENTROPY_EPS_FP32)


# num_rows (T), chunk and NB follow the batch size, which changes every engine step: left
# unspecialised so that a new batch size reuses the compiled variant.
@triton.jit(do_not_specialize=["num_rows", "chunk", "NB"])
def typical_partials_kernel(
    seqs,
    req,
    parts,
    out_ptr,  # [B, K+1] int64, written by the last program of each request
    arrivals,  # [>= B] int32 arrival counters, 0 at launch (backend.arrival_counters)
    counts,  # [2 + >= K] int64 acceptance counters (VerifyBatch.counters), or None
    posterior,
    K,
    V,
    num_rows,
    chunk,
    NB,
    BLOCK_V: tl.constexpr,
    TAIL_K: tl.constexpr,
    TAIL_NB: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Program (b, i, blk): vocab block blk of target row (b, i) into ``parts`` (entropy fp64,
    max fp32, argmax int32; [B, K+1, NB] each: :class:`~spec_samplers.kernels.abi.TypicalParts`),
    then, in the last of request b's (K+1) NB programs, :func:`finish` (TAIL_K >= K + 1,
    TAIL_NB >= NB: its tile)."""
    target = seqs.target
    i = tl.program_id(1)
    blk = tl.program_id(2)
    rq = vk.open_request(req, K, V, num_rows)
    b = rq.b
    off, ok, rule = vk.locate_row(target, rq, i, req.cu is not None)
    if req.temperature is not None:
        ok = ok & (tl.load(req.temperature + b) != 0)  # greedy requests: one-hot q, done in finalize
    if ok:
        lo = blk * chunk
        hi = tl.minimum(lo + chunk, V)
        ent = tl.full([], 0.0, tl.float64)
        best = -1.0
        best_idx = lo
        for s in range(lo, hi, BLOCK_V):
            offs = s + tl.arange(0, BLOCK_V)
            m = offs < hi
            q = vk.q_at(target, off + offs, m, rule, PRECISE)
            # float64 terms and sum (as reference.typical_accepts): the blocked order then moves
            # the entropy by ~1e-16 relative instead of fp32's ~1e-7, so decisions match torch's
            q64 = q.to(tl.float64)
            ent += tl.sum(q64 * precise_log(q64 + _ENTROPY_EPS, PRECISE), axis=0)
            vals = tl.where(m, q, -1.0)
            best, best_idx = fold_argmax(vals, s, best, best_idx)
        slot = (b * (K + 1) + i) * NB + blk
        tl.store(parts.entropy + slot, ent)
        tl.store(parts.max + slot, best)
        tl.store(parts.argmax + slot, best_idx.to(tl.int32))
    if last_to_arrive(arrivals + b, (K + 1) * NB):
        finish(seqs, req, parts, out_ptr, counts, posterior, K, V, num_rows, NB, TAIL_K, TAIL_NB, PRECISE)


@triton.jit
def _combined(val_ptr, idx_ptr, slots, mask, blocks, other):
    """(argmax, max) per position of the (max, argmax) block partials at ``slots``."""
    vals = tl.load(val_ptr + slots, mask=mask, other=other)
    idxs = tl.load(idx_ptr + slots, mask=mask, other=0).to(tl.int64)
    return combine_argmax(vals, idxs, blocks, 1), tl.max(vals, axis=1)


@triton.jit
def finish(
    seqs,
    req,
    parts,
    out_ptr,
    counts,
    posterior,
    K,
    V,
    num_rows,
    NB,
    BLOCK_K: tl.constexpr,
    BLOCK_NB: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Finishes request b = program_id(0). ``parts``: typical_partials_kernel's, and the logits
    argmax partials (greedy requests; LOGITS only); ``posterior``: (threshold, alpha), fp32
    values (the plan rounds them); writes out_ptr [B, K+1] int64 and adds it to ``counts``
    (None: not counted)."""
    temp_ptr = req.temperature
    RAGGED: tl.constexpr = req.cu is not None
    rq = vk.open_request(req, K, V, num_rows)
    b, n = rq.b, rq.n
    pos = tl.arange(0, BLOCK_K)  # positions 0..K
    blocks = tl.arange(0, BLOCK_NB)
    ids, valid, candidate, _ = vk.gather_at_drafts(rq, pos, seqs, RAGGED, PRECISE)
    _, t_ok, _ = vk.locate_row(seqs.target, rq, pos, RAGGED)
    t_ok = t_ok & (pos <= K)
    slots = (b * (K + 1) + pos[:, None]) * NB + blocks[None, :]
    greedy = b < 0
    if temp_ptr is not None:
        greedy = tl.load(temp_ptr + b) == 0
    pmask = t_ok[:, None] & (blocks[None, :] < tl.where(greedy, 0, NB))
    ent = tl.load(parts.entropy + slots, mask=pmask, other=0.0)
    entropy = -tl.sum(ent, axis=1)  # [BLOCK_K] fp64
    target_argmax, row_max = _combined(parts.max, parts.argmax, slots, pmask, blocks, -2.0)
    row_ok = row_max > 0.0  # q has mass (else the argmax 0 has probability 0)
    if temp_ptr is not None:
        # Greedy requests: q is the one-hot of the logits' argmax (reference.probs_from_logits),
        # the zero row when every logit is -inf.
        gmask = t_ok[:, None] & (blocks[None, :] < tl.where(greedy, NB, 0))
        logit_argmax, logit_max = _combined(parts.logit_max, parts.logit_argmax, slots, gmask, blocks, float("-inf"))
        logit_ok = logit_max > float("-inf")
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
    threshold = tl.minimum((zero64 + posterior.alpha) * precise_exp(-entropy, PRECISE), zero64 + posterior.threshold)
    accepted = valid & (candidate.to(tl.float64) > threshold)
    j = vk.first_rejection(accepted, pos, n, BLOCK_K)
    recovered = vk.token_at(pos, j, target_argmax, row_ok)
    bonus, bonus_valid = vk.bonus_info(req, rq)
    has_row = vk.at(pos, j, t_ok.to(tl.int32)) != 0
    out = vk.write_row(out_ptr, b, K, pos, j, n, ids, recovered, has_row, bonus, bonus_valid)
    if counts is not None:
        vk.count_row(counts, out, pos, K)
