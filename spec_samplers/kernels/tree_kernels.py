"""Triton kernels of tree verification: recursive rejection sampling (twin of
:func:`spec_samplers.tree.reference.rejection_tree_walk`, operation for operation) and Medusa's
typical tree rule (``typical_tree_kernel``, twin of ``typical_tree_reference``).

Grid (B,): one program walks one request's tree. Nodes are visited in index order (parents come
first); node j is tried iff its parent is the current node. The residual r of the current node
lives in the target row while no child has been rejected ("fresh"), then in a [B, 2, V] fp32
scratch, ping-ponged so that a residual whose mass vanished (<= RESIDUAL_MASS_EPS) can be kept.
Each tried child costs gathered scalars; a rejected one one vocabulary pass (the new residual and
its float64 mass); an accepted one none (greedy rows: one argmax pass at the new node). At the
end the program writes the stop node, the residual there, whether its target row has mass and
its argmax; the launcher draws the final token from that residual with the package's race
(:func:`spec_samplers.output.final_draw`), so the draw follows the one rule of rng.py.
Logits inputs (``temp_ptr`` given) are read through the softmax rule of
:func:`spec_samplers.torch_ops.probs_from_logits`, with each visited row's statistics computed on
entering its node (two vocabulary passes), so no probability tensor is written.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.constants import ENTROPY_EPS_FP32, RESIDUAL_MASS_EPS
from spec_samplers.kernels import common as kc
from spec_samplers.kernels.rng import precise_exp, precise_log, random_words, uniform_from_words
from spec_samplers.rng import STREAM_ACCEPT

_MASS_EPS = tl.constexpr(RESIDUAL_MASS_EPS)
_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)
_ENTROPY_EPS = tl.constexpr(ENTROPY_EPS_FP32)
#: POLICY values
INDEPENDENT = 0
WITHOUT_REPLACEMENT = 1
POINT_MASS = 2


@triton.jit
def _logit_stats(ptr, off, ok, temp, V, BLOCK_V: tl.constexpr, PRECISE: tl.constexpr):
    """(m, c, r, cut, argmax, T) of a logits row: the rule constants of torch_ops.probs_from_logits's
    rule (:func:`spec_samplers.kernels.common.logits_rule`, cut = 0: NaN logits -inf; q = e * r with
    e = exp((x - max) / T) and r = 1 / sum, T <= 0 or NaN counting as 1), the argmax of the
    logits and T as given (T == 0: the one-hot of the argmax). The sum is accumulated in float64
    and rounded once."""
    hi = tl.where(ok, V, 0)
    best = float("-inf")
    best_idx = 0
    for s in range(0, V, BLOCK_V):
        offs = s + tl.arange(0, BLOCK_V)
        m = offs < hi
        x = tl.load(ptr + off + offs, mask=m, other=float("-inf")).to(tl.float32)
        x = tl.where(m & (x == x), x, float("-inf"))
        best, best_idx = kc.fold_argmax(x, s, best, best_idx)
    t = tl.where(temp > 0, temp, 1.0)
    m_rule = kc.rule_max(best)
    c = kc.logits_scale(t)
    total = tl.zeros([], tl.float64)
    for s in range(0, V, BLOCK_V):
        offs = s + tl.arange(0, BLOCK_V)
        m = offs < hi
        x = tl.load(ptr + off + offs, mask=m, other=float("-inf")).to(tl.float32)
        x = tl.where(m & (x == x), x, float("-inf"))
        total += tl.sum(kc.weights(x, m_rule, c, PRECISE).to(tl.float64), 0)
    m_rule, c, r, cut = kc.logits_rule(best, t, total.to(tl.float32), 0.0)
    return m_rule, c, r, cut, best_idx.to(tl.int64), temp  # type: ignore[attr-defined]


@triton.jit
def _load(ptr, off, offs, mask, st, LOGITS: tl.constexpr, PRECISE: tl.constexpr):
    """Cleaned fp32 probabilities at ``offs`` of the row at ``off``: as stored, or (LOGITS) from
    the logits with the row's ``st`` = (m, c, r, cut, argmax, T) of :func:`_logit_stats`
    (:func:`spec_samplers.kernels.common.load_q`; T == 0: the one-hot of the argmax, zero
    without mass)."""
    if LOGITS:
        m_rule, c, r, cut, argmax, temp = st
        q = kc.load_q(ptr + off, offs, mask, (m_rule, c, r, cut), True, PRECISE)
        one_hot = tl.where(offs == argmax, 1.0, 0.0)
        return tl.where(mask, tl.where(temp == 0, tl.where(r > 0.0, one_hot, 0.0), q), 0.0)
    else:
        return kc.clean(tl.load(ptr + off + offs, mask=mask, other=0.0))


@triton.jit
def _row_argmax(ptr, row_off, ok, V, st, LOGITS: tl.constexpr, PRECISE: tl.constexpr, BLOCK_V: tl.constexpr):
    """(argmax, max) of the row's probabilities (ties: lowest index); (0, 0) when not ok."""
    best = -1.0
    best_idx = 0
    hi = tl.where(ok, V, 0)
    for s in range(0, V, BLOCK_V):
        offs = s + tl.arange(0, BLOCK_V)
        m = offs < hi
        q = tl.where(m, _load(ptr, row_off, offs, m, st, LOGITS, PRECISE), -1.0)
        best, best_idx = kc.fold_argmax(q, s, best, best_idx)
    return best_idx.to(tl.int64), tl.maximum(best, 0.0)  # type: ignore[attr-defined]


