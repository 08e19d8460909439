"""Triton kernels of greedy multi-path block verification (GBV): the twins of
:func:`spec_samplers.tree.multipath.multipath_plan` and ``multipath_tree_reference``, operation
for operation, so that they give the reference's tokens. They read the call's inputs as given
(:class:`~spec_samplers.layout.TreeCall`: padded or ragged rows, parents, probabilities or logits
at a temperature, through the tree kernels' readers), so the entry runs no PyTorch op but the
sort between the two launches.

Grid (B,), one program per request:

1. ``multipath_pick_kernel`` reads the request's shape from its parents (K paths of length L; a
   request of another shape is flagged and emits nothing), then walks the K paths greedily: the
   pick reads only the keys min(1, q/p) of the (at most K) alive candidates at each depth. It
   writes the node whose rows each position reads, the picked path's length L', its path index,
   and the keys of every verified position's rows (one vocabulary pass each).
2. The launcher sorts each key row (stable, descending: the order, ties by token id). Every
   token's skewed probability needs its place in the order, so this is a sort of each visited
   row, the one step the kernels leave to PyTorch.
3. ``multipath_verify_kernel`` runs block verification on the picked path: per position the
   order's CDF (F(x), F(x-)) as float64 suffix sums of the draft mass in the sorted order, then
   one vocabulary pass (p~ = p H(a + r F(x), a + r F(x-)) / H(1, a) and Z = sum (rho q - p~)+,
   accumulated in float64 and rounded once), the scalar recursions of rho, a and r at the picked
   token, the accept tests with the chain's uniforms, then one more pass that writes the
   residual at the accepted length tau, the argmax of its target row and level 1 of the final
   race; level 2 of the race (:func:`spec_samplers.output.final_draw`'s rule), greedy rows' argmax
   walk, and the output row and the counters (:func:`spec_samplers.output.finish_walk`).

``enable_fp_fusion=False`` at launch: a + r F and rho q - p~ must round like the reference's
separate multiply and add (an FMA would change the last bit and, rarely, a token).
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.kernels import common as kc
from spec_samplers.kernels.rng import race_exponential, race_in_group, random_words, uniform_from_words
from spec_samplers.kernels.tree_kernels import (
    _cut_tree_row,
    _load,
    _logit_stats,
    _node_row,
    _row_argmax,
    _span,
    _write_tail,
)
from spec_samplers.rng import LEVEL1_COUNTER, RACE_GROUP, STREAM_ACCEPT, STREAM_RECOVER

_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)
_STREAM_RECOVER = tl.constexpr(STREAM_RECOVER)
_RACE_GROUP = tl.constexpr(RACE_GROUP)
_LEVEL1_COUNTER = tl.constexpr(LEVEL1_COUNTER)
_BIG_TOKEN = tl.constexpr(2**62)


@triton.jit
def _key(q, p):
    """min(1, q/p), 1 where p = 0 (:func:`spec_samplers.tree.multipath.order_keys`)."""
    return tl.where(p > 0, tl.minimum(tl.math.div_rn(q, tl.where(p > 0, p, 1.0)), 1.0), 1.0)


@triton.jit
def _power_sum(b, c, K):
    """H(b, c) = sum_{j<K} b^j c^(K-1-j) by H_1 = 1, H_{k+1} = b^k + c H_k
    (:func:`spec_samplers.tree.multipath.power_sum`, same operations, same order)."""
    h = b * 0.0 + 1.0
    b_pow = b * 0.0 + 1.0
    for _ in range(1, K):
        b_pow = b_pow * b
        h = b_pow + c * h
    return h


@triton.jit
def _skewed(p, fe, fl, a, r, h_one, K):
    """p~ = p H(a + r F(x), a + r F(x-)) / H(1, a) (:func:`spec_samplers.tree.multipath.skewed_row`)."""
    return p * tl.math.div_rn(_power_sum(a + r * fe, a + r * fl, K), h_one)


@triton.jit
def _accept_uniform(seed, offset, m):
    """The accept uniform of counter m - 1: the one h_m is tested against (as the chain's)."""
    w0, w1, _, _ = random_words(seed, offset, (seed * 0 + m - 1).to(tl.int64), _STREAM_ACCEPT)
    return uniform_from_words(w0, w1)


@triton.jit
def _stats(ptr, off, ok, temp, V, cut_ptr, row, BLOCK_V: tl.constexpr, LOGITS: tl.constexpr, PRECISE: tl.constexpr):
    """The row's softmax constants for :func:`~spec_samplers.kernels.tree_kernels._load` when the
    rows hold logits (two vocabulary passes; one with the filters' ``cut_ptr``), placeholders for
    probabilities."""
    st = (0.0, 1.0, 1.0, 0.0, (off * 0).to(tl.int64), 1.0)
    if LOGITS:
        st = _logit_stats(ptr, off, ok, temp, V, cut_ptr, row, BLOCK_V, PRECISE)
    return st


@triton.jit
def _request(b, cu_ptr, num_tokens, temp_ptr, greedy_ptr, N, RAGGED: tl.constexpr, LOGITS: tl.constexpr):
    """(first flat node, node count, temperature, greedy) of request b (greedy: ``is_greedy``, or
    T == 0 of a logits call)."""
    start, n = _span(cu_ptr, b, N, num_tokens, RAGGED)
    temp = 1.0
    if LOGITS:
        temp = tl.load(temp_ptr + b).to(tl.float32)
    greedy = 0
    if greedy_ptr is not None:
        greedy = tl.load(greedy_ptr + b).to(tl.int32)
    elif LOGITS:
        greedy = tl.where(temp == 0, 1, 0)
    return start, n, temp, greedy


@triton.jit
def _token_at(tokens_ptr, b, start, j, stride_tb, mask, RAGGED: tl.constexpr):
    """Tokens (int64, -1 where not ``mask``) of nodes ``j`` >= 1 (a block) of request b."""
    if RAGGED:
        flat = start + j - 1
    else:
        flat = b * stride_tb + j - 1
    return tl.load(tokens_ptr + tl.where(mask, flat, 0), mask=mask, other=-1).to(tl.int64)


@triton.jit
def _node_cuts(ptr, stride, out_ptr, row, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b, scratch_ptr, cap, V,
               CUT_BLOCK_V: tl.constexpr, PRECISE: tl.constexpr):  # fmt: skip
    """The (kept sum, cut) of flat row ``row`` of ``ptr`` (none when ``row`` < 0) under request
    b's filters, as ``tree_filter_cut_kernel`` writes it (request b's [cap] scratch), then
    visible to every thread of the program (they read it next, through :func:`_stats`)."""
    _cut_tree_row(ptr, row, stride, out_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b, scratch_ptr + b * cap,
                  cap, V, CUT_BLOCK_V, PRECISE)  # fmt: skip
    tl.debug_barrier()


@triton.jit
def multipath_pick_kernel(
    target_ptr,  # [R, V] fp32/fp16/bf16 probabilities or logits, vocab stride 1
    stride_t,
    draft_ptr,  # [R, V], vocab stride 1
    stride_d,
    tokens_ptr,  # [B, N] padded / [T] ragged int32/int64, node stride 1
    stride_tb,
    parents_ptr,  # [B, N] or [N] padded / [T] ragged int32/int64 as given
    stride_pb,  # 0: one parents row for the batch
    cu_ptr,  # [B] int32/int64 inclusive cumsum of N_b (ragged), None: padded
    num_tokens,  # T (ragged)
    temp_ptr,  # [B] float temperature when the rows hold logits, None: probabilities
    greedy_ptr,  # [B] bool, or None (read with the filters only: see cut_ptr)
    top_k_ptr,  # [B] int, 0 = off; None: no filters (then every pointer below to scratch_ptr is None)
    top_p_ptr,  # [B] float, 1 = off
    min_p_ptr,  # [B] float, 0 = off
    cut_ptr,  # [R, 2] fp32 out: (kept sum, cut) of the target rows the kernels read (see below)
    d_cut_ptr,  # [R, 2] fp32 out: of the draft rows
    scratch_ptr,  # [B, cap] fp32: the searches' candidates (sampling_kernels.pivot_search)
    cap,
    pick_ptr,  # [B, LMAX + 6] int64 out: nodes [LMAX+1], then L', path, K, L, shape ok
    keys_ptr,  # [B, >= LMAX, V] fp32 out: the keys of position m's rows, m < L' (the rest not written)
    N,
    LMAX,  # min(N, D): the longest path a request may have
    V,
    BLOCK_N: tl.constexpr,  # >= N
    BLOCK_V: tl.constexpr,
    CUT_BLOCK_V: tl.constexpr,  # of the filters' searches (sampling_kernels.search_block)
    PRECISE: tl.constexpr,
):
    """The request's shape, then the greedy pick of :func:`spec_samplers.tree.multipath.multipath_plan`
    (with :func:`~spec_samplers.tree.multipath.best_token`). The shape: K = the nodes whose parent
    is the root, L = n / K, every node i*L + d's parent (i*L + d - 1, 0 at d = 1) checked, and
    L <= LMAX; so a parents tensor needs no host read (a request of another shape is flagged: it
    emits nothing). The pick: at depth m, the alive paths' tokens whose draft probability is
    positive compete; the highest key wins, then the lowest token id; the paths with another
    token drop out. Writes the node whose rows each position reads, the picked path's length L',
    its lowest path index, and the keys of every position before L'
    (:func:`~spec_samplers.tree.multipath.order_keys`), which the launcher sorts.

    With the request filters (``top_k_ptr``), the pick also writes the (kept sum, cut) of every
    row it or the verification reads (:func:`_node_cuts`), before it reads them: both rows of
    each node on the picked path, the last one reached included (the residual at tau = L'), and,
    for a greedy request, every target row (its argmax walk may leave the picked path). So the
    filters cost no launch of their own (the tree entries' ``tree_filter_cut_kernel`` computes
    every row's, in a grid of its own). Grid (B,)."""
    LOGITS: tl.constexpr = temp_ptr is not None
    RAGGED: tl.constexpr = cu_ptr is not None
    FILTERS: tl.constexpr = top_k_ptr is not None
    b = tl.program_id(0).to(tl.int64)
    S = LMAX + 6
    start, n, temp, greedy = _request(b, cu_ptr, num_tokens, temp_ptr, greedy_ptr, N, RAGGED, LOGITS)
    # the shape, from the parents as given (cleaned: a parent outside [0, j) is none)
    jj = tl.arange(0, BLOCK_N)  # node jj + 1
    exists = jj < n
    if RAGGED:
        flat = start + jj
    else:
        flat = b * stride_pb + jj
    par = tl.load(parents_ptr + tl.where(exists, flat, 0), mask=exists, other=-1).to(tl.int64)
    present = exists & (par >= 0) & (par <= jj)
    count = tl.sum(present.to(tl.int64), axis=0)
    K = tl.sum((present & (par == 0)).to(tl.int64), axis=0)
    L = count // tl.maximum(K, 1)
    expected = tl.where(jj % tl.maximum(L, 1) == 0, 0, jj)
    bad = (jj < N) & ((present.to(tl.int32) != (jj < count).to(tl.int32)) | (present & (par != expected)))
    shape_ok = (K * L == count) & (L <= LMAX) & (tl.sum(bad.to(tl.int32), axis=0) == 0)
    kk = tl.arange(0, BLOCK_N)  # path kk
    in_k = kk < K
    # (masks: a scalar condition is broadcast to the block first; Triton 3.9's interpreter refuses
    # a block-and-scalar mask)
    root_row = _node_row(b, 0, start, n, N, RAGGED)
    going = (root_row >= 0) & shape_ok
    alive = in_k & ((kk * 0 + going.to(tl.int32)) != 0)
    node = (b * 0).to(tl.int64)
    length = (b * 0).to(tl.int64)
    tl.store(pick_ptr + b * S, node)
    cut_node = (b * 0 - 1).to(tl.int64)  # the node whose rows' cuts were written last
    # (one step more than the walk: the cuts of the last node reached)
    for m in range(0, LMAX + 1):
        row = _node_row(b, node, start, n, N, RAGGED)
        if FILTERS:
            if node != cut_node:
                _node_cuts(target_ptr, stride_t, cut_ptr, row, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b,
                           scratch_ptr, cap, V, CUT_BLOCK_V, PRECISE)  # fmt: skip
                _node_cuts(draft_ptr, stride_d, d_cut_ptr, row, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b,
                           scratch_ptr, cap, V, CUT_BLOCK_V, PRECISE)  # fmt: skip
                cut_node = node
        if m < LMAX:
            within = m < L
            t_off = tl.maximum(row, 0) * stride_t
            d_off = tl.maximum(row, 0) * stride_d
            t_st = _stats(target_ptr, t_off, row >= 0, temp, V, cut_ptr, row, BLOCK_V, LOGITS, PRECISE)
            d_st = _stats(draft_ptr, d_off, row >= 0, temp, V, d_cut_ptr, row, BLOCK_V, LOGITS, PRECISE)
            raw = _token_at(tokens_ptr, b, start, kk * L + m + 1, stride_tb, in_k & ((kk * 0 + m) < L), RAGGED)
            valid = in_k & (raw >= 0) & (raw < V)
            cand = tl.where(valid, raw, 0)
            q_c = _load(target_ptr, t_off, cand, valid & (cand * 0 + row >= 0), t_st, LOGITS, PRECISE)
            p_c = _load(draft_ptr, d_off, cand, valid & (cand * 0 + row >= 0), d_st, LOGITS, PRECISE)
            ok = alive & valid & (p_c > 0) & going & within
            drawn = tl.max(ok.to(tl.int32), axis=0) > 0
            length = tl.where(going & within, m, length)
            moves = going & within & drawn
            going = going & (drawn | ~within)
            key = tl.where(ok, _key(q_c, p_c), -1.0)
            top = tl.max(key, axis=0)
            x = tl.min(tl.where(ok & (key == top), cand, _BIG_TOKEN), axis=0)
            x = tl.where(moves, x, 0)
            alive = tl.where(within, ok & (cand == x), alive)
            first = tl.min(tl.where(alive, kk, BLOCK_N), axis=0)
            if moves:  # position m is verified: its keys, for the order's CDF
                k_off = (b * LMAX + m) * V
                for s in range(0, V, BLOCK_V):
                    offs = s + tl.arange(0, BLOCK_V)
                    msk = offs < V
                    q = _load(target_ptr, t_off, offs, kc.mask_if(row >= 0, msk), t_st, LOGITS, PRECISE)
                    p = _load(draft_ptr, d_off, offs, kc.mask_if(row >= 0, msk), d_st, LOGITS, PRECISE)
                    tl.store(keys_ptr + k_off + offs, _key(q, p), mask=msk)
            node = tl.where(moves, tl.minimum(first, tl.maximum(K - 1, 0)).to(tl.int64) * L + m + 1, node)
            tl.store(pick_ptr + b * S + m + 1, node)
    length = tl.where(going, L, length)
    length = tl.where(root_row >= 0, length, 0)
    tl.store(pick_ptr + b * S + LMAX + 1, length)
    # the node at depth L' is the last one reached (the walk does not move after it ends)
    tl.store(pick_ptr + b * S + LMAX + 2, tl.where(length > 0, (node - 1) // tl.maximum(L, 1), -1))
    tl.store(pick_ptr + b * S + LMAX + 3, K)
    tl.store(pick_ptr + b * S + LMAX + 4, L)
    tl.store(pick_ptr + b * S + LMAX + 5, shape_ok.to(tl.int64))
    if FILTERS:
        if greedy != 0:  # the verification's argmax walk may read any node's target row
            for j in range(0, N + 1):
                _node_cuts(target_ptr, stride_t, cut_ptr, _node_row(b, j, start, n, N, RAGGED), temp_ptr, top_k_ptr,
                           top_p_ptr, min_p_ptr, b, scratch_ptr, cap, V, CUT_BLOCK_V, PRECISE)  # fmt: skip


@triton.jit
def _order_cdf(draft_ptr, d_off, d_ok, d_st, order_ptr, feq_ptr, flt_ptr, f_off, V,
               BLOCK_V: tl.constexpr, LOGITS: tl.constexpr, PRECISE: tl.constexpr):  # fmt: skip
    """(F(x), F(x-)) of one row into the scratch at ``f_off``, by token
    (:func:`spec_samplers.tree.multipath.order_cdf`): the draft mass in the sorted order, suffix
    sums in float64 from the worst token up, rounded once to fp32."""
    carry = tl.zeros([], tl.float64)
    num_blocks = tl.cdiv(V, BLOCK_V)
    for i in range(0, num_blocks):
        offs = (num_blocks - 1 - i) * BLOCK_V + tl.arange(0, BLOCK_V)
        msk = offs < V
        tok = tl.load(order_ptr + f_off + offs, mask=msk, other=0)
        mass = _load(draft_ptr, d_off, tok, kc.mask_if(d_ok, msk), d_st, LOGITS, PRECISE)
        mass = tl.where(msk, mass, 0.0).to(tl.float64)
        worse_eq = tl.cumsum(mass, axis=0, reverse=True) + carry
        tl.store(feq_ptr + f_off + tok, worse_eq.to(tl.float32), mask=msk)
        tl.store(flt_ptr + f_off + tok, (worse_eq - mass).to(tl.float32), mask=msk)
        carry += tl.sum(mass, axis=0)
    tl.debug_barrier()  # the passes that follow read the entries other threads wrote


@triton.jit
def _greedy_walk(target_ptr, stride_t, cut_ptr, tokens_ptr, stride_tb, b, start, n, N, K, L, LMAX, V, temp, alive,
                 BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, RAGGED: tl.constexpr, LOGITS: tl.constexpr,
                 PRECISE: tl.constexpr):  # fmt: skip
    """The argmax walk of :func:`spec_samplers.tree.reference.rejection_tree_walk` on the K paths:
    from the root, the first path whose first token is the root row's argmax (and has mass), then
    down that path while each token is its parent row's argmax. Returns (depth reached, path,
    argmax of the stop node's target row, its max)."""
    kk = tl.arange(0, BLOCK_N)
    row = _node_row(b, 0, start, n, N, RAGGED)
    t_off = tl.maximum(row, 0) * stride_t
    t_st = _stats(target_ptr, t_off, row >= 0, temp, V, cut_ptr, row, BLOCK_V, LOGITS, PRECISE)
    amax, qmax = _row_argmax(target_ptr, t_off, alive & (row >= 0), V, t_st, LOGITS, PRECISE, BLOCK_V)
    path = (b * 0 - 1).to(tl.int64)
    depth = (b * 0).to(tl.int64)
    going = alive
    for m in range(0, LMAX):
        if going & (m < L):
            mine = (kk < K) & ((kk == path) | (m == 0))
            raw = _token_at(tokens_ptr, b, start, kk * L + m + 1, stride_tb, mine, RAGGED)
            valid = mine & (raw >= 0) & (raw < V)
            cand = tl.where(valid, raw, 0)
            q_c = _load(target_ptr, t_off, cand, valid & (cand * 0 + row >= 0), t_st, LOGITS, PRECISE)
            first = tl.min(tl.where(valid & (cand == amax) & (q_c > 0), kk, BLOCK_N), axis=0)
            going = first < BLOCK_N
            if going:
                path = first.to(tl.int64)
                depth = (b * 0 + m + 1).to(tl.int64)
                row = _node_row(b, path * L + m + 1, start, n, N, RAGGED)
                t_off = tl.maximum(row, 0) * stride_t
                t_st = _stats(target_ptr, t_off, row >= 0, temp, V, cut_ptr, row, BLOCK_V, LOGITS, PRECISE)
                amax, qmax = _row_argmax(target_ptr, t_off, row >= 0, V, t_st, LOGITS, PRECISE, BLOCK_V)
    return depth, path, amax, qmax


@triton.jit
def multipath_verify_kernel(
    target_ptr,  # [R, V] fp32/fp16/bf16 probabilities or logits, vocab stride 1
    stride_t,
    draft_ptr,  # [R, V], vocab stride 1
    stride_d,
    tokens_ptr,  # [B, N] padded / [T] ragged int32/int64, node stride 1
    stride_tb,
    cu_ptr,  # [B] ragged, None: padded
    num_tokens,  # T (ragged)
    temp_ptr,  # [B] float when the rows hold logits, None: probabilities
    cut_ptr,  # [R, 2] fp32 (kept sum, cut) of the target rows (multipath_pick_kernel), None: no filters
    d_cut_ptr,  # [R, 2] fp32 of the draft rows, None: no filters
    greedy_ptr,  # [B] bool, or None
    seed_ptr,  # [B] int64
    offset_ptr,  # [B] int64, None: 0
    pick_ptr,  # [B, LMAX + 6] int64 from multipath_pick_kernel
    order_ptr,  # [B, >= LMAX, V] int64: position m's tokens best first (the keys sorted, stable)
    feq_ptr,  # [B, >= LMAX, V] fp32 scratch: F(x) of position m's rows (order_cdf)
    flt_ptr,  # [B, >= LMAX, V] fp32 scratch: F(x-)
    state_ptr,  # [B, LMAX+1, 4] fp32 scratch: (a, r, rho, Z) at position m
    resid_ptr,  # [B, V] fp32 scratch: the residual at tau
    out_ptr,  # [B, D+1] int64 out: TreeOutput.token_ids
    nodes_ptr,  # [B, D] int64 out: TreeOutput.node_ids
    counts_ptr,  # [2 + >= D] int64 sampler counters, or None
    N,
    LMAX,
    V,
    max_depth,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Block verification on the picked path against p~ (the body of
    :func:`spec_samplers.tree.multipath.multipath_plan` after the pick), the accepted length tau
    (``multipath_tree_reference``), the final draw from the residual at tau by the package's
    two-level race (:func:`spec_samplers.output.final_draw`; greedy rows: the argmax walk), and
    the output row and counters (:func:`spec_samplers.output.finish_walk`). Grid (B,)."""
    tl.static_assert(BLOCK_V == _RACE_GROUP)
    LOGITS: tl.constexpr = temp_ptr is not None
    RAGGED: tl.constexpr = cu_ptr is not None
    b = tl.program_id(0).to(tl.int64)
    S = LMAX + 6
    start, n, temp, greedy = _request(b, cu_ptr, num_tokens, temp_ptr, greedy_ptr, N, RAGGED, LOGITS)
    seed = tl.load(seed_ptr + b)
    offset = (b * 0).to(tl.int64)
    if offset_ptr is not None:
        offset = tl.load(offset_ptr + b)
    length = tl.load(pick_ptr + b * S + LMAX + 1)
    K = tl.load(pick_ptr + b * S + LMAX + 3)
    L = tl.load(pick_ptr + b * S + LMAX + 4)
    # a request of another shape than K paths (flagged by the pick) emits nothing
    alive = (_node_row(b, 0, start, n, N, RAGGED) >= 0) & (tl.load(pick_ptr + b * S + LMAX + 5) != 0)
    a = tl.full([], 0.0, tl.float32)
    r = tl.full([], 1.0, tl.float32)
    rho = tl.full([], 1.0, tl.float32)
    tau = (b * 0).to(tl.int64)
    for m in range(0, LMAX + 1):
        st = state_ptr + (b * (LMAX + 1) + m) * 4
        tl.store(st, a)
        tl.store(st + 1, r)
        tl.store(st + 2, rho)
        tl.store(st + 3, 0.0)
        if m < length:  # a drawable token follows: Z_m, h_m and the step to the picked token
            row = _node_row(b, tl.load(pick_ptr + b * S + m), start, n, N, RAGGED)
            ok = row >= 0
            t_off = tl.maximum(row, 0) * stride_t
            d_off = tl.maximum(row, 0) * stride_d
            t_st = _stats(target_ptr, t_off, ok, temp, V, cut_ptr, row, BLOCK_V, LOGITS, PRECISE)
            d_st = _stats(draft_ptr, d_off, ok, temp, V, d_cut_ptr, row, BLOCK_V, LOGITS, PRECISE)
            f_off = (b * LMAX + m) * V
            _order_cdf(draft_ptr, d_off, ok, d_st, order_ptr, feq_ptr, flt_ptr, f_off, V, BLOCK_V, LOGITS, PRECISE)
            h_one = _power_sum(a * 0.0 + 1.0, a, K)
            z64 = tl.zeros([], tl.float64)
            for s in range(0, V, BLOCK_V):
                offs = s + tl.arange(0, BLOCK_V)
                msk = offs < V
                q = _load(target_ptr, t_off, offs, kc.mask_if(ok, msk), t_st, LOGITS, PRECISE)
                p = _load(draft_ptr, d_off, offs, kc.mask_if(ok, msk), d_st, LOGITS, PRECISE)
                fe = tl.load(feq_ptr + f_off + offs, mask=msk, other=0.0)
                fl = tl.load(flt_ptr + f_off + offs, mask=msk, other=0.0)
                res = tl.maximum(rho * q - _skewed(p, fe, fl, a, r, h_one, K), 0.0)
                z64 += tl.sum(tl.where(msk, res, 0.0).to(tl.float64), axis=0)
            z = z64.to(tl.float32)
            tl.store(st + 3, z)
            if m >= 1:  # h_m = Z / (Z + 1 - rho), 1 where rho >= 1 (reference.block_thresholds)
                full = rho >= 1.0
                h = tl.where(full, 1.0, tl.math.div_rn(z, tl.where(full, 1.0, z + (1.0 - rho))))
                tau = tl.where(_accept_uniform(seed, offset, m) < h, m, tau)
            nxt = tl.load(pick_ptr + b * S + m + 1)
            x = _token_at(tokens_ptr, b, start, nxt, stride_tb, nxt >= 1, RAGGED)
            q_x = _load(target_ptr, t_off, x, ok, t_st, LOGITS, PRECISE)
            p_x = _load(draft_ptr, d_off, x, ok, d_st, LOGITS, PRECISE)
            fe_x = tl.load(feq_ptr + f_off + x)
            fl_x = tl.load(flt_ptr + f_off + x)
            ps_x = _skewed(p_x, fe_x, fl_x, a, r, h_one, K)
            ratio = tl.where(ps_x > 0, tl.math.div_rn(q_x, tl.where(ps_x > 0, ps_x, 1.0)), 0.0)
            rho = tl.where(rho > 0, tl.minimum(rho * ratio, 1.0), 0.0)
            den = a + r * fe_x
            safe = tl.where(den > 0, den, 1.0)
            a, r = tl.math.div_rn(a + r * fl_x, safe), tl.math.div_rn(r * p_x, safe)
        elif (m == length) & (m >= 1):  # the picked path ends here (h = rho), at the paths' end too
            tau = tl.where(_accept_uniform(seed, offset, m) < rho, m, tau)
    tau = tl.where(alive, tau, 0)
    # the residual at tau: (rho q - p~)+ while a token followed and it has mass, else q; level 1
    # of the race group by group as it is written
    st = state_ptr + (b * (LMAX + 1) + tau) * 4
    a_t = tl.load(st)
    r_t = tl.load(st + 1)
    rho_t = tl.load(st + 2)
    use_resid = (tau < length) & (tl.load(st + 3) > 0)
    row = _node_row(b, tl.load(pick_ptr + b * S + tau), start, n, N, RAGGED)
    ok = row >= 0
    t_off = tl.maximum(row, 0) * stride_t
    d_off = tl.maximum(row, 0) * stride_d
    t_st = _stats(target_ptr, t_off, ok, temp, V, cut_ptr, row, BLOCK_V, LOGITS, PRECISE)
    d_st = _stats(draft_ptr, d_off, ok, temp, V, d_cut_ptr, row, BLOCK_V, LOGITS, PRECISE)
    f_off = (b * LMAX + tl.minimum(tau, tl.maximum(LMAX - 1, 0))) * V
    h_one = _power_sum(a_t * 0.0 + 1.0, a_t, K)
    base = tau << 32
    best = -1.0
    best_idx = 0
    race_best = tl.full([], -1.0, tl.float64)
    group = (b * 0).to(tl.int64)
    for s in range(0, V, BLOCK_V):
        offs = s + tl.arange(0, BLOCK_V)
        msk = offs < V
        q = _load(target_ptr, t_off, offs, kc.mask_if(ok, msk), t_st, LOGITS, PRECISE)
        out = q
        if use_resid:
            p = _load(draft_ptr, d_off, offs, kc.mask_if(ok, msk), d_st, LOGITS, PRECISE)
            fe = tl.load(feq_ptr + f_off + offs, mask=msk, other=0.0)
            fl = tl.load(flt_ptr + f_off + offs, mask=msk, other=0.0)
            out = tl.maximum(rho_t * q - _skewed(p, fe, fl, a_t, r_t, h_one, K), 0.0)
        out = tl.where(msk, out, 0.0)
        tl.store(resid_ptr + b * V + offs, out, mask=msk)
        best, best_idx = kc.fold_argmax(tl.where(msk, q, -1.0), s, best, best_idx)
        g = (b * 0 + s // BLOCK_V).to(tl.int64)
        e = race_exponential(seed, offset, base + _LEVEL1_COUNTER, g, _STREAM_RECOVER, PRECISE)
        race_key = tl.sum(out.to(tl.float64), 0) / e.to(tl.float64)
        group = tl.where(race_key > race_best, g, group)
        race_best = tl.maximum(race_best, race_key)
    tl.debug_barrier()  # level 2 re-reads the winning group this program wrote
    offs = group * BLOCK_V + tl.arange(0, BLOCK_V)
    w = tl.load(resid_ptr + b * V + offs, mask=offs < V, other=0.0)
    token = group * BLOCK_V + race_in_group(w, offs < V, seed, offset, base, _STREAM_RECOVER, PRECISE)
    final = tl.where(best > 0.0, token, -1)
    path = tl.load(pick_ptr + b * S + LMAX + 2)
    if greedy != 0:
        tau, path, amax, qmax = _greedy_walk(
            target_ptr, stride_t, cut_ptr, tokens_ptr, stride_tb, b, start, n, N, K, L, LMAX, V, temp, alive,
            BLOCK_N, BLOCK_V, RAGGED, LOGITS, PRECISE,
        )  # fmt: skip
        final = tl.where(qmax > 0.0, amax, -1)
    final = tl.where(alive, final, -1)
    # the path's nodes and tokens in slots 0 .. tau-1, then the tail (spec_samplers.output.tree_output)
    for s in range(0, max_depth, BLOCK_D):
        pos = s + tl.arange(0, BLOCK_D)
        on_path = pos < tau
        node_p = tl.maximum(path, 0) * L + pos + 1
        tok = _token_at(tokens_ptr, b, start, node_p, stride_tb, on_path, RAGGED)
        tl.store(out_ptr + b * (max_depth + 1) + pos, tok, mask=on_path)
        tl.store(nodes_ptr + b * max_depth + pos, node_p, mask=on_path)
    _write_tail(out_ptr, nodes_ptr, counts_ptr, b, tau, final, max_depth, BLOCK_D)
