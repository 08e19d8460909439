"""Triton kernels of tree verification: recursive rejection sampling (twin of
:func:`spec_samplers.tree.reference.rejection_tree_walk`, operation for operation) and Medusa's
typical tree rule (``typical_tree_kernel``, twin of ``typical_tree_reference``).

Grid (B,): one program walks one request's tree. Nodes are visited in index order (parents come
first); node j is tried iff its parent is the current node. The residual r of the current node
lives in the target row while no child has been rejected ("fresh"), then in a [B, 2, V] fp32
scratch, ping-ponged so that a residual whose mass vanished (<= RESIDUAL_MASS_EPS) can be kept.
Each tried child costs gathered scalars; a rejected one one vocabulary pass (the new residual and
its float64 mass); an accepted one none (greedy rows: one argmax pass at the new node). At the
end the program draws the final token from the stop node's residual by the package's two-level
race (:func:`spec_samplers.output.final_draw`'s rule, group by group: :func:`_race_residual`)
and writes the output row and the counters. The layout is derived in the prologue from the
inputs as given (:class:`spec_samplers.layout.TreeCall`): rows, cleaned parents and ragged
spans per node as it is visited, so the launch is the entry's only operation.
Logits inputs (``temp_ptr`` given) are read through the softmax rule of
:func:`spec_samplers.torch_ops.probs_from_logits`, with each visited row's statistics computed on
entering its node (two vocabulary passes), so no probability tensor is written.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.constants import ENTROPY_EPS_FP32, RESIDUAL_MASS_EPS
from spec_samplers.kernels import common as kc
from spec_samplers.kernels.rng import (
    precise_exp,
    precise_log,
    race_exponential,
    race_in_group,
    random_words,
    uniform_from_words,
)
from spec_samplers.kernels.sampling_kernels import row_filter_cut
from spec_samplers.kernels.verify_kernels import count_row
from spec_samplers.rng import LEVEL1_COUNTER, RACE_GROUP, STREAM_ACCEPT, STREAM_RECOVER

_MASS_EPS = tl.constexpr(RESIDUAL_MASS_EPS)
_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)
_STREAM_RECOVER = tl.constexpr(STREAM_RECOVER)
_RACE_GROUP = tl.constexpr(RACE_GROUP)
_LEVEL1_COUNTER = tl.constexpr(LEVEL1_COUNTER)
_ENTROPY_EPS = tl.constexpr(ENTROPY_EPS_FP32)
#: POLICY values
INDEPENDENT = 0
WITHOUT_REPLACEMENT = 1
POINT_MASS = 2


@triton.jit
def _logit_stats(ptr, off, ok, temp, V, cut_ptr, row, BLOCK_V: tl.constexpr, PRECISE: tl.constexpr):
    """(m, c, r, cut, argmax, T) of a logits row: the rule constants of torch_ops.probs_from_logits's
    rule (:func:`spec_samplers.kernels.common.logits_rule`, cut = 0: NaN logits -inf; q = e * r with
    e = exp((x - max) / T) and r = 1 / sum, T <= 0 or NaN counting as 1), the argmax of the
    logits and T as given (T == 0: the one-hot of the argmax). The sum is accumulated in float64
    and rounded once. With ``cut_ptr`` (the request filters: :func:`tree_filter_cut_kernel`'s
    (kept sum, cut) at flat row ``row``) the sum and the cut are read, not computed: the rule of
    ``filtered_softmax_reference``."""
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
    if cut_ptr is not None:
        kept_sum = tl.load(cut_ptr + tl.maximum(row, 0) * 2, mask=ok, other=0.0)
        m_rule, c, r, cut = kc.logits_rule(best, t, kept_sum, tl.load(cut_ptr + tl.maximum(row, 0) * 2 + 1))
    else:
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
def _cut_tree_row(ptr, row, stride, out_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b, scratch, cap, V,
                  BLOCK_V: tl.constexpr, PRECISE: tl.constexpr):  # fmt: skip
    """One row of :func:`tree_filter_cut_kernel` (none when ``row`` < 0): its max (NaN as -inf),
    then its (kept sum, cut) into ``out_ptr``'s row ``row``."""
    if row >= 0:
        off = row * stride
        best = float("-inf")
        for s in range(0, V, BLOCK_V):
            offs = s + tl.arange(0, BLOCK_V)
            x = tl.load(ptr + off + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            best = tl.maximum(best, tl.max(tl.where(x == x, x, float("-inf")), 0))
        kept_sum, cut = row_filter_cut(
            ptr + off, best, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b, scratch, cap, V, BLOCK_V, PRECISE
        )
        tl.store(out_ptr + row * 2, kept_sum)
        tl.store(out_ptr + row * 2 + 1, cut)


@triton.jit
def tree_filter_cut_kernel(
    target_ptr,  # [R, V] logits, vocab stride 1
    stride_t,
    draft_ptr,  # [R, V] logits, or None (point-mass drafts)
    stride_d,
    cu_ptr,  # [B] ragged, None: padded
    num_tokens,  # T (ragged)
    temp_ptr,  # [B] float, <= 0 acts as 1 (greedy requests are decided by the argmax)
    top_k_ptr,  # [B] int, 0 = off
    top_p_ptr,  # [B] float, 1 = off
    min_p_ptr,  # [B] float, 0 = off
    cut_ptr,  # [R, 2] fp32 out: (kept sum, cut) of each target row
    d_cut_ptr,  # [R, 2] fp32 out: of each draft row (with draft_ptr)
    scratch_ptr,  # [2 or 1, B, N+1, cap] fp32: the searches' candidates (pivot_search)
    N,
    V,
    cap,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Program (b, j, side): the (kept sum, cut) of node j's target (side 0) or draft (side 1)
    row of request b under its temperature and filters, exactly
    ``filtered_softmax_reference``'s (:func:`spec_samplers.kernels.sampling_kernels.row_filter_cut`,
    the chain's ``filter_cut_kernel`` on the tree layout), which the tree kernels read through
    :func:`_logit_stats`. Grid (B, N+1, 2 with draft rows else 1)."""
    RAGGED: tl.constexpr = cu_ptr is not None
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    start, n = _span(cu_ptr, b, N, num_tokens, RAGGED)
    row = _node_row(b, j, start, n, N, RAGGED)
    side = tl.program_id(2)
    scratch = scratch_ptr + ((side * tl.num_programs(0) + b) * (N + 1) + j) * cap
    if side == 0:
        _cut_tree_row(target_ptr, row, stride_t, cut_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b, scratch,
                      cap, V, BLOCK_V, PRECISE)  # fmt: skip
    elif draft_ptr is not None:
        _cut_tree_row(draft_ptr, row, stride_d, d_cut_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b, scratch,
                      cap, V, BLOCK_V, PRECISE)  # fmt: skip


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
def _span(cu_ptr, b, N, num_tokens, RAGGED: tl.constexpr):
    """(first flat node, node count n_b) of request b: the ragged rule of
    :func:`spec_samplers.layout.request_spans` (n_b = -1: malformed, no row, no node), or (b * N,
    N) padded."""
    if RAGGED:
        start, n = kc.request_span(cu_ptr, b, N, num_tokens, True)
    else:
        start = b * N
        n = (b * 0 + N).to(tl.int64)
    return start, n


@triton.jit
def _node_row(b, j, start, n, N, RAGGED: tl.constexpr):
    """Flat target / draft row of node j (0 = root) of request b, -1 when it has none
    (:func:`spec_samplers.layout.padded_maps` / ``ragged_maps``)."""
    if RAGGED:
        return tl.where(j <= n, start + b + j, -1).to(tl.int64)
    else:
        return (b * (N + 1) + j).to(tl.int64)


@triton.jit
def _node(tokens_ptr, parents_ptr, b, j, start, n, stride_tb, stride_pb, RAGGED: tl.constexpr):
    """(token, cleaned parent) of node j >= 1: the parent -1 unless in [0, j)
    (:func:`spec_samplers.layout.clean_parents`) or when the node does not exist (ragged:
    j > n_b). Tokens and parents as given (int32/int64, node stride 1; padded parents may be
    shared by the batch: ``stride_pb`` 0)."""
    exists = j <= n
    if RAGGED:
        flat = tl.where(exists, start + j - 1, 0)
        tok = tl.load(tokens_ptr + flat, mask=exists, other=-1).to(tl.int64)
        par = tl.load(parents_ptr + flat, mask=exists, other=-1).to(tl.int64)
    else:
        tok = tl.load(tokens_ptr + b * stride_tb + j - 1).to(tl.int64)
        par = tl.load(parents_ptr + b * stride_pb + j - 1).to(tl.int64)
    return tok, tl.where(exists & (par >= 0) & (par < j), par, -1)


@triton.jit
def _race_residual(
    t_ptr, t_off, s_ptr, s_off, fresh, st, seed, offset, position, V,
    LOGITS: tl.constexpr, PRECISE: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """The recovery race of the residual (:func:`spec_samplers.rng.recovery_race`, stream
    STREAM_RECOVER, counter base position * 2**32): level 1 group by group (BLOCK_V = RACE_GROUP:
    one vector step is one group, its fp64 sum and its exponential), level 2 over the winner's
    entries, re-read."""
    tl.static_assert(BLOCK_V == _RACE_GROUP)
    base = position.to(tl.int64) << 32
    best = tl.full([], -1.0, tl.float64)
    group = (seed * 0).to(tl.int64)
    for s in range(0, V, BLOCK_V):
        offs = s + tl.arange(0, BLOCK_V)
        r = _residual(t_ptr, t_off, s_ptr, s_off, fresh, offs, offs < V, st, LOGITS, PRECISE)
        g = (seed * 0 + s // BLOCK_V).to(tl.int64)
        e = race_exponential(seed, offset, base + _LEVEL1_COUNTER, g, _STREAM_RECOVER, PRECISE)
        key = tl.sum(r.to(tl.float64), 0) / e.to(tl.float64)
        group = tl.where(key > best, g, group)
        best = tl.maximum(best, key)
    offs = group * BLOCK_V + tl.arange(0, BLOCK_V)
    w = _residual(t_ptr, t_off, s_ptr, s_off, fresh, offs, offs < V, st, LOGITS, PRECISE)
    return group * BLOCK_V + race_in_group(w, offs < V, seed, offset, base, _STREAM_RECOVER, PRECISE)


@triton.jit
def _write_tail(out_ptr, nodes_ptr, counts_ptr, b, length, final, max_depth, BLOCK_D: tl.constexpr):
    """The output's tail (:func:`spec_samplers.output.tree_output`): ``final`` at slot
    ``length`` (after the path the walk wrote), -1 after it and in the node slots from ``length``
    on (slots the path did not write), and the row added to the sampler's counters
    (:func:`spec_samplers.kernels.verify_kernels.count_row`; None: not counted)."""
    for s in range(0, max_depth + 1, BLOCK_D):
        pos = s + tl.arange(0, BLOCK_D)
        tail = (pos >= length) & (pos <= max_depth)
        tl.store(out_ptr + b * (max_depth + 1) + pos, tl.where(pos == length, final, -1), mask=tail)
        tl.store(nodes_ptr + b * max_depth + pos, tl.full([BLOCK_D], -1, tl.int64), mask=tail & (pos < max_depth))
        if counts_ptr is not None:
            row = tl.where(pos < length, 0, tl.where(pos == length, final, -1))
            count_row(counts_ptr, row, pos, max_depth)


@triton.jit
def rejection_tree_kernel(
    target_ptr,  # [R, V] fp32/fp16/bf16, vocab stride 1
    stride_t,
    draft_ptr,  # [R, V] or None (point-mass drafts)
    stride_d,
    tokens_ptr,  # [B, N] padded / [T] ragged int32/int64, node stride 1
    stride_tb,
    parents_ptr,  # [B, N] or [N] padded / [T] ragged int32/int64 as given (cleaned here)
    stride_pb,  # 0: one parents row for the batch
    cu_ptr,  # [B] int32/int64 inclusive cumsum of N_b (ragged), None: padded
    num_tokens,  # T (ragged)
    seed_ptr,  # [B] int64
    offset_ptr,  # [B] int64, None: 0
    greedy_ptr,  # [B] bool or None
    temp_ptr,  # [B] float temperature (0: greedy) when the rows hold logits, None: probabilities
    cut_ptr,  # [R, 2] fp32 (kept sum, cut) of the target rows (tree_filter_cut_kernel), None: no filters
    d_cut_ptr,  # [R, 2] fp32 of the draft rows, None: no filters
    scratch_ptr,  # [B, 2, V] fp32
    out_ptr,  # [B, D+1] int64 out: TreeOutput.token_ids
    nodes_ptr,  # [B, D] int64 out: TreeOutput.node_ids
    counts_ptr,  # [2 + >= D] int64 sampler counters, or None
    N,
    V,
    max_depth,
    POLICY: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Program b walks request b's tree (module docstring), draws the final token at the stop
    node and writes the output row: the whole of
    :func:`spec_samplers.tree.reference.rejection_tree_reference`. The layout (rows, cleaned
    parents, depths) is derived here from the inputs as given: an accepted child sits one level
    below the current node, so the depth is a register."""
    LOGITS: tl.constexpr = temp_ptr is not None
    RAGGED: tl.constexpr = cu_ptr is not None
    b = tl.program_id(0).to(tl.int64)
    start, n = _span(cu_ptr, b, N, num_tokens, RAGGED)
    seed = tl.load(seed_ptr + b)
    offset = (b * 0).to(tl.int64)
    if offset_ptr is not None:
        offset = tl.load(offset_ptr + b)
    temp = 1.0
    if LOGITS:
        temp = tl.load(temp_ptr + b).to(tl.float32)
    greedy = 0
    if greedy_ptr is not None:
        greedy = tl.load(greedy_ptr + b).to(tl.int32)
    elif LOGITS:
        greedy = tl.where(temp == 0, 1, 0)
    root_row = _node_row(b, 0, start, n, N, RAGGED)
    alive = root_row >= 0
    cur = tl.where(alive, 0, -1).to(tl.int64)
    cur_row = root_row
    depth = (b * 0).to(tl.int64)  # of the current node
    t_off = tl.maximum(root_row, 0) * stride_t
    t_st = (0.0, 1.0, 1.0, 0.0, (b * 0).to(tl.int64), 1.0)  # logits rule constants of the current target row
    d_st = (0.0, 1.0, 1.0, 0.0, (b * 0).to(tl.int64), 1.0)  # and of its draft row
    if LOGITS:
        t_st = _logit_stats(target_ptr, t_off, alive, temp, V, cut_ptr, root_row, BLOCK_V, PRECISE)
        if POLICY != 2:
            d_off0 = tl.maximum(root_row, 0) * stride_d
            d_st = _logit_stats(draft_ptr, d_off0, alive, temp, V, d_cut_ptr, root_row, BLOCK_V, PRECISE)
    s_base = b * 2 * V
    slot = 0
    fresh = 1
    z = 1.0
    removed = 0.0
    q_argmax = (b * 0).to(tl.int64)
    if greedy != 0:
        q_argmax, root_max = _row_argmax(target_ptr, t_off, alive, V, t_st, LOGITS, PRECISE, BLOCK_V)
    for j in range(1, N + 1):
        tok_raw, par = _node(tokens_ptr, parents_ptr, b, j, start, n, stride_tb, stride_pb, RAGGED)
        if alive & (par == cur) & (depth < max_depth):
            valid = (tok_raw >= 0) & (tok_raw < V)
            tok = tl.where(valid, tok_raw, 0)
            s_off = s_base + slot * V
            one = tok + tl.arange(0, 1)
            one_m = kc.mask_if(valid, one >= 0)  # a block mask (kc.mask_if)
            r_c = tl.sum(_residual(target_ptr, t_off, scratch_ptr, s_off, fresh, one, one_m, t_st, LOGITS, PRECISE), 0)
            d_row = cur_row
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
                # the path so far: node j at slot depth (its depth - 1)
                tl.store(out_ptr + b * (max_depth + 1) + depth, tok_raw)
                tl.store(nodes_ptr + b * max_depth + depth, j + (b * 0))
                cur = j + (b * 0)
                depth += 1
                row_j = _node_row(b, j, start, n, N, RAGGED)
                cur_row = row_j
                t_off = tl.maximum(row_j, 0) * stride_t
                fresh = 1
                z = 1.0
                removed = 0.0
                if LOGITS:
                    t_st = _logit_stats(target_ptr, t_off, row_j >= 0, temp, V, cut_ptr, row_j, BLOCK_V, PRECISE)
                    if POLICY != 2:
                        d_off_j = tl.maximum(row_j, 0) * stride_d
                        d_st = _logit_stats(draft_ptr, d_off_j, row_j >= 0, temp, V, d_cut_ptr, row_j, BLOCK_V, PRECISE)
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
    # the stop node: whether its target row has mass and its argmax, then the final draw from its
    # residual (spec_samplers.output.final_draw)
    amax, qmax = _row_argmax(target_ptr, t_off, alive & (cur_row >= 0), V, t_st, LOGITS, PRECISE, BLOCK_V)
    s_off = s_base + slot * V
    token = _race_residual(
        target_ptr, t_off, scratch_ptr, s_off, fresh, t_st, seed, offset, depth, V, LOGITS, PRECISE, BLOCK_V
    )
    if greedy != 0:
        token = amax
    final = tl.where(alive & (qmax > 0), token, -1)
    _write_tail(out_ptr, nodes_ptr, counts_ptr, b, depth, final, max_depth, BLOCK_D)


@triton.jit
def typical_tree_kernel(
    target_ptr,  # [R, V] fp32/fp16/bf16, vocab stride 1
    stride_t,
    tokens_ptr,  # [B, N] padded / [T] ragged int32/int64, node stride 1
    stride_tb,
    parents_ptr,  # [B, N] or [N] padded / [T] ragged int32/int64 as given (cleaned here)
    stride_pb,
    cu_ptr,  # [B] ragged, None: padded
    num_tokens,  # T (ragged)
    temp_ptr,  # [B] float temperature when the rows hold logits, None: probabilities
    cut_ptr,  # [R, 2] fp32 (kept sum, cut) of the rows (tree_filter_cut_kernel), None: no filters
    stat_ptr,  # [B, N+1, 4] fp32 scratch: logits rule constants of each node's row (LOGITS)
    lidx_ptr,  # [B, N+1] int64 scratch: argmax of each node's logits (LOGITS)
    thr_ptr,  # [B, N+1] fp64 scratch: typical threshold of each node's row
    amax_ptr,  # [B, N+1] int64 scratch: argmax of each node's row
    rowok_ptr,  # [B, N+1] int8 scratch: the row has mass
    pdepth_ptr,  # [B, N+1] int64 scratch: depth of a node whose whole path passes, else -1
    out_ptr,  # [B, D+1] int64 out: TreeOutput.token_ids
    nodes_ptr,  # [B, D] int64 out: TreeOutput.node_ids
    counts_ptr,  # [2 + >= D] int64 sampler counters, or None
    posterior_threshold,  # fp32 value
    posterior_alpha,  # fp32 value
    N,
    V,
    max_depth,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Medusa's tree rule (:func:`spec_samplers.tree.reference.typical_tree_reference`), the
    output row included: one vocabulary pass per node row (float64 entropy, argmax; logits rows
    read through the softmax rule, their statistics kept for the children's tests), the path
    tests on gathered scalars, then the path written by walking up from the stop node. Grid (B,)."""
    LOGITS: tl.constexpr = temp_ptr is not None
    RAGGED: tl.constexpr = cu_ptr is not None
    b = tl.program_id(0).to(tl.int64)
    start, n = _span(cu_ptr, b, N, num_tokens, RAGGED)
    base = b * (N + 1)
    temp = 1.0
    if LOGITS:
        temp = tl.load(temp_ptr + b).to(tl.float32)
    for u in range(0, N + 1):
        row = _node_row(b, u, start, n, N, RAGGED)
        off = tl.maximum(row, 0) * stride_t
        hi = tl.where(row >= 0, V, 0)
        st = (0.0, 1.0, 1.0, 0.0, (b * 0).to(tl.int64), 1.0)
        if LOGITS:
            st = _logit_stats(target_ptr, off, row >= 0, temp, V, cut_ptr, row, BLOCK_V, PRECISE)
            m_rule, c, r, cut, lidx, _t = st
            tl.store(stat_ptr + (base + u) * 4, m_rule)
            tl.store(stat_ptr + (base + u) * 4 + 1, c)
            tl.store(stat_ptr + (base + u) * 4 + 2, r)
            tl.store(stat_ptr + (base + u) * 4 + 3, cut)
            tl.store(lidx_ptr + base + u, lidx)
        ent = tl.full([], 0.0, tl.float64)
        best = -1.0
        best_idx = 0
        for s in range(0, V, BLOCK_V):
            offs = s + tl.arange(0, BLOCK_V)
            m = offs < hi
            q = _load(target_ptr, off, offs, m, st, LOGITS, PRECISE)
            q64 = q.to(tl.float64)
            ent += tl.sum(q64 * precise_log(q64 + _ENTROPY_EPS, PRECISE), axis=0)
            best, best_idx = kc.fold_argmax(tl.where(m, q, -1.0), s, best, best_idx)
        zero64 = tl.zeros([], tl.float64)
        thr = tl.minimum((zero64 + posterior_alpha) * precise_exp(ent, PRECISE), zero64 + posterior_threshold)
        tl.store(thr_ptr + base + u, thr)
        tl.store(amax_ptr + base + u, best_idx.to(tl.int64))  # type: ignore[attr-defined]
        tl.store(rowok_ptr + base + u, (best > 0.0).to(tl.int8))  # type: ignore[attr-defined]  # a tensor after the loop
    root_ok = _node_row(b, 0, start, n, N, RAGGED) >= 0
    tl.store(pdepth_ptr + base, tl.where(root_ok, 0, -1).to(tl.int64))
    stop = tl.where(root_ok, 0, -1).to(tl.int64)
    stop_depth = (b * 0).to(tl.int64)
    best_score = (b * 0).to(tl.int64)
    for j in range(1, N + 1):
        tok_raw, par = _node(tokens_ptr, parents_ptr, b, j, start, n, stride_tb, stride_pb, RAGGED)
        par_c = tl.maximum(par, 0)
        dj = tl.load(pdepth_ptr + base + par_c) + 1  # > 0: the parent's whole path passes
        valid = (tok_raw >= 0) & (tok_raw < V) & (par >= 0) & (dj > 0) & (dj <= max_depth)
        par_row = _node_row(b, par_c, start, n, N, RAGGED)
        st = (0.0, 1.0, 1.0, 0.0, (b * 0).to(tl.int64), 1.0)
        if LOGITS:
            sp = stat_ptr + (base + par_c) * 4
            lidx = tl.load(lidx_ptr + base + par_c)
            st = (tl.load(sp), tl.load(sp + 1), tl.load(sp + 2), tl.load(sp + 3), lidx, temp)
        one = tl.where(valid, tok_raw, 0) + tl.arange(0, 1)
        one_m = kc.mask_if(valid & (par_row >= 0), one >= 0)  # a block mask (kc.mask_if)
        cand = tl.sum(_load(target_ptr, tl.maximum(par_row, 0) * stride_t, one, one_m, st, LOGITS, PRECISE), 0)
        ok = valid & (cand.to(tl.float64) > tl.load(thr_ptr + base + par_c))
        tl.store(pdepth_ptr + base + j, tl.where(ok, dj, -1))
        score = dj * (N + 1) - j
        take = ok & (score > best_score)
        stop = tl.where(take, j, stop)
        stop_depth = tl.where(take, dj, stop_depth)
        best_score = tl.where(take, score, best_score)
    # the path, walked up from the stop node (node at slot depth - 1)
    node = stop
    d = stop_depth
    for _ in range(0, max_depth):
        on_path = node > 0
        node_c = tl.maximum(node, 1)
        tok_n, par_n = _node(tokens_ptr, parents_ptr, b, node_c, start, n, stride_tb, stride_pb, RAGGED)
        tl.store(out_ptr + b * (max_depth + 1) + d - 1, tok_n, mask=on_path)
        tl.store(nodes_ptr + b * max_depth + d - 1, node, mask=on_path)
        node = tl.where(on_path, par_n, node)
        d = tl.where(on_path, d - 1, d)
    stop_c = tl.maximum(stop, 0)
    has = (stop >= 0) & (tl.load(rowok_ptr + base + stop_c) != 0)
    final = tl.where(has, tl.load(amax_ptr + base + stop_c), -1)
    _write_tail(out_ptr, nodes_ptr, counts_ptr, b, stop_depth, final, max_depth, BLOCK_D)


#: per-node fp32 fields of block_tree_kernel's ``nf_ptr`` workspace
_F_ALPHA = tl.constexpr(0)  # alpha_u
_F_REMOVED = tl.constexpr(1)  # drawn mass of u's failed children (without replacement)
_F_TST = tl.constexpr(2)  # 2..5: logits rule constants (m, c, r, cut) of u's target row
_F_DST = tl.constexpr(6)  # 6..9: and of its draft row
NODE_F = 10
_NODE_F = tl.constexpr(NODE_F)
#: per-node int64 fields of ``ni_ptr``
_I_DEPTH = tl.constexpr(0)  # -1: detached
_I_FIRST = tl.constexpr(1)  # first present child (0: none)
_I_NEXT = tl.constexpr(2)  # next present sibling (0: none)
_I_LAST = tl.constexpr(3)  # last entered child (0: none)
_I_SKIPPED = tl.constexpr(4)  # could not have been drawn
_I_ORIG = tl.constexpr(5)  # Q_u is still u's target row (nothing written)
_I_SLOT = tl.constexpr(6)  # indexed by depth d: the row of q_ptr of the updated node at depth d
_I_TMAX = tl.constexpr(7)  # argmax of u's target logits
_I_DMAX = tl.constexpr(8)  # and of its draft logits
NODE_I = 9
_NODE_I = tl.constexpr(NODE_I)


@triton.jit
def _store_stats(nf, ni, u, st, F: tl.constexpr, FI: tl.constexpr):
    """Keep node u's logits rule constants (:func:`_logit_stats`) in the node workspaces."""
    m_rule, c, r, cut, argmax, _t = st
    tl.store(nf + u * _NODE_F + F, m_rule)
    tl.store(nf + u * _NODE_F + F + 1, c)
    tl.store(nf + u * _NODE_F + F + 2, r)
    tl.store(nf + u * _NODE_F + F + 3, cut)
    tl.store(ni + u * _NODE_I + FI, argmax)


@triton.jit
def _stats(nf, ni, u, temp, F: tl.constexpr, FI: tl.constexpr, LOGITS: tl.constexpr):
    """Node u's (m, c, r, cut, argmax, T) as :func:`_load` reads them (probabilities: unused)."""
    st = (0.0, 1.0, 1.0, 0.0, tl.full([], 0, tl.int64), 1.0)
    if LOGITS:
        p = nf + u * _NODE_F + F
        st = (tl.load(p), tl.load(p + 1), tl.load(p + 2), tl.load(p + 3), tl.load(ni + u * _NODE_I + FI), temp)
    return st


@triton.jit
def _enter_stats(target_ptr, stride_t, draft_ptr, stride_d, cut_ptr, d_cut_ptr, nf, ni, u, row, temp, V,
                 POLICY: tl.constexpr, BLOCK_V: tl.constexpr, PRECISE: tl.constexpr):  # fmt: skip
    """Logits rows: node u's target (and draft) row statistics, computed once when u is entered."""
    ok = row >= 0
    t_st = _logit_stats(target_ptr, tl.maximum(row, 0) * stride_t, ok, temp, V, cut_ptr, row, BLOCK_V, PRECISE)
    _store_stats(nf, ni, u, t_st, _F_TST, _I_TMAX)
    if POLICY != 2:
        d_st = _logit_stats(draft_ptr, tl.maximum(row, 0) * stride_d, ok, temp, V, d_cut_ptr, row, BLOCK_V,
                             PRECISE)  # fmt: skip
        _store_stats(nf, ni, u, d_st, _F_DST, _I_DMAX)


@triton.jit
def block_tree_kernel(
    target_ptr,  # [R, V] fp32/fp16/bf16, vocab stride 1
    stride_t,
    draft_ptr,  # [R, V] or None (point-mass drafts)
    stride_d,
    tokens_ptr,  # [B, N] padded / [T] ragged int32/int64, node stride 1
    stride_tb,
    parents_ptr,  # [B, N] or [N] padded / [T] ragged int32/int64 as given (cleaned here)
    stride_pb,  # 0: one parents row for the batch
    cu_ptr,  # [B] int32/int64 inclusive cumsum of N_b (ragged), None: padded
    num_tokens,  # T (ragged)
    seed_ptr,  # [B] int64
    offset_ptr,  # [B] int64, None: 0
    greedy_ptr,  # [B] bool or None
    temp_ptr,  # [B] float temperature (0: greedy) when the rows hold logits, None: probabilities
    cut_ptr,  # [R, 2] fp32 (kept sum, cut) of the target rows (tree_filter_cut_kernel), None: no filters
    d_cut_ptr,  # [R, 2] fp32 of the draft rows, None: no filters
    q_ptr,  # [B, min(D, N)+1, V] fp32 workspace: Q_u of the updated nodes on the path, and a spare
    nf_ptr,  # [B, N+1, NODE_F] fp32 workspace: alpha, removed mass, logits statistics per node
    ni_ptr,  # [B, N+1, NODE_I] int64 workspace: depth, child links, flags, Q slot per node
    out_ptr,  # [B, D+1] int64 out: TreeOutput.token_ids
    nodes_ptr,  # [B, D] int64 out: TreeOutput.node_ids
    counts_ptr,  # [2 + >= D] int64 sampler counters, or None
    N,
    V,
    max_depth,
    POLICY: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Traversal Verification (:func:`spec_samplers.tree.traversal.traversal_tree_reference`),
    the output row included. Program b runs the 2N + 1 steps of request b's walk (the module
    docstring of :mod:`spec_samplers.tree.traversal`): entering a child costs gathered scalars,
    a failed child one vocabulary pass over its parent's Q and draft rows and one that normalises
    the new residual in place (none when its mass vanished, <= RESIDUAL_MASS_EPS: the old Q is
    kept). Q_u stays u's target row until u is updated (``_I_ORIG``), then lives in a workspace
    row: the residual is written into the spare row, which is swapped in. Only the nodes on the
    walk's current path are alive (a failed node is deleted, a passing one ends the walk), one per
    depth, so the rows are held per depth: min(D, N) + 1 rows with the spare. Greedy rows take the
    rejection tree's argmax walk. The final draw races the stop node's Q at its depth
    (:func:`_race_residual`) and the path is written by walking up from the stop node. Grid (B,);
    compiled without FP fusion (alpha Q - p rounds as the reference's multiply, then subtract)."""
    LOGITS: tl.constexpr = temp_ptr is not None
    RAGGED: tl.constexpr = cu_ptr is not None
    b = tl.program_id(0).to(tl.int64)
    zero = (b * 0).to(tl.int64)
    start, n = _span(cu_ptr, b, N, num_tokens, RAGGED)
    seed = tl.load(seed_ptr + b)
    offset = zero
    if offset_ptr is not None:
        offset = tl.load(offset_ptr + b)
    temp = 1.0
    if LOGITS:
        temp = tl.load(temp_ptr + b).to(tl.float32)
    greedy = 0
    if greedy_ptr is not None:
        greedy = tl.load(greedy_ptr + b).to(tl.int32)
    elif LOGITS:
        greedy = tl.where(temp == 0, 1, 0)
    nf = nf_ptr + b * (N + 1) * _NODE_F
    ni = ni_ptr + b * (N + 1) * _NODE_I
    levels = tl.minimum(max_depth, N)  # depths whose nodes can be updated: 0 .. levels - 1
    q_base = b * (levels + 1) * V
    root_row = _node_row(b, 0, start, n, N, RAGGED)
    alive = root_row >= 0
    # the node workspaces (spec_samplers.layout.node_depths; children linked in index order)
    for v in range(0, N + 1):
        tl.store(nf + v * _NODE_F + _F_ALPHA, tl.where(v == 0, 1.0, 0.0))
        tl.store(nf + v * _NODE_F + _F_REMOVED, 0.0)
        for f in tl.static_range(1, _NODE_I):
            tl.store(ni + v * _NODE_I + f, zero)
        tl.store(ni + v * _NODE_I + _I_ORIG, zero + 1)
        tl.store(ni + v * _NODE_I + _I_SLOT, zero + v)
    tl.store(ni + _I_DEPTH, zero)
    tl.debug_barrier()
    for j in range(1, N + 1):
        _tok, par = _node(tokens_ptr, parents_ptr, b, j, start, n, stride_tb, stride_pb, RAGGED)
        d = tl.load(ni + tl.maximum(par, 0) * _NODE_I + _I_DEPTH)
        tl.store(ni + j * _NODE_I + _I_DEPTH, tl.where((par >= 0) & (d >= 0), d + 1, -1))
        tl.debug_barrier()
    for jj in range(0, N):
        j = N - jj
        _tok, par = _node(tokens_ptr, parents_ptr, b, j, start, n, stride_tb, stride_pb, RAGGED)
        dj = tl.load(ni + j * _NODE_I + _I_DEPTH)
        if (dj >= 1) & (dj <= max_depth):
            tl.store(ni + j * _NODE_I + _I_NEXT, tl.load(ni + par * _NODE_I + _I_FIRST))
            tl.store(ni + par * _NODE_I + _I_FIRST, zero + j)
        tl.debug_barrier()
    if LOGITS:
        _enter_stats(target_ptr, stride_t, draft_ptr, stride_d, cut_ptr, d_cut_ptr, nf, ni, 0, root_row, temp, V,
                     POLICY, BLOCK_V, PRECISE)  # fmt: skip
        tl.debug_barrier()
    stop = tl.where(alive, 0, -1).to(tl.int64)
    if alive & (greedy != 0):
        # the argmax walk of spec_samplers.tree.reference.rejection_tree_walk (greedy rows)
        cur = zero
        cur_row = root_row
        t_st = _stats(nf, ni, 0, temp, _F_TST, _I_TMAX, LOGITS)
        q_argmax, _m = _row_argmax(target_ptr, root_row * stride_t, alive, V, t_st, LOGITS, PRECISE, BLOCK_V)
        for j in range(1, N + 1):
            tok_raw, par = _node(tokens_ptr, parents_ptr, b, j, start, n, stride_tb, stride_pb, RAGGED)
            dj = tl.load(ni + j * _NODE_I + _I_DEPTH)
            valid = (tok_raw >= 0) & (tok_raw < V)
            if (par == cur) & (dj >= 1) & (dj <= max_depth) & valid & (tok_raw == q_argmax):
                one = tok_raw + tl.arange(0, 1)
                q_c = tl.sum(_load(target_ptr, cur_row * stride_t, one, one >= 0, t_st, LOGITS, PRECISE), 0)
                if q_c > 0:
                    cur = zero + j
                    cur_row = _node_row(b, j, start, n, N, RAGGED)
                    if LOGITS:
                        _enter_stats(target_ptr, stride_t, draft_ptr, stride_d, cut_ptr, d_cut_ptr, nf, ni, j,
                                     cur_row, temp, V, 2, BLOCK_V, PRECISE)  # fmt: skip  # (target row only)
                        tl.debug_barrier()
                    t_st = _stats(nf, ni, j, temp, _F_TST, _I_TMAX, LOGITS)
                    q_argmax, _m = _row_argmax(target_ptr, cur_row * stride_t, cur_row >= 0, V, t_st, LOGITS,
                                               PRECISE, BLOCK_V)  # fmt: skip
        stop = cur
    elif alive:
        cur = zero
        done = 0
        spare = zero + levels  # the workspace row that no node holds
        for _step in range(0, 2 * N + 1):
            if done == 0:
                last = tl.load(ni + cur * _NODE_I + _I_LAST)
                kid = tl.where(last > 0, tl.load(ni + tl.maximum(last, 0) * _NODE_I + _I_NEXT),
                               tl.load(ni + cur * _NODE_I + _I_FIRST))  # fmt: skip
                passes = cur == 0
                if (kid == 0) & (cur > 0):
                    w0, w1, w2, w3 = random_words(seed, offset, cur - 1, _STREAM_ACCEPT)
                    passes = uniform_from_words(w0, w1) < tl.load(nf + cur * _NODE_F + _F_ALPHA)
                if (kid == 0) & passes:
                    stop = cur
                    done = 1
                else:
                    # u's state: Q_u (its target row or its workspace row), alpha_u, P_u; x: the child
                    # of u concerned (entered, or cur failed)
                    x_node = tl.where(kid > 0, kid, cur)
                    tok_raw, up = _node(tokens_ptr, parents_ptr, b, x_node, start, n, stride_tb, stride_pb, RAGGED)
                    u = tl.where(kid > 0, cur, up)
                    u_row = _node_row(b, u, start, n, N, RAGGED)
                    valid = (tok_raw >= 0) & (tok_raw < V)
                    tok = tl.where(valid, tok_raw, 0)
                    t_off = u_row * stride_t
                    d_off = u_row * stride_d
                    orig = tl.load(ni + u * _NODE_I + _I_ORIG)
                    du = tl.load(ni + u * _NODE_I + _I_DEPTH)
                    u_slot = tl.load(ni + du * _NODE_I + _I_SLOT)
                    q_off = q_base + u_slot * V
                    t_st = _stats(nf, ni, u, temp, _F_TST, _I_TMAX, LOGITS)
                    d_st = _stats(nf, ni, u, temp, _F_DST, _I_DMAX, LOGITS)
                    alpha_u = tl.load(nf + u * _NODE_F + _F_ALPHA)
                    removed = tl.load(nf + u * _NODE_F + _F_REMOVED)
                    one = tok + tl.arange(0, 1)
                    one_m = kc.mask_if(valid, one >= 0)  # a block mask (kc.mask_if)
                    p_drawn = 0.0
                    p_x = 1.0
                    rem = 1.0
                    if POLICY != 2:
                        p_drawn = tl.sum(_load(draft_ptr, d_off, one, one_m, d_st, LOGITS, PRECISE), 0)
                        if POLICY == 1:
                            rem = 1.0 - removed
                        p_x = tl.where(rem > 0, tl.math.div_rn(p_drawn, tl.where(rem > 0, rem, 1.0)), 0.0)
                    rem_safe = tl.where(rem > 0, rem, 1.0)
                    if kid > 0:
                        # entering child kid of u: alpha_c = min(alpha_u Q_u(x) / P_u(x), 1)
                        q_x = tl.sum(_residual(target_ptr, t_off, q_ptr, q_off, orig, one, one_m, t_st, LOGITS,
                                               PRECISE), 0)  # fmt: skip
                        drawable = valid & (p_x > 0)
                        ratio = tl.math.div_rn(q_x, tl.where(drawable, p_x, 1.0))
                        alpha_c = tl.where(drawable & (alpha_u > 0), tl.minimum(alpha_u * ratio, 1.0), 0.0)
                        tl.store(nf + kid * _NODE_F + _F_ALPHA, alpha_c)
                        tl.store(ni + kid * _NODE_I + _I_SKIPPED, tl.where(drawable, 0, 1).to(tl.int64))
                        tl.store(ni + u * _NODE_I + _I_LAST, kid)
                        if LOGITS:
                            k_row = _node_row(b, kid, start, n, N, RAGGED)
                            _enter_stats(target_ptr, stride_t, draft_ptr, stride_d, cut_ptr, d_cut_ptr, nf, ni, kid,
                                         k_row, temp, V, POLICY, BLOCK_V, PRECISE)  # fmt: skip
                        cur = kid
                    else:
                        if tl.load(ni + cur * _NODE_I + _I_SKIPPED) == 0:
                            # u after the failure of cur: (alpha_u Q_u - P_u)+ into the spare row, its
                            # mass z, then normalised and swapped in unless z vanished
                            s_off = q_base + spare * V
                            mass = zero.to(tl.float64)
                            for s in range(0, V, BLOCK_V):
                                offs = s + tl.arange(0, BLOCK_V)
                                m = offs < V
                                q = _residual(target_ptr, t_off, q_ptr, q_off, orig, offs, m, t_st, LOGITS, PRECISE)
                                r = alpha_u * q
                                if POLICY != 2:
                                    p = _load(draft_ptr, d_off, offs, m, d_st, LOGITS, PRECISE)
                                    r = tl.maximum(r - tl.math.div_rn(p, rem_safe), 0.0)
                                else:
                                    r = tl.where(offs == tok, tl.maximum(r - 1.0, 0.0), r)
                                r = tl.where(m, r, 0.0)
                                tl.store(q_ptr + s_off + offs, r, mask=m)
                                mass += tl.sum(r.to(tl.float64), 0)
                            z = mass.to(tl.float32)
                            full = alpha_u >= 1.0
                            new_alpha = tl.where(full, 1.0, tl.math.div_rn(z, tl.where(full, 1.0, z + (1.0 - alpha_u))))
                            if z > _MASS_EPS:
                                for s in range(0, V, BLOCK_V):
                                    offs = s + tl.arange(0, BLOCK_V)
                                    m = offs < V
                                    r = tl.load(q_ptr + s_off + offs, mask=m, other=0.0)
                                    tl.store(q_ptr + s_off + offs, tl.math.div_rn(r, z), mask=m)
                                tl.store(ni + du * _NODE_I + _I_SLOT, spare)
                                tl.store(ni + u * _NODE_I + _I_ORIG, zero)
                                spare = u_slot
                            tl.store(nf + u * _NODE_F + _F_ALPHA, new_alpha)
                            if POLICY == 1:
                                tl.store(nf + u * _NODE_F + _F_REMOVED, removed + p_drawn)
                        cur = u
            tl.debug_barrier()  # this step's node stores are visible to every thread of the program
    # the stop node: its target row's mass and argmax, the final draw from its Q, the path
    stop_c = tl.maximum(stop, 0)
    s_row = _node_row(b, stop_c, start, n, N, RAGGED)
    s_ok = alive & (s_row >= 0)
    t_st = _stats(nf, ni, stop_c, temp, _F_TST, _I_TMAX, LOGITS)
    s_toff = tl.maximum(s_row, 0) * stride_t
    amax, qmax = _row_argmax(target_ptr, s_toff, s_ok, V, t_st, LOGITS, PRECISE, BLOCK_V)
    token = amax
    if greedy == 0:
        orig = tl.load(ni + stop_c * _NODE_I + _I_ORIG)
        depth_s = tl.load(ni + stop_c * _NODE_I + _I_DEPTH)
        q_off = q_base + tl.load(ni + depth_s * _NODE_I + _I_SLOT) * V
        token = _race_residual(
            target_ptr, s_toff, q_ptr, q_off, orig, t_st, seed, offset, depth_s, V, LOGITS, PRECISE, BLOCK_V
        )
    final = tl.where(s_ok & (qmax > 0), token, -1)
    length = tl.where(alive, tl.load(ni + stop_c * _NODE_I + _I_DEPTH), 0)
    node = tl.where(alive, stop, 0)
    d = length
    for _ in range(0, max_depth):
        on_path = node > 0
        node_c = tl.maximum(node, 1)
        tok_n, par_n = _node(tokens_ptr, parents_ptr, b, node_c, start, n, stride_tb, stride_pb, RAGGED)
        tl.store(out_ptr + b * (max_depth + 1) + d - 1, tok_n, mask=on_path)
        tl.store(nodes_ptr + b * max_depth + d - 1, node, mask=on_path)
        node = tl.where(on_path, par_n, node)
        d = tl.where(on_path, d - 1, d)
    _write_tail(out_ptr, nodes_ptr, counts_ptr, b, length, final, max_depth, BLOCK_D)
