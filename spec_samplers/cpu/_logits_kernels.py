"""numba kernels of the CPU path's V1 step with point-mass drafts: rejection sampling and block
verification verified from the model's raw logits, each row's softmax made only when the
verification reads it.

A vLLM V1 plain step (``integrations.vllm.fast_path.verify_plain_step``) with n-gram or EAGLE
drafts hands no draft probabilities (point-mass drafts): request r's k_r draft rows and its bonus
row are one ragged request of k_r + 1 rows whose last draft is the -1 placeholder. Rejection
sampling's reference (``reference.rejection_reference`` on ``torch_ops.probs_from_logits`` of
every row) then reads, per request (``step_rejection_kernel``):

* at each position i until the first rejection, q_i(x_i) only: the accept test u_i < q_i(x_i)
  (p = 1), on STREAM_ACCEPT; a greedy request (T = 0) accepts x_i iff it is the row's argmax;
* at the first rejected position j (j = k_r: the bonus row, whose placeholder draft is always
  rejected), the recovery race of position j over q_j without x_j (q_j itself at the bonus row),
  ``_numba_kernels._recover`` on STREAM_RECOVER; a greedy request takes q_j's argmax.

Block verification's (``reference.block_reference``, ``reference._block_core`` with p_i the
one-hot of x_i; ``step_block_kernel``) reads:

* q_i(x_i) at each position i < k_r while the running ratio rho_i is positive (rho_{i+1} =
  min(rho_i q_i(x_i), 1), 0 past an out-of-range draft): the thresholds h_m = Z_m / (Z_m + 1 -
  rho_m) with Z_m = (rho_m (1 - q_m(x_m)))+ (1 when rho_m = 1; rho_m at an out-of-range draft and
  at the placeholder, m = k_r), tested u_{m-1} < h_m on STREAM_ACCEPT, tau the largest m that
  passes (0 if none). Every later h is at most rho_m (h_m' <= rho_m' <= rho_m, within a few fp32
  ulps here), so once each uniform left is >= 2 rho_m (rho_m = 0 included) none can pass and no
  later row is read: a draft the target gives little mass (an n-gram miss) ends the reading;
* at tau, the recovery race of position tau over rho_tau q_tau with (rho_tau q_tau(x_tau) - 1)+ at
  x_tau (RES_BLOCK_POINT; q_tau itself at the bonus row or an out-of-range draft); a greedy request
  (T = 0) follows the argmax rule, tokens as rejection sampling's.

So one request's pass reads its rows once: per row its max, its weights into a [V] scratch row
(``_draw_kernels._unnormalised``: ``torch_ops.scaled_exp``'s operations) and their sum, then
q_i(x_i) = e(x_i) r; the raced row's weights are normalised in place and raced (block
verification keeps each read row's weights, k_r + 1 scratch rows, since tau is known only after
the last). Rows the reference turns into probabilities but never reads are skipped. The floats
are those of the plain step's draw (``_draw_kernels``' docstring: the sum in fp64, rounded to
fp32, and exp2 within an ulp of torch's), rho, Z and h the reference's fp32 operations in its
order, so a token differs from the reference's only when a uniform or two race keys agree with
it to ~2**-23 relative (docs/cpu.md, "Tokens").

Imported by ``integrations.vllm.fast_path`` when numba is installed; compiled code is cached on
disk (``cache=True``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from spec_samplers.cpu._draw_kernels import _first_index_of, _normalise, _row_max, _unnormalised
from spec_samplers.cpu._numba_kernels import (
    _STREAM_ACCEPT,
    _STREAM_RECOVER,
    RES_BLOCK_POINT,
    RES_Q,
    RES_REJECT_POINT,
    _recover,
    _uniform,
    _words,
)

_F0 = np.float32(0.0)
_ONE = np.float32(1.0)
_NEG_INF = np.float32(-np.inf)


@njit(cache=True)
def step_rejection_kernel(
    logits,  # [L, V] fp32: request b's k_b draft rows, then its bonus row
    cu,  # [B] int64: inclusive cumulative sum of k_b + 1 (well formed: checked by the caller)
    draft_ids,  # [L - B] int64: request b's drafts from cu[b - 1] - b on
    temperature,  # [B] fp32, 0 = greedy
    seeds,  # [B] uint64
    offsets,  # [B] uint64
    out,  # [B, >= K + 2] int64: the reference's output (drafts accepted, the token, then -1)
):
    """reference.rejection_reference of the ragged request of each b's k_b + 1 rows (point-mass
    drafts, the last the -1 placeholder), with each row's probabilities made from its logits in
    the pass that reads them (module docstring); -1 where the raced row has no mass."""
    B = cu.shape[0]
    V = logits.shape[1]
    q = np.empty(V, dtype=np.float32)
    start = 0
    for b in range(B):
        kb = cu[b] - start - 1
        first_draft = start - b
        t = temperature[b]
        greedy = t == _F0
        seed, offset = seeds[b], offsets[b]
        n = 0
        m = _NEG_INF
        r = _F0
        while n < kb:  # the accept tests, until the first rejection
            x = logits[start + n]
            xid = draft_ids[first_draft + n]
            valid = xid >= 0 and xid < V
            m = _row_max(x)
            if greedy:  # q is the one-hot of the argmax (all zero without mass)
                ok = valid and m > _NEG_INF and _first_index_of(x, m) == xid
            else:
                r = _unnormalised(x, m, t, q)
                q_x = np.float32(q[xid] * r) if valid else _F0
                w = _words(seed, offset, np.int64(n), _STREAM_ACCEPT)
                ok = valid and _uniform(w[0], w[1]) < q_x
            if not ok:
                break
            n += 1
        x = logits[start + n]  # the rejected row (n < kb: its weights are in q), or the bonus row
        if n == kb:
            m = _row_max(x)
            if not greedy:
                r = _unnormalised(x, m, t, q)
        if greedy:
            token = -1 if m == _NEG_INF else _first_index_of(x, m)
        else:
            _normalise(q, r)
            mode, skip = RES_Q, -1  # the bonus row, or an out-of-range draft: race q itself
            if n < kb:
                xid = draft_ids[first_draft + n]
                if xid >= 0 and xid < V:
                    mode, skip = RES_REJECT_POINT, xid
            token = _recover(q, q, mode, _ONE, skip, False, seed, offset, n, _STREAM_RECOVER)
        for i in range(out.shape[1]):
            out[b, i] = draft_ids[first_draft + i] if i < n else (token if i == n else -1)
        start = cu[b]


@njit(cache=True)
def step_block_kernel(
    logits,  # [L, V] fp32: request b's k_b draft rows, then its bonus row
    cu,  # [B] int64: inclusive cumulative sum of k_b + 1 (well formed, every k_b + 1 <= K + 1)
    draft_ids,  # [L - B] int64: request b's drafts from cu[b - 1] - b on
    temperature,  # [B] fp32, 0 = greedy
    seeds,  # [B] uint64
    offsets,  # [B] uint64
    out,  # [B, K + 2] int64: the reference's output (drafts accepted, the token, then -1)
):
    """reference.block_reference of the ragged request of each b's k_b + 1 rows (point-mass
    drafts, the last the -1 placeholder), with each row's probabilities made from its logits in
    the pass that reads them (module docstring); -1 where the raced row has no mass."""
    B = cu.shape[0]
    V = logits.shape[1]
    q = np.empty((out.shape[1] - 1, V), dtype=np.float32)  # row m: position m's weights
    r = np.empty(out.shape[1] - 1, dtype=np.float32)  # their 1 / sum
    u = np.empty(out.shape[1] - 1, dtype=np.float32)  # u[m] = u_{m-1}, the uniform testing h_m
    u_min = np.empty(out.shape[1] - 1, dtype=np.float32)  # u_min[m] = min(u[m:k_b + 1])
    start = 0
    for b in range(B):
        kb = cu[b] - start - 1
        first_draft = start - b
        t = temperature[b]
        seed, offset = seeds[b], offsets[b]
        if t == _F0:  # the greedy rule: leading argmax matches, then the argmax of the next row
            tau = 0
            while tau < kb:
                x = logits[start + tau]
                xid = draft_ids[first_draft + tau]
                m = _row_max(x)
                if not (xid >= 0 and xid < V and m > _NEG_INF and _first_index_of(x, m) == xid):
                    break
                tau += 1
            x = logits[start + tau]
            m = _row_max(x)
            token = -1 if m == _NEG_INF else _first_index_of(x, m)
        else:
            # rho_m and h_m (m = 1 .. k_b; the placeholder's h_{k_b} = rho_{k_b}) while some later
            # test can pass: h_m' <= rho_m' <= rho_m for m' >= m (exactly; a few fp32 ulps here),
            # so once every uniform left is >= 2 rho_m (rho_m = 0 included) no later row is read
            for m in range(1, kb + 1):  # u_{m-1} tests h_m; u_min[m]: the least of u_{m-1} ..
                w = _words(seed, offset, np.int64(m - 1), _STREAM_ACCEPT)
                u[m] = _uniform(w[0], w[1])
            u_min[kb] = u[kb] if kb >= 1 else _F0
            for m in range(kb - 1, 0, -1):
                u_min[m] = min(u[m], u_min[m + 1])
            rho = _ONE
            tau, rho_tau = 0, _ONE
            for m in range(kb + 1):
                if m >= 1 and u_min[m] >= np.float32(2.0) * rho:
                    break
                xid = draft_ids[first_draft + m] if m < kb else -1
                valid = xid >= 0 and xid < V
                q_x = _F0
                if valid:
                    x = logits[start + m]
                    r[m] = _unnormalised(x, _row_max(x), t, q[m])
                    q_x = np.float32(q[m, xid] * r[m])
                if m >= 1:
                    h = rho  # an out-of-range draft (the placeholder): rho_m; rho_m = 1: 1
                    if valid and rho < _ONE:  # Z_m / (Z_m + 1 - rho_m), Z_m = (rho_m (1 - q_m(x_m)))+
                        z = np.float32(rho * np.float32(_ONE - q_x))
                        z = z if z > _F0 else _F0
                        h = np.float32(z / np.float32(z + np.float32(_ONE - rho)))
                    if u[m] < h:
                        tau, rho_tau = m, rho
                rho = min(np.float32(rho * q_x), _ONE)  # the ratio q_x / 1, 0 past an invalid draft
            xid = draft_ids[first_draft + tau] if tau < kb else -1
            mode, skip = RES_Q, -1  # the bonus row, or an out-of-range draft: race q itself
            if xid >= 0 and xid < V:
                mode, skip = RES_BLOCK_POINT, xid
            else:  # a row the loop did not weigh (a valid draft's row at tau was: rho_tau > 0)
                x = logits[start + tau]
                r[tau] = _unnormalised(x, _row_max(x), t, q[tau])
            _normalise(q[tau], r[tau])
            token = _recover(q[tau], q[tau], mode, rho_tau, skip, False, seed, offset, tau, _STREAM_RECOVER)
        for i in range(out.shape[1]):
            out[b, i] = draft_ids[first_draft + i] if i < tau else (token if i == tau else -1)
        start = cu[b]
