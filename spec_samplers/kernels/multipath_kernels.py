"""Triton kernels of greedy multi-path block verification (GBV): the twins of
:func:`spec_samplers.tree.multipath.multipath_plan` and ``multipath_tree_reference``, operation
for operation, so that they give the reference's tokens.

Two launches, grid (B,), one program per request, around the one step that needs a sort:

1. ``multipath_pick_kernel`` walks the K paths greedily. The pick reads only the keys
   min(1, q/p) of the (at most K) alive candidates at each depth, gathered scalars, so it needs
   no vocabulary pass. It writes the node whose rows each position reads, the picked path's
   length L' and its path index.
2. The launcher computes the order's CDF (F(x), F(x-)) of the L visited rows with the
   reference's own function (:func:`spec_samplers.tree.multipath.order_cdf`: a stable sort and
   a float64 suffix sum per row). Every token's skewed probability needs its place in the order,
   so this is a sort (or a rank query) of each visited row; sharing the function keeps the CDF
   values bit-identical to the reference's.
3. ``multipath_verify_kernel`` runs block verification on the picked path: per position one
   vocabulary pass (p~ = p H(a + r F(x), a + r F(x-)) / H(1, a) and Z = sum (rho q - p~)+,
   accumulated in float64 and rounded once), the scalar recursions of rho, a and r at the picked
   token, the accept tests with the chain's uniforms, then one more pass that writes the
   residual at the accepted length tau and the argmax of its target row. The launcher draws the
   final token with the package's race (:func:`spec_samplers.output.finish_walk`).

``enable_fp_fusion=False`` at launch: a + r F and rho q - p~ must round like the reference's
separate multiply and add (an FMA would change the last bit and, rarely, a token).
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers.kernels import common as kc
from spec_samplers.kernels.rng import random_words, uniform_from_words
from spec_samplers.rng import STREAM_ACCEPT

_STREAM_ACCEPT = tl.constexpr(STREAM_ACCEPT)
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
def multipath_pick_kernel(
    target_ptr,  # [R, V] fp32/fp16/bf16, vocab stride 1
    stride_t,
    draft_ptr,  # [R', V], vocab stride 1
    stride_d,
    rows_ptr,  # [B, N+1] int64 target row of node j (-1: none)
    drows_ptr,  # [B, N+1] int64 draft row of node j
    tokens_ptr,  # [B, N] int64, path i's tokens at i*L .. i*L + L - 1
    depth_ptr,  # [B, N+1] int64
    nodes_ptr,  # [B, L+1] int64 out: the node whose rows position m reads (0: the root)
    len_ptr,  # [B] int64 out: the picked path's length L'
    path_ptr,  # [B] int64 out: the lowest-index path of the picked prefix (-1 when L' = 0)
    K,
    L,
    V,
    BLOCK_K: tl.constexpr,
):
    """The greedy pick of :func:`spec_samplers.tree.multipath.multipath_plan` (with
    :func:`~spec_samplers.tree.multipath.best_token`): at depth m, the alive paths' tokens whose
    draft probability is positive compete; the highest key wins, then the lowest token id; the
    paths with another token drop out. Grid (B,)."""
    b = tl.program_id(0).to(tl.int64)
    N = K * L
    kk = tl.arange(0, BLOCK_K)
    in_k = kk < K
    # (masks: a scalar condition is broadcast to the block first; Triton 3.9's interpreter refuses
    # a block-and-scalar mask)
    root_row = tl.load(rows_ptr + b * (N + 1))
    going = root_row >= 0
    first_depth = tl.load(depth_ptr + b * (N + 1) + 1 + kk * L, mask=in_k, other=0)
    alive = in_k & going & (first_depth == 1)
    node = (b * 0).to(tl.int64)
    length = (b * 0).to(tl.int64)
    tl.store(nodes_ptr + b * (L + 1), node)
    for m in range(0, L):
        t_row = tl.load(rows_ptr + b * (N + 1) + node)
        d_row = tl.load(drows_ptr + b * (N + 1) + node)
        raw = tl.load(tokens_ptr + b * N + kk * L + m, mask=in_k, other=-1)
        valid = in_k & (raw >= 0) & (raw < V)
        cand = tl.where(valid, raw, 0)
        q_c = kc.clean(
            tl.load(
                target_ptr + tl.maximum(t_row, 0) * stride_t + cand, mask=valid & (cand * 0 + t_row >= 0), other=0.0
            )
        )
        p_c = kc.clean(
            tl.load(draft_ptr + tl.maximum(d_row, 0) * stride_d + cand, mask=valid & (cand * 0 + d_row >= 0), other=0.0)
        )
        ok = alive & valid & (p_c > 0) & going
        drawn = tl.max(ok.to(tl.int32), axis=0) > 0
        length = tl.where(going, m, length)
        going = going & drawn
        key = tl.where(ok, _key(q_c, p_c), -1.0)
        top = tl.max(key, axis=0)
        x = tl.min(tl.where(ok & (key == top), cand, _BIG_TOKEN), axis=0)
        x = tl.where(going, x, 0)
        alive = ok & (cand == x)
        first = tl.min(tl.where(alive, kk, K), axis=0)
        node = tl.where(going, tl.minimum(first, K - 1).to(tl.int64) * L + m + 1, node)
        tl.store(nodes_ptr + b * (L + 1) + m + 1, node)
    length = tl.where(going, L, length)
    length = tl.where(root_row >= 0, length, 0)
    tl.store(len_ptr + b, length)
    # the node at depth L' is the last one reached (the walk does not move after it ends)
    tl.store(path_ptr + b, tl.where(length > 0, (node - 1) // L, -1))


@triton.jit
def multipath_verify_kernel(
    target_ptr,  # [R, V] fp32/fp16/bf16, vocab stride 1
    stride_t,
    draft_ptr,  # [R', V], vocab stride 1
    stride_d,
    rows_ptr,  # [B, N+1] int64
    drows_ptr,  # [B, N+1] int64
    tokens_ptr,  # [B, N] int64
    nodes_ptr,  # [B, L+1] int64 from multipath_pick_kernel
    len_ptr,  # [B] int64
    path_ptr,  # [B] int64
    feq_ptr,  # [B, L, V] fp32 F(x) of position m's rows (order_cdf)
    flt_ptr,  # [B, L, V] fp32 F(x-)
    seed_ptr,  # [B] int64
    offset_ptr,  # [B] int64
    state_ptr,  # [B, L+1, 4] fp32 scratch: (a, r, rho, Z) at position m
    resid_ptr,  # [B, V] fp32 out: the residual at tau
    stop_ptr,  # [B] int64 out: the stop node (-1: the request emits nothing)
    qok_ptr,  # [B] int8 out: the target row at tau has mass
    amax_ptr,  # [B] int64 out: its argmax
    K,
    L,
    V,
    BLOCK_V: tl.constexpr,
):
    """Block verification on the picked path against p~ (the body of
    :func:`spec_samplers.tree.multipath.multipath_plan` after the pick, then the tail of
    ``multipath_tree_reference`` up to the final draw). Grid (B,)."""
    b = tl.program_id(0).to(tl.int64)
    N = K * L
    seed = tl.load(seed_ptr + b)
    offset = tl.load(offset_ptr + b)
    alive = tl.load(rows_ptr + b * (N + 1)) >= 0
    length = tl.load(len_ptr + b)
    a = tl.full([], 0.0, tl.float32)
    r = tl.full([], 1.0, tl.float32)
    rho = tl.full([], 1.0, tl.float32)
    tau = (b * 0).to(tl.int64)
    for m in range(0, L):
        st = state_ptr + (b * (L + 1) + m) * 4
        tl.store(st, a)
        tl.store(st + 1, r)
        tl.store(st + 2, rho)
        tl.store(st + 3, 0.0)
        if m < length:  # a drawable token follows: Z_m, h_m and the step to the picked token
            node = tl.load(nodes_ptr + b * (L + 1) + m)
            t_off = tl.maximum(tl.load(rows_ptr + b * (N + 1) + node), 0) * stride_t
            d_off = tl.maximum(tl.load(drows_ptr + b * (N + 1) + node), 0) * stride_d
            t_ok = tl.load(rows_ptr + b * (N + 1) + node) >= 0
            d_ok = tl.load(drows_ptr + b * (N + 1) + node) >= 0
            f_off = (b * L + m) * V
            h_one = _power_sum(a * 0.0 + 1.0, a, K)
            z64 = tl.zeros([], tl.float64)
            for s in range(0, V, BLOCK_V):
                offs = s + tl.arange(0, BLOCK_V)
                msk = offs < V
                q = kc.clean(tl.load(target_ptr + t_off + offs, mask=msk & ((offs * 0 + t_ok) != 0), other=0.0))
                p = kc.clean(tl.load(draft_ptr + d_off + offs, mask=msk & ((offs * 0 + d_ok) != 0), other=0.0))
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
            nxt = tl.load(nodes_ptr + b * (L + 1) + m + 1)
            x = tl.load(tokens_ptr + b * N + nxt - 1)
            q_x = kc.clean(tl.load(target_ptr + t_off + x, mask=t_ok, other=0.0))
            p_x = kc.clean(tl.load(draft_ptr + d_off + x, mask=d_ok, other=0.0))
            fe_x = tl.load(feq_ptr + f_off + x)
            fl_x = tl.load(flt_ptr + f_off + x)
            ps_x = _skewed(p_x, fe_x, fl_x, a, r, h_one, K)
            ratio = tl.where(ps_x > 0, tl.math.div_rn(q_x, tl.where(ps_x > 0, ps_x, 1.0)), 0.0)
            rho = tl.where(rho > 0, tl.minimum(rho * ratio, 1.0), 0.0)
            den = a + r * fe_x
            safe = tl.where(den > 0, den, 1.0)
            a, r = tl.math.div_rn(a + r * fl_x, safe), tl.math.div_rn(r * p_x, safe)
        elif (m == length) & (m >= 1):  # the picked path ends here: h = rho
            tau = tl.where(_accept_uniform(seed, offset, m) < rho, m, tau)
    st = state_ptr + (b * (L + 1) + L) * 4
    tl.store(st, a)
    tl.store(st + 1, r)
    tl.store(st + 2, rho)
    tl.store(st + 3, 0.0)
    if (length == L) & (L >= 1):  # the paths' end: h_L = rho_L
        tau = tl.where(_accept_uniform(seed, offset, L) < rho, L, tau)
    tau = tl.where(alive, tau, 0)
    # the residual at tau: (rho q - p~)+ while a token followed and it has mass, else q
    st = state_ptr + (b * (L + 1) + tau) * 4
    a_t = tl.load(st)
    r_t = tl.load(st + 1)
    rho_t = tl.load(st + 2)
    use_resid = (tau < length) & (tl.load(st + 3) > 0)
    node = tl.load(nodes_ptr + b * (L + 1) + tau)
    t_row = tl.load(rows_ptr + b * (N + 1) + node)
    d_row = tl.load(drows_ptr + b * (N + 1) + node)
    t_off = tl.maximum(t_row, 0) * stride_t
    d_off = tl.maximum(d_row, 0) * stride_d
    f_off = (b * L + tl.minimum(tau, tl.maximum(L - 1, 0))) * V
    h_one = _power_sum(a_t * 0.0 + 1.0, a_t, K)
    best = -1.0
    best_idx = 0
    for s in range(0, V, BLOCK_V):
        offs = s + tl.arange(0, BLOCK_V)
        msk = offs < V
        q = kc.clean(tl.load(target_ptr + t_off + offs, mask=msk & (offs * 0 + t_row >= 0), other=0.0))
        out = q
        if use_resid:
            p = kc.clean(tl.load(draft_ptr + d_off + offs, mask=msk & (offs * 0 + d_row >= 0), other=0.0))
            fe = tl.load(feq_ptr + f_off + offs, mask=msk, other=0.0)
            fl = tl.load(flt_ptr + f_off + offs, mask=msk, other=0.0)
            out = tl.maximum(rho_t * q - _skewed(p, fe, fl, a_t, r_t, h_one, K), 0.0)
        tl.store(resid_ptr + b * V + offs, out, mask=msk)
        best, best_idx = kc.fold_argmax(tl.where(msk, q, -1.0), s, best, best_idx)
    path = tl.load(path_ptr + b)
    stop = tl.where(tau > 0, tl.maximum(path, 0) * L + tau, 0)
    tl.store(stop_ptr + b, tl.where(alive, stop, -1))
    tl.store(qok_ptr + b, (best > 0.0).to(tl.int8))  # type: ignore[attr-defined]  # a tensor after the loop
    tl.store(amax_ptr + b, best_idx.to(tl.int64))  # type: ignore[attr-defined]
