"""numba kernels of the tree verifiers' CPU path (docs/cpu.md, "Tree verification").

Twins of :func:`spec_samplers.tree.reference.rejection_tree_reference` (``rejection_tree_kernel``)
and :func:`spec_samplers.tree.reference.typical_tree_reference` (``typical_tree_kernel``): one loop
over the requests, each request's walk node by node with explicit loops, every float the
reference's operation in its precision (fp32 accept ratios, residual entries and masses' inputs,
fp64 masses rounded to fp32). The random numbers are :mod:`spec_samplers.rng`'s (Philox in the
kernel): node j's accept uniform is counter j - 1 on STREAM_ACCEPT, the final draw the recovery race
at the stop node's depth (:func:`spec_samplers.output.final_draw`), by ``_numba_kernels._recover``.
The kernels also write the output (``output.path_to`` and ``output.tree_output``'s rule), so a call
runs no PyTorch op after the kernel.

What can differ from the reference (docs/cpu.md, "Tokens"): a residual's fp64 mass is summed in
another order than ``torch.sum``'s (~2**-53 relative: it moves the fp32 mass only within that of an
fp32 rounding boundary), the race's and the entropy's as in the chain kernels.

Loops over a row index a slice from 0 (numba's negative-index wraparound of ``row[lo + i]`` made
LLVM gather the entries one lane at a time).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from spec_samplers.constants import RESIDUAL_MASS_EPS
from spec_samplers.cpu._numba_kernels import (
    _F0,
    _ONE32,
    _STREAM_ACCEPT,
    _STREAM_RECOVER,
    RES_Q,
    _argmax_clean,
    _clean,
    _entropy_bounds,
    _recover,
    _typical_threshold,
    _uniform,
    _words,
)

#: RESIDUAL_MASS_EPS as the reference compares an fp32 mass with it (torch rounds the scalar to fp32)
_EPS32 = np.float32(RESIDUAL_MASS_EPS)

#: entries of the typical kernel's fp64 and fp32 entropy buffers (_numba_kernels' block sizes)
_ENTROPY_BLOCK = 2048
_BOUNDS_BLOCK = 512


@njit(cache=True, error_model="numpy")
def _residual_row(r, from_target, z, p, has_p, rem, out):
    """out[v] <- the reference's residual after a rejection, before the scatter at the child:
    ``r / z`` (point mass) or ``(r / z - p / rem).clamp_min(0)``, fp32 operations in that order
    (``r``: a target row, cleaned as read when ``from_target``, else a residual row; ``p`` a draft
    row, cleaned as read). One loop per case: the case is a constant inside each (vectorised)."""
    n = out.shape[0]
    if has_p:
        if from_target:
            for v in range(n):
                a = _clean(np.float32(r[v])) / z - _clean(np.float32(p[v])) / rem
                out[v] = a if a > _F0 else _F0
        else:
            for v in range(n):
                a = r[v] / z - _clean(np.float32(p[v])) / rem
                out[v] = a if a > _F0 else _F0
    elif from_target:
        for v in range(n):
            out[v] = _clean(np.float32(r[v])) / z
    else:
        for v in range(n):
            out[v] = r[v] / z


@njit(cache=True, fastmath={"reassoc"})
def _mass64(r):
    """fp64 sum of the fp32 row r (reference._mass before its fp32 rounding; vectorised, another
    order than torch.sum's: module docstring)."""
    acc = 0.0
    for v in range(r.shape[0]):
        acc += np.float64(r[v])
    return acc


@njit(cache=True)
def _has_mass(q):
    """Whether the clean row q has an entry > 0 (reference: ``amax > 0``)."""
    for v in range(q.shape[0]):
        if _clean(np.float32(q[v])) > _F0:
            return True
    return False


@njit(cache=True, inline="always")
def _write_tree(token_ids, node_ids, b, stop, final, tokens, parents, depth, nodes):
    """output.path_to then output.tree_output for request b (``nodes``: a [D + 1] buffer)."""
    D = node_ids.shape[1]
    N = tokens.shape[1]
    for i in range(D + 1):
        nodes[i] = -1
    if stop < 0:  # no root row: the request emits nothing
        for i in range(D + 1):
            token_ids[b, i] = -1
        for i in range(D):
            node_ids[b, i] = -1
        return
    node = stop
    for _ in range(D):  # path_to: node n at slot depth(n) - 1, slot D is scratch
        if node > 0:
            slot = depth[b, node] - 1
            slot = min(max(slot, 0), D)
        else:
            slot = D
        nodes[slot] = node
        if N == 0:
            break
        if node > 0:
            node = parents[b, node - 1]
    length = 0
    for i in range(D):
        n = nodes[i]
        node_ids[b, i] = n
        if n > 0:
            token_ids[b, i] = tokens[b, n - 1]
            length += 1
        else:
            token_ids[b, i] = -1
    token_ids[b, D] = -1
    token_ids[b, length] = final


@njit(cache=True, error_model="numpy")
def rejection_tree_kernel(
    target,  # [R, V] fp32 (R > 0)
    target_rows,  # [B, N+1] int64, -1 = none
    draft,  # [R', V] fp32 (R' > 0; a stand-in row when not has_draft)
    draft_rows,  # [B, N+1] int64
    has_draft,  # bool: False for point-mass drafts (draft_probs None or "deterministic")
    without_replacement,  # bool: the policy is "without_replacement"
    tokens,  # [B, N] int64 (raw)
    parents,  # [B, N] int64, cleaned
    depth,  # [B, N+1] int64
    max_depth,  # int: D
    is_greedy,  # [B] bool
    has_greedy,  # bool
    seeds,  # [B] uint64
    offsets,  # [B] uint64
    token_ids,  # [B, D+1] int64 out
    node_ids,  # [B, D] int64 out
):
    """tree.reference.rejection_tree_walk then output.finish_walk, one request per iteration:
    gathered scalars for every tried child, one vocabulary pass per rejected child (the residual
    into a scratch row, its fp64 mass), the race at the stop node's depth."""
    B, N = tokens.shape
    V = target.shape[1]
    bufs = np.empty((2, V), dtype=np.float32)  # the residual and the candidate after a rejection
    nodes = np.empty(max_depth + 1, dtype=np.int64)
    for b in range(B):
        seed, offset = seeds[b], offsets[b]
        greedy = has_greedy and is_greedy[b]
        root = target_rows[b, 0]
        if root < 0:
            _write_tree(token_ids, node_ids, b, -1, -1, tokens, parents, depth, nodes)
            continue
        cur = 0
        # the residual: the target row src (cleaned as read; -1: a zero row) or bufs[buf]
        src = root
        buf = -1
        z = _ONE32
        removed = _F0
        q_argmax = -1  # argmax of the current node's target row (greedy rows, computed when needed)
        for j in range(1, N + 1):
            if parents[b, j - 1] != cur:
                continue
            dj = depth[b, j]
            if not (dj >= 1 and dj <= max_depth):
                continue
            tok = tokens[b, j - 1]
            valid = tok >= 0 and tok < V
            if not valid:
                continue  # (never accepted, the residual unchanged, nothing removed)
            # r_c: the residual at the child
            if buf >= 0:
                r_c = bufs[buf, tok]
            elif src >= 0:
                r_c = _clean(np.float32(target[src, tok]))
            else:
                r_c = _F0
            if greedy:
                # the first child equal to argmax q_u (r stays q_u on greedy rows)
                if q_argmax < 0:
                    q_argmax = _argmax_clean(target[src]) if src >= 0 else 0
                accept = tok == q_argmax and r_c > _F0
                ok = False
                p_drawn = _F0
                rem = _ONE32
                dr = -1
            else:
                dr = draft_rows[b, cur] if has_draft else -1
                if has_draft:
                    p_c = _clean(np.float32(draft[dr, tok])) if dr >= 0 else _F0
                else:
                    p_c = _ONE32
                p_drawn = p_c
                rem = _ONE32 - removed if without_replacement else _ONE32
                p_c = p_c / rem if rem > _F0 else _F0  # p'_i(c)
                ok = bool(p_c > _F0)
                accept = False
                if ok:
                    w = _words(seed, offset, np.int64(j - 1), _STREAM_ACCEPT)
                    accept = _uniform(w[0], w[1]) < r_c / (z * p_c)
            if ok and not accept:
                if buf >= 0 or src >= 0:
                    # the residual after rejecting c: (r / z - p')+ (point mass: r / z), 0 at c
                    nxt = 1 if buf == 0 else 0
                    out = bufs[nxt]
                    if buf >= 0:
                        _residual_row(bufs[buf], False, z, draft[max(dr, 0)], has_draft, rem, out)
                    else:
                        _residual_row(target[src], True, z, draft[max(dr, 0)], has_draft, rem, out)
                    out[tok] = _F0
                    new_z = np.float32(_mass64(out))
                    if new_z > _EPS32:
                        buf = nxt
                        z = new_z
                # (else r is a zero row: so is the candidate, whose mass 0 keeps r)
                if without_replacement:
                    removed = removed + p_drawn
            if accept:
                cur = j
                src = target_rows[b, j]
                buf = -1
                z = _ONE32
                removed = _F0
                q_argmax = -1
        # the final draw at the stop node (output.final_draw)
        if greedy:
            if src >= 0:
                arg = _argmax_clean(target[src])
                final = arg if _clean(np.float32(target[src, arg])) > _F0 else -1
            else:
                final = -1
        elif buf >= 0:  # a residual with mass > RESIDUAL_MASS_EPS (its target row has mass)
            row = bufs[buf]
            final = _recover(row, row, RES_Q, _ONE32, -1, False, seed, offset, depth[b, cur], _STREAM_RECOVER)
        elif src >= 0:  # the target row itself: -1 when it has no mass
            row = target[src]
            final = _recover(row, row, RES_Q, _ONE32, -1, False, seed, offset, depth[b, cur], _STREAM_RECOVER)
        else:
            final = -1
        _write_tree(token_ids, node_ids, b, cur, final, tokens, parents, depth, nodes)


@njit(cache=True)
def typical_tree_kernel(
    target,  # [R, V] fp32 (R > 0)
    target_rows,  # [B, N+1] int64, -1 = none
    tokens,  # [B, N] int64 (raw)
    parents,  # [B, N] int64, cleaned
    depth,  # [B, N+1] int64
    max_depth,  # int: D
    eps,  # float: ENTROPY_EPS_FP32
    threshold,  # float: posterior_threshold rounded to fp32
    alpha,  # float: posterior_alpha rounded to fp32
    token_ids,  # [B, D+1] int64 out
    node_ids,  # [B, D] int64 out
):
    """tree.reference.typical_tree_reference, one request per iteration: node j passes iff its
    parent passes and q_parent(x_j) > min(threshold, alpha exp(-H(q_parent))) (the chain kernel's
    test, _numba_kernels._typical_accepts, with each parent's entropy bounds and fp64 threshold
    computed at most once); the deepest passing node (lowest index on ties), argmax q there."""
    B, N = tokens.shape
    V = target.shape[1]
    terms = np.empty(_ENTROPY_BLOCK, dtype=np.float64)
    terms32 = np.empty(_BOUNDS_BLOCK, dtype=np.float32)
    passes = np.zeros(N + 1, dtype=np.bool_)
    hs = np.empty(N + 1, dtype=np.float64)  # the parent's fp32-pass -H and its error bound e
    es = np.empty(N + 1, dtype=np.float64)
    bounds_done = np.zeros(N + 1, dtype=np.bool_)
    thr64 = np.empty(N + 1, dtype=np.float64)  # its fp64 threshold
    thr_done = np.zeros(N + 1, dtype=np.bool_)
    nodes = np.empty(max_depth + 1, dtype=np.int64)
    for b in range(B):
        if target_rows[b, 0] < 0:
            _write_tree(token_ids, node_ids, b, -1, -1, tokens, parents, depth, nodes)
            continue
        for j in range(N + 1):
            passes[j] = False
            bounds_done[j] = False
            thr_done[j] = False
        passes[0] = True
        stop = 0
        best = depth[b, 0] * (N + 1)
        for j in range(1, N + 1):
            par = parents[b, j - 1]
            tok = tokens[b, j - 1]
            if not (par >= 0 and passes[par] and depth[b, j] <= max_depth and tok >= 0 and tok < V):
                continue
            tr = target_rows[b, par]
            if tr < 0:
                continue  # (a zero row: q(x) = 0 is never above a threshold >= 0)
            q = target[tr]
            q_x = np.float64(_clean(np.float32(q[tok])))
            # the chain kernel's test (_numba_kernels.typical_kernel): outside [0, threshold] q(x)
            # decides without the entropy; else the fp32 bounds, then the fp64 pass
            if not (q_x > threshold and alpha > 0.0):
                if not q_x > 0.0:
                    continue
                if not bounds_done[par]:
                    hs[par], es[par] = _entropy_bounds(q, eps, terms32)
                    bounds_done[par] = True
                h, e = hs[par], es[par]
                decided = False
                accept = False
                top = alpha * math.exp(h + e)
                if top < np.inf and e < np.inf:
                    if q_x > min(top, threshold):
                        decided = True
                        accept = True
                    elif not q_x > min(alpha * math.exp(h - e), threshold):
                        decided = True
                if not decided:
                    if not thr_done[par]:
                        thr64[par] = _typical_threshold(q, eps, threshold, alpha, terms)
                        thr_done[par] = True
                    accept = q_x > thr64[par]
                if not accept:
                    continue
            passes[j] = True
            score = depth[b, j] * (N + 1) - j
            if score > best:
                best = score
                stop = j
        sr = target_rows[b, stop]
        final = -1
        if sr >= 0:
            arg = _argmax_clean(target[sr])
            if _clean(np.float32(target[sr, arg])) > _F0:
                final = arg
        _write_tree(token_ids, node_ids, b, stop, final, tokens, parents, depth, nodes)


@njit(cache=True, error_model="numpy")
def _traversal_residual(q, from_target, alpha, p, has_p, rem, out):
    """out[v] <- tree.traversal's residual of a failed child before its mass: ``(alpha Q -
    p / rem).clamp_min(0)``, or ``alpha Q`` (point mass; the caller sets the child's entry), fp32
    operations in the reference's order (``q``: a target row, cleaned as read when
    ``from_target``, else a node's residual row; ``p`` a draft row, cleaned as read)."""
    n = out.shape[0]
    if has_p:
        if from_target:
            for v in range(n):
                a = alpha * _clean(np.float32(q[v])) - _clean(np.float32(p[v])) / rem
                out[v] = a if a > _F0 else _F0
        else:
            for v in range(n):
                a = alpha * q[v] - _clean(np.float32(p[v])) / rem
                out[v] = a if a > _F0 else _F0
    elif from_target:
        for v in range(n):
            out[v] = alpha * _clean(np.float32(q[v]))
    else:
        for v in range(n):
            out[v] = alpha * q[v]


@njit(cache=True, error_model="numpy")
def _divide_row(r, z, out):
    """out[v] <- r[v] / z (fp32, the reference's ``resid / z``)."""
    for v in range(out.shape[0]):
        out[v] = r[v] / z


@njit(cache=True, inline="always")
def _greedy_walk(target, target_rows, tokens, parents, depth, max_depth, b):
    """tree.reference.rejection_tree_walk's greedy rule for request b (a live root): the first
    tried child equal to the current row's argmax, with q(x) > 0. Returns the stop node."""
    N = tokens.shape[1]
    V = target.shape[1]
    cur = 0
    src = target_rows[b, 0]
    q_argmax = -1
    for j in range(1, N + 1):
        if parents[b, j - 1] != cur:
            continue
        dj = depth[b, j]
        if not (dj >= 1 and dj <= max_depth):
            continue
        tok = tokens[b, j - 1]
        if not (tok >= 0 and tok < V) or src < 0:
            continue
        if q_argmax < 0:
            q_argmax = _argmax_clean(target[src])
        if tok == q_argmax and _clean(np.float32(target[src, tok])) > _F0:
            cur = j
            src = target_rows[b, j]
            q_argmax = -1
    return cur


@njit(cache=True, error_model="numpy")
def traversal_tree_kernel(
    target,  # [R, V] fp32 (R > 0)
    target_rows,  # [B, N+1] int64, -1 = none
    draft,  # [R', V] fp32 (R' > 0; a stand-in row when not has_draft)
    draft_rows,  # [B, N+1] int64
    has_draft,  # bool: False for point-mass drafts (draft_probs None or "deterministic")
    without_replacement,  # bool: the policy is "without_replacement"
    tokens,  # [B, N] int64 (raw)
    parents,  # [B, N] int64, cleaned
    depth,  # [B, N+1] int64
    max_depth,  # int: D
    is_greedy,  # [B] bool
    has_greedy,  # bool
    seeds,  # [B] uint64
    offsets,  # [B] uint64
    token_ids,  # [B, D+1] int64 out
    node_ids,  # [B, D] int64 out
):
    """tree.traversal.traversal_tree_walk then output.finish_walk, one request per iteration: the
    depth-first walk step by step (enter the next untried child: gathered scalars; leave a node:
    its post-order test, and after a failure one vocabulary pass for its parent's residual, a
    second to renormalise it), the race at the stop node's depth. Greedy rows take the argmax
    path (the rejection walk's greedy rule)."""
    B, N = tokens.shape
    V = target.shape[1]
    rows = np.empty((N + 1, V), dtype=np.float32)  # Q_u of the nodes updated so far
    tmp = np.empty(V, dtype=np.float32)
    updated = np.zeros(N + 1, dtype=np.bool_)
    alpha = np.zeros(N + 1, dtype=np.float32)
    removed = np.zeros(N + 1, dtype=np.float32)
    last_child = np.zeros(N + 1, dtype=np.int64)
    skipped = np.zeros(N + 1, dtype=np.bool_)
    nodes = np.empty(max_depth + 1, dtype=np.int64)
    for b in range(B):
        seed, offset = seeds[b], offsets[b]
        if target_rows[b, 0] < 0:
            _write_tree(token_ids, node_ids, b, -1, -1, tokens, parents, depth, nodes)
            continue
        if has_greedy and is_greedy[b]:
            stop = _greedy_walk(target, target_rows, tokens, parents, depth, max_depth, b)
            sr = target_rows[b, stop]
            final = -1
            if sr >= 0:
                arg = _argmax_clean(target[sr])
                if _clean(np.float32(target[sr, arg])) > _F0:
                    final = arg
            _write_tree(token_ids, node_ids, b, stop, final, tokens, parents, depth, nodes)
            continue
        for i in range(N + 1):
            updated[i] = False
            alpha[i] = _F0
            removed[i] = _F0
            last_child[i] = 0
            skipped[i] = False
        alpha[0] = _ONE32
        stop = 0 if N == 0 else -1
        cur = 0
        for _ in range(2 * N + 1 if N else 0):
            # the next untried child of cur (children in index order)
            child = 0
            for k in range(last_child[cur] + 1, N + 1):
                dk = depth[b, k]
                if parents[b, k - 1] == cur and dk >= 1 and dk <= max_depth:
                    child = k
                    break
            enter = child > 0
            if enter:
                u = cur
                x_node = child
            else:
                u = parents[b, cur - 1] if cur > 0 else 0
                u = max(u, 0)
                x_node = cur
            # (a draft row of u missing: P_u(x) = 0, every child of u skipped, never updated)
            raw = tokens[b, max(x_node - 1, 0)]
            valid = raw >= 0 and raw < V
            tok = min(max(raw, 0), V - 1)
            qr = target_rows[b, u]
            if updated[u]:
                q_tok = rows[u, tok]
            elif qr >= 0:
                q_tok = _clean(np.float32(target[qr, tok]))
            else:
                q_tok = _F0
            alpha_u = alpha[u]
            dr = draft_rows[b, u] if has_draft else -1
            if has_draft:
                rem = _ONE32 - removed[u] if without_replacement else _ONE32
                p_tok = _clean(np.float32(draft[dr, tok])) if dr >= 0 else _F0
                p_x = p_tok / rem if rem > _F0 else _F0  # P_u(x)
                rem_div = rem if rem > _F0 else _ONE32
            else:
                rem = _ONE32
                p_tok = _ONE32
                p_x = _ONE32
                rem_div = _ONE32
            if enter:
                drawable = valid and p_x > _F0
                ratio = q_tok / (p_x if drawable else _ONE32)
                alpha_c = _F0
                if drawable and alpha_u > _F0:
                    alpha_c = alpha_u * ratio
                    alpha_c = alpha_c if alpha_c < _ONE32 else _ONE32  # (torch.minimum; not NaN here)
                alpha[child] = alpha_c
                skipped[child] = not drawable
                updated[child] = False
                last_child[u] = child
                cur = child
                continue
            # leaving cur: test it (the root always passes)
            if cur == 0:
                stop = 0
                break
            w = _words(seed, offset, np.int64(cur - 1), _STREAM_ACCEPT)
            if _uniform(w[0], w[1]) < alpha[cur]:
                stop = cur
                break
            if not skipped[cur]:  # the parent's update after the failure of its child cur
                if updated[u]:
                    _traversal_residual(rows[u], False, alpha_u, draft[max(dr, 0)], has_draft, rem_div, tmp)
                elif qr >= 0:
                    _traversal_residual(target[qr], True, alpha_u, draft[max(dr, 0)], has_draft, rem_div, tmp)
                else:
                    for v in range(V):
                        tmp[v] = _F0
                if not has_draft:
                    s = tmp[tok] - _ONE32
                    tmp[tok] = s if s > _F0 else _F0
                z = np.float32(_mass64(tmp))
                if alpha_u >= _ONE32:
                    alpha[u] = _ONE32
                else:
                    alpha[u] = z / (z + (_ONE32 - alpha_u))
                if not z <= _EPS32:
                    _divide_row(tmp, z, rows[u])
                    updated[u] = True
                if without_replacement and has_draft:
                    removed[u] = removed[u] + p_tok
            cur = u
        final = -1
        if stop >= 0:
            sr = target_rows[b, stop]
            if sr >= 0 and _has_mass(target[sr]):
                row = rows[stop] if updated[stop] else target[sr]
                final = _recover(row, row, RES_Q, _ONE32, -1, False, seed, offset, depth[b, stop], _STREAM_RECOVER)
        _write_tree(token_ids, node_ids, b, stop, final, tokens, parents, depth, nodes)