@triton.jit
def _residual(t_ptr, t_off, s_ptr, s_off, fresh, offs, m, st, LOGITS: tl.constexpr, PRECISE: tl.constexpr):
    """The current residual at ``offs``: the target row while fresh, else the scratch slot."""
    from_target = _load(t_ptr, t_off, offs, kc.mask_if(fresh != 0, m), st, LOGITS, PRECISE)
    from_scratch = tl.load(s_ptr + s_off + offs, mask=kc.mask_if(fresh == 0, m), other=0.0)
    return tl.where(fresh != 0, from_target, from_scratch)


@triton.jit
def rejection_tree_kernel(
    target_ptr,  # [R, V] fp32/fp16/bf16, vocab stride 1
    stride_t,
    draft_ptr,  # [R', V] or None (point-mass drafts)
    stride_d,
    rows_ptr,  # [B, N+1] int64 target row of node j (-1: none)
    drows_ptr,  # [B, N+1] int64 draft row of node j
    tokens_ptr,  # [B, N] int64
    parents_ptr,  # [B, N] int64, cleaned
    depth_ptr,  # [B, N+1] int64
    seed_ptr,  # [B] int64
    offset_ptr,  # [B] int64
    greedy_ptr,  # [B] bool or None
    scratch_ptr,  # [B, 2, V] fp32
    resid_ptr,  # [B, V] fp32 out: the residual at the stop node
    stop_ptr,  # [B] int64 out
    qok_ptr,  # [B] int8 out: the stop node's target row has mass
    amax_ptr,  # [B] int64 out: its argmax
    temp_ptr,  # [R] fp32 temperature of each flat row (0: greedy), or None: the rows hold probabilities
    N,
    V,
    max_depth,
    POLICY: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    LOGITS: tl.constexpr = temp_ptr is not None
    b = tl.program_id(0).to(tl.int64)
    seed = tl.load(seed_ptr + b)
    offset = tl.load(offset_ptr + b)
    greedy = 0
    if greedy_ptr is not None:
        greedy = tl.load(greedy_ptr + b).to(tl.int32)
    root_row = tl.load(rows_ptr + b * (N + 1))
    alive = root_row >= 0
    cur = tl.where(alive, 0, -1).to(tl.int64)
    t_off = tl.maximum(root_row, 0) * stride_t
    t_st = (0.0, 1.0, 1.0, 0.0, (b * 0).to(tl.int64), 1.0)  # logits rule constants of the current target row
    d_st = (0.0, 1.0, 1.0, 0.0, (b * 0).to(tl.int64), 1.0)  # and of its draft row
    d_row0 = tl.load(drows_ptr + b * (N + 1))
    if LOGITS:
        temp = tl.load(temp_ptr + tl.maximum(root_row, 0))
        t_st = _logit_stats(target_ptr, t_off, alive, temp, V, BLOCK_V, PRECISE)
        if POLICY != 2:
            d_st = _logit_stats(draft_ptr, tl.maximum(d_row0, 0) * stride_d, d_row0 >= 0, temp, V, BLOCK_V, PRECISE)
    s_base = b * 2 * V
    slot = 0
    fresh = 1
    z = 1.0
    removed = 0.0
    q_argmax = (b * 0).to(tl.int64)
    if greedy != 0:
        q_argmax, root_max = _row_argmax(target_ptr, t_off, alive, V, t_st, LOGITS, PRECISE, BLOCK_V)
    for j in range(1, N + 1):
        par = tl.load(parents_ptr + b * N + j - 1)
        dj = tl.load(depth_ptr + b * (N + 1) + j)
        if (par == cur) & (dj >= 1) & (dj <= max_depth):
            tok_raw = tl.load(tokens_ptr + b * N + j - 1)
            valid = (tok_raw >= 0) & (tok_raw < V)
            tok = tl.where(valid, tok_raw, 0)
            s_off = s_base + slot * V
            one = tok + tl.arange(0, 1)
            one_m = kc.mask_if(valid, one >= 0)  # a block mask (kc.mask_if)
            r_c = tl.sum(_residual(target_ptr, t_off, scratch_ptr, s_off, fresh, one, one_m, t_st, LOGITS, PRECISE), 0)
            d_row = tl.load(drows_ptr + b * (N + 1) + cur)
            p_c = 1.0
            if POLICY != 2:
                d_off = tl.maximum(d_row, 0) * stride_d
                p_c = tl.sum(_load(draft_ptr, d_off, one, kc.mask_if(d_row >= 0, one_m), d_st, LOGITS, PRECISE), 0)
            p_drawn = p_c
            rem = 1.0
            if POLICY == 1:
                rem = 1.0 - removed
            p_c = tl.where(rem > 0, tl.math.div_rn(p_c, tl.where(rem > 0, rem, 1.0)), 0.0)
            ok = valid & (p_c > 0)
            w0, w1, w2, w3 = random_words(seed, offset, j - 1 + (b * 0), _STREAM_ACCEPT)
            u = uniform_from_words(w0, w1)
            accept = ok & (u < tl.math.div_rn(r_c, tl.where(ok, z * p_c, 1.0)))
            if greedy != 0:
                accept = valid & (tok == q_argmax) & (r_c > 0)
            if accept:
                cur = j + (b * 0)
                row_j = tl.load(rows_ptr + b * (N + 1) + j)
                t_off = tl.maximum(row_j, 0) * stride_t
                fresh = 1
                z = 1.0
                removed = 0.0
                if LOGITS:
                    temp = tl.load(temp_ptr + tl.maximum(row_j, 0))
                    t_st = _logit_stats(target_ptr, t_off, row_j >= 0, temp, V, BLOCK_V, PRECISE)
                    if POLICY != 2:
                        d_row_j = tl.load(drows_ptr + b * (N + 1) + j)
                        d_off_j = tl.maximum(d_row_j, 0) * stride_d
                        d_st = _logit_stats(draft_ptr, d_off_j, d_row_j >= 0, temp, V, BLOCK_V, PRECISE)
                if greedy != 0:
                    q_argmax, node_max = _row_argmax(target_ptr, t_off, row_j >= 0, V, t_st, LOGITS, PRECISE, BLOCK_V)
            elif ok & (greedy == 0):
                # r' = (r / z - p / rem)+ (point mass: r / z), 0 at the rejected token, into the other slot
                n_off = s_base + (1 - slot) * V
                mass = (b * 0).to(tl.float64)
                d_off = tl.maximum(d_row, 0) * stride_d
                for s in range(0, V, BLOCK_V):
                    offs = s + tl.arange(0, BLOCK_V)
                    m = offs < V
                    r = _residual(target_ptr, t_off, scratch_ptr, s_off, fresh, offs, m, t_st, LOGITS, PRECISE)
                    r = tl.math.div_rn(r, z)
                    if POLICY != 2:
                        p = _load(draft_ptr, d_off, offs, kc.mask_if(d_row >= 0, m), d_st, LOGITS, PRECISE)
                        r = tl.maximum(r - tl.math.div_rn(p, rem), 0.0)
                    r = tl.where(offs == tok, 0.0, r)
                    tl.store(scratch_ptr + n_off + offs, r, mask=m)
                    mass += tl.sum(tl.where(m, r, 0.0).to(tl.float64), 0)
                new_z = mass.to(tl.float32)
                if new_z > _MASS_EPS:
                    slot = 1 - slot
                    fresh = 0
                    z = new_z
                if POLICY == 1:
                    removed = removed + p_drawn
    # the stop node: its residual, whether its target row has mass, its argmax
    stop_row = tl.load(rows_ptr + b * (N + 1) + tl.maximum(cur, 0))
    amax, qmax = _row_argmax(target_ptr, t_off, alive & (stop_row >= 0), V, t_st, LOGITS, PRECISE, BLOCK_V)
    s_off = s_base + slot * V
    for s in range(0, V, BLOCK_V):
        offs = s + tl.arange(0, BLOCK_V)
        m = offs < V
        r = _residual(target_ptr, t_off, scratch_ptr, s_off, fresh, offs, m, t_st, LOGITS, PRECISE)
        tl.store(resid_ptr + b * V + offs, r, mask=m)
    tl.store(stop_ptr + b, cur)
    tl.store(qok_ptr + b, (qmax > 0).to(tl.int8))
    tl.store(amax_ptr + b, amax)


@triton.jit
def typical_tree_kernel(
    target_ptr,  # [R, V] fp32/fp16/bf16, vocab stride 1
    stride_t,
    rows_ptr,  # [B, N+1] int64 target row of node j (-1: none)
    tokens_ptr,  # [B, N] int64
    parents_ptr,  # [B, N] int64, cleaned
    depth_ptr,  # [B, N+1] int64
    thr_ptr,  # [B, N+1] fp64 scratch: typical threshold of each node's row
    amax_ptr,  # [B, N+1] int64 scratch: argmax of each node's row
    rowok_ptr,  # [B, N+1] int8 scratch: the row has mass
    pass_ptr,  # [B, N+1] int8 scratch: the node's whole path passes
    stop_ptr,  # [B] int64 out: the deepest passing node (lowest index on ties), -1: none
    final_ptr,  # [B] int64 out: argmax of its row (-1: no mass)
    posterior_threshold,  # fp32 value
    posterior_alpha,  # fp32 value
    N,
    V,
    max_depth,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Medusa's tree rule (:func:`spec_samplers.tree.reference.typical_tree_reference`): one
    vocabulary pass per node row (float64 entropy, argmax), then the path tests on gathered
    scalars. Grid (B,)."""
    b = tl.program_id(0).to(tl.int64)
    base = b * (N + 1)
    for u in range(0, N + 1):
        row = tl.load(rows_ptr + base + u)
        off = tl.maximum(row, 0) * stride_t
        hi = tl.where(row >= 0, V, 0)
        ent = tl.full([], 0.0, tl.float64)
        best = -1.0
        best_idx = 0
        for s in range(0, V, BLOCK_V):
            offs = s + tl.arange(0, BLOCK_V)
            m = offs < hi
            q = kc.clean(tl.load(target_ptr + off + offs, mask=m, other=0.0))
            q64 = q.to(tl.float64)
            ent += tl.sum(q64 * precise_log(q64 + _ENTROPY_EPS, PRECISE), axis=0)
            best, best_idx = kc.fold_argmax(tl.where(m, q, -1.0), s, best, best_idx)
        zero64 = tl.zeros([], tl.float64)
        thr = tl.minimum((zero64 + posterior_alpha) * precise_exp(ent, PRECISE), zero64 + posterior_threshold)
        tl.store(thr_ptr + base + u, thr)
        tl.store(amax_ptr + base + u, best_idx.to(tl.int64))  # type: ignore[attr-defined]
        tl.store(rowok_ptr + base + u, (best > 0.0).to(tl.int8))  # type: ignore[attr-defined]  # a tensor after the loop
    root_ok = tl.load(rows_ptr + base) >= 0
    tl.store(pass_ptr + base, root_ok.to(tl.int8))
    stop = tl.where(root_ok, 0, -1).to(tl.int64)
    best_score = (b * 0).to(tl.int64)
    for j in range(1, N + 1):
        par = tl.load(parents_ptr + b * N + j - 1)
        dj = tl.load(depth_ptr + base + j)
        tok_raw = tl.load(tokens_ptr + b * N + j - 1)
        valid = (tok_raw >= 0) & (tok_raw < V) & (par >= 0) & (dj <= max_depth)
        par_c = tl.maximum(par, 0)
        ok = valid & (tl.load(pass_ptr + base + par_c) != 0)
        par_row = tl.load(rows_ptr + base + par_c)
        one = tl.where(valid, tok_raw, 0) + tl.arange(0, 1)
        one_m = kc.mask_if(ok & (par_row >= 0), one >= 0)  # a block mask (kc.mask_if)
        cand = tl.sum(kc.clean(tl.load(target_ptr + tl.maximum(par_row, 0) * stride_t + one, mask=one_m, other=0.0)), 0)
        ok = ok & (cand.to(tl.float64) > tl.load(thr_ptr + base + par_c))
        tl.store(pass_ptr + base + j, ok.to(tl.int8))
        score = dj * (N + 1) - j
        take = ok & (score > best_score)
        stop = tl.where(take, j, stop)
        best_score = tl.where(take, score, best_score)
    stop_c = tl.maximum(stop, 0)
    has = (stop >= 0) & (tl.load(rowok_ptr + base + stop_c) != 0)
    tl.store(stop_ptr + b, stop)
    tl.store(final_ptr + b, tl.where(has, tl.load(amax_ptr + base + stop_c), -1))
