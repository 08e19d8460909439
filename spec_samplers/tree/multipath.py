"""Greedy multi-path block verification (GBV; Thomas & Pal 2026, arXiv 2602.16961), exact.

Notation: q = target, p = draft (the rest of the package's; the paper writes them the other way
round). The drafter samples K independent paths of length L from the root (every token of a path
from the draft row after that path's own prefix). Tree layout: K disjoint paths, path i, depth d
is node i*L + d (parents ``[0, 1, .., L-1, 0, L+1, ..]``), ``draft_sampling="independent"``.

The pick. At a node with rows (q, p) every token x has the key k(x) = min(1, q(x) / p(x)) and the
strict order "x is better than y" iff k(x) > k(y), or k(x) = k(y) and x < y (lower token id
wins ties; the key is computed once per row, so the pick and the CDF below compare the same fp
values). Starting at the root with all K paths alive, at depth d the best token among the alive
paths' d-th tokens is picked and the paths with another token are dropped. The picked path is
the lexicographic maximum of the K paths (compare first tokens by the root's order, then second
tokens by the order after the shared first token, ...). A path whose token could not have been
drawn (id outside [0, V), p(x) = 0) is dropped; when no path is left the picked path ends there.
Paths that share a prefix share a context; the rows of a prefix are read from the lowest-index
path that has it, and the output names the nodes of the lowest-index picked path.

Its law. Let F(s) be the draft probability of the prefixes of length |s| worse than or equal to
s in the lexicographic order, F(s-) the strictly worse ones. The picked prefix is <= s iff all K
paths' prefixes are, so P(pick prefix = s) = F(s)^K - F(s-)^K. For a child x of the picked
prefix s (F_s(x) and F_s(x-): the mass of the tokens worse than or equal to / strictly worse than
x in the order at s), F(s.x) = F(s-) + p(s) F_s(x), so the conditional law of the next picked
token is

    p~(x | s) = [(A + P F_s(x))^K - (A + P F_s(x-))^K] / [(A + P)^K - A^K],   A = F(s-), P = p(s).

With a = A / (A + P) and r = P / (A + P) = 1 - a, and b = a + r F_s(x), c = a + r F_s(x-)
(b - c = r p(x)), the difference of K-th powers factors without cancellation:

    p~(x | s) = p(x) * H(b, c) / H(1, a),   H(b, c) = sum_{j<K} b^j c^(K-1-j)  (all terms >= 0),

and along the picked path (picked token x at s) a' = (a + r F_s(x-)) / (a + r F_s(x)),
r' = r p(x) / (a + r F_s(x)), from a = 0, r = 1 at the root. Every quantity is a sum or ratio of
non-negative terms in [0, K], so fp32 is safe for every K >= 1 (relative error O(K) ulp per
weight; no power of a probability ever under- or overflows: b, c, a lie in [0, 1]); the cost is
O(K) per vocabulary entry. K = 1 gives H = 1, p~ = p exactly: block verification.

The verification. Block verification (:mod:`spec_samplers.reference`, Sun et al. 2024) on the
picked path with the draft rows replaced by p~: rho_0 = 1, rho_{m+1} = min(rho_m q_m(s_{m+1}) /
p~_m(s_{m+1}), 1), Z_m = sum (rho_m q_m - p~_m)+, h_m = Z_m / (Z_m + 1 - rho_m) for m < L',
h_L' = rho_L' (L' = the picked path's length), tau = the largest m with u_m < h_m (0 if none),
then one token from (rho_tau q_tau - p~_tau)+ normalised (q_tau if that has no mass or tau = L').
Exact: the picked path is a draw of p~'s sequential law and the rest of the K paths only decide
which one it is, so block verification's losslessness for any draft law applies. Both the pick
and the CDF use the one order; with another tie-break in the pick (the authors' code: the first
child among equal keys, while the CDF orders ties by token id) the picked path no longer has the
law p~ and the output is lossy (``tests/test_multipath.py`` shows both by exact enumeration).

Random numbers: h_m tests the accept uniform of counter m - 1, the final draw is the recovery
race at depth tau (:func:`spec_samplers.output.final_draw`): with K = 1 these are the chain
block verification's, token for token. Greedy rows follow the argmax walk of
:func:`spec_samplers.tree.reference.rejection_tree_walk`. Cost: L sorts of a vocabulary row (the
order's CDF) and O(K) vocabulary passes per position. The Triton twin
(:mod:`spec_samplers.kernels.multipath_launch`) computes the same values in its kernels, around
one PyTorch sort of the visited rows' keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from spec_samplers.constants import input_error
from spec_samplers.layout import TreeBatch, as_probabilities
from spec_samplers.output import TreeOutput, at, finish_walk
from spec_samplers.reference import block_thresholds
from spec_samplers.rng import accept_uniforms
from spec_samplers.torch_ops import valid_ids
from spec_samplers.tree.reference import rejection_tree_walk


def path_parents(num_paths: int, length: int) -> list[int]:
    """The parents of K disjoint paths of length L from the root: node i*L + d has parent
    i*L + d - 1, or 0 at d = 1. Example: ``path_parents(2, 2) == [0, 1, 0, 3]``."""
    return [0 if d == 1 else i * length + d - 1 for i in range(num_paths) for d in range(1, length + 1)]


def path_order(num_paths: int, length: int) -> list[int]:
    """Row j of the path-major layout (node i*L + d) is row ``path_order(K, L)[j]`` of the
    level-order layout of the same K paths (the decoding loop's static tree [K, 1, .., 1]: node
    1 + (d-1)*K + i), the root 0 first."""
    return [0] + [1 + (d - 1) * num_paths + i for i in range(num_paths) for d in range(1, length + 1)]


EXPECTED_SHAPE = "K disjoint paths of equal length L from the root (node i*L + d has parent i*L + d - 1, 0 at d = 1)"


def paths_of(parents: list[list[int]], name: str = "parents") -> tuple[int, int]:
    """(K, L) of every request's parents (host lists), or an error naming the expected shape.
    A request whose parents are all -1 (a ragged request without nodes) has no path."""
    shapes = set()
    for row in parents:
        if all(p == -1 for p in row):
            continue
        k = sum(1 for p in row if p == 0)
        length = len(row) // k if k else 0
        if k == 0 or k * length != len(row) or row != path_parents(k, length):
            example = path_parents(2, 2)
            raise input_error(name, f"{EXPECTED_SHAPE}, e.g. {example} for K = 2, L = 2", row)
        shapes.add((k, length))
    if len(shapes) > 1:
        raise input_error(name, "the same K paths of length L in every request", sorted(shapes))
    return shapes.pop() if shapes else (0, 0)


# -- the order and the law of the pick ---------------------------------------------------------


def order_keys(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """[B, V] keys min(1, q/p) (1 where p = 0: such tokens carry no draft mass, so their place in
    the order changes no CDF value). The pick and the CDF both read these values."""
    safe = torch.where(p > 0, p, torch.ones((), dtype=p.dtype, device=p.device))
    return torch.where(p > 0, torch.clamp(q / safe, max=1.0), torch.ones((), dtype=p.dtype, device=p.device))


def order_cdf(keys: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(F(x), F(x-)) [B, V] in p's dtype: the draft mass of the tokens worse than or equal to x /
    strictly worse than x, in the order of higher key first, lower token id first among equal
    keys (a stable descending sort keeps ids ascending). Suffix sums in float64."""
    order = torch.sort(keys, dim=-1, descending=True, stable=True).indices  # best first
    mass = p.gather(-1, order).to(torch.float64)
    worse_eq = mass.flip(-1).cumsum(-1).flip(-1)  # at rank k: ranks k.. (k and everything worse)
    worse = torch.nn.functional.pad(worse_eq[:, 1:], (0, 1))
    f_eq = torch.empty_like(worse_eq).scatter_(-1, order, worse_eq)
    f_lt = torch.empty_like(worse).scatter_(-1, order, worse)
    return f_eq.to(p.dtype), f_lt.to(p.dtype)


def power_sum(b: torch.Tensor, c: torch.Tensor, num_paths: int) -> torch.Tensor:
    """H(b, c) = sum_{j<K} b^j c^(K-1-j) = (b^K - c^K) / (b - c), by H_1 = 1, H_{k+1} = b^k + c H_k:
    non-negative terms only (b, c >= 0), so no cancellation for any K."""
    h = torch.ones_like(b)
    b_pow = torch.ones_like(b)
    for _ in range(num_paths - 1):
        b_pow = b_pow * b
        h = b_pow + c * h
    return h


def skewed_row(
    p: torch.Tensor, f_eq: torch.Tensor, f_lt: torch.Tensor, a: torch.Tensor, r: torch.Tensor, num_paths: int
) -> torch.Tensor:
    """[B, V] p~ = p H(a + r F(x), a + r F(x-)) / H(1, a): the law of the pick's next token."""
    a_, r_ = a[:, None], r[:, None]
    weight = power_sum(a_ + r_ * f_eq, a_ + r_ * f_lt, num_paths) / power_sum(torch.ones_like(a_), a_, num_paths)
    return p * weight


def best_token(keys: torch.Tensor, cand: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """[B] the best candidate token under the strict order (highest key, then lowest id), among
    ``cand`` [B, K] where ``ok`` [B, K]; any value where no candidate is ok."""
    k = torch.where(ok, keys.gather(1, cand), -1.0)
    top = k.amax(dim=1, keepdim=True)
    big = torch.iinfo(torch.int64).max
    return torch.where(ok & (k == top), cand, big).amin(dim=1)


#: the pick: (keys [B, V], candidate tokens [B, K], ok [B, K]) -> picked token [B]
Pick = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# -- the law part: everything but the random numbers -------------------------------------------


@dataclass(frozen=True)
class MultipathPlan:
    """What GBV decides before its random numbers: the verifier's output law given the drafts.
    Rows at position m = 0..L are those after the picked prefix of length m."""

    thresholds: torch.Tensor  # [B, L]: h_m at column m - 1 (0 past the picked path's end)
    residuals: torch.Tensor  # [B, L+1, V] unnormalised law of the token emitted when tau = m
    length: torch.Tensor  # [B] int64 L': the picked path's length (0: no path, or none drawable)
    path: torch.Tensor  # [B] int64 the lowest-index picked path (-1 when L' = 0)
    row_nodes: torch.Tensor  # [B, L+1] int64 node whose rows position m read (0: the root)


def _rows(flat: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """flat [R, V], rows [B] (-1: none) -> [B, V] in ``dtype``, NaN / Inf / negatives set to 0."""
    if flat.shape[0] == 0:
        return torch.zeros(rows.shape[0], flat.shape[1], dtype=dtype, device=flat.device)
    out = flat[rows.clamp(min=0)].to(dtype).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0)
    return torch.where((rows >= 0)[:, None], out, torch.zeros((), dtype=dtype, device=flat.device))


def multipath_plan(
    tb: TreeBatch,
    num_paths: int,
    *,
    dtype: torch.dtype = torch.float32,
    pick: Pick = best_token,
    skew: bool = True,
) -> MultipathPlan:
    """The pick and block verification's thresholds and residuals on the picked path (module
    docstring), vectorised over the batch; ``dtype`` float64 for exact-law checks. ``pick`` and
    ``skew`` exist for the planted faults (tests, certify): another tie-break in the pick than in
    the CDF, or no skew (p~ = p with K > 1) are lossy."""
    tb = as_probabilities(tb)
    if tb.draft is None:
        raise input_error("draft_probs", "the draft rows the K paths were sampled from", None)
    B, N, V = tb.batch_size, tb.num_nodes, tb.vocab_size
    K = num_paths
    L = N // K if K else 0
    device = tb.target.device
    zero = torch.zeros((), dtype=dtype, device=device)
    path_index = torch.arange(K, device=device, dtype=torch.int64)[None, :]  # [1, K]

    root = tb.target_rows[:, 0]
    if K:
        alive = (root >= 0)[:, None] & (tb.depth[:, 1 : N + 1 : L] == 1)  # [B, K] the paths' first nodes
    else:
        alive = torch.zeros(B, 0, dtype=torch.bool, device=device)
    going = root >= 0  # the picked path reaches depth m
    node = torch.zeros(B, dtype=torch.int64, device=device)  # rows of position m: this node's
    length = torch.zeros(B, dtype=torch.int64, device=device)
    a = torch.zeros(B, dtype=dtype, device=device)
    r = torch.ones(B, dtype=dtype, device=device)
    rho = torch.ones(B, dtype=dtype, device=device)
    thresholds = torch.zeros(B, L, dtype=dtype, device=device)
    residuals = torch.zeros(B, L + 1, V, dtype=dtype, device=device)
    row_nodes = torch.zeros(B, L + 1, dtype=torch.int64, device=device)
    for m in range(L + 1):
        row_nodes[:, m] = node
        q = _rows(tb.target, at(tb.target_rows, node), dtype)
        if m == L:  # the paths' end: h_L = rho_L, the bonus draw from q_L
            if L:
                thresholds[:, L - 1] = torch.where(going, rho, thresholds[:, L - 1])
            residuals[:, L] = q
            break
        p = _rows(tb.draft, at(tb.draft_rows, node), dtype)
        keys = order_keys(q, p)
        f_eq, f_lt = order_cdf(keys, p)
        p_skew = skewed_row(p, f_eq, f_lt, a, r, K) if skew else p
        # the candidates: the alive paths' tokens at depth m + 1 (node i*L + m + 1, column i*L + m)
        valid, cand = valid_ids(tb.tokens[:, m::L] if L else tb.tokens[:, :0], V)
        ok = alive & valid & (p.gather(1, cand) > 0) & going[:, None]
        drawn = ok.any(dim=1)
        ends = going & ~drawn  # no drawable token: the picked path ends at m
        # block verification at position m: h_m from Z_m (m >= 1), residual (rho_m q_m - p~_m)+
        resid = (rho[:, None] * q - p_skew).clamp_min(0.0)
        z = resid.sum(dim=-1)
        if m >= 1:
            h = torch.where(ends, rho, block_thresholds(z, rho))
            thresholds[:, m - 1] = torch.where(going, h, zero)
        residuals[:, m] = torch.where((drawn & (z > 0))[:, None], resid, q)
        length = torch.where(going, m, length)
        going = going & drawn

        x = pick(keys, cand, ok)
        x = torch.where(going, x, 0)
        alive = ok & (cand == x[:, None])
        first = torch.where(alive, path_index, K).amin(dim=1)  # lowest-index alive path
        node = torch.where(going, first.clamp(max=max(K - 1, 0)) * L + m + 1, node)
        p_x, q_x = p.gather(1, x[:, None]).squeeze(1), q.gather(1, x[:, None]).squeeze(1)
        ps_x = p_skew.gather(1, x[:, None]).squeeze(1)
        ratio = torch.where(ps_x > 0, q_x / torch.where(ps_x > 0, ps_x, 1.0), zero)
        rho = torch.where(going, torch.where(rho > 0, torch.clamp(rho * ratio, max=1.0), zero), rho)
        fe, fl = f_eq.gather(1, x[:, None]).squeeze(1), f_lt.gather(1, x[:, None]).squeeze(1)
        den = a + r * fe
        safe = torch.where(den > 0, den, 1.0)
        a, r = torch.where(going, (a + r * fl) / safe, a), torch.where(going, r * p_x / safe, r)
        if m == L - 1:
            length = torch.where(going, L, length)
    length = torch.where(root >= 0, length, 0)
    return MultipathPlan(thresholds, residuals, length, _path_at(row_nodes, length, L), row_nodes)


def _path_at(row_nodes: torch.Tensor, length: torch.Tensor, L: int) -> torch.Tensor:
    """[B] the path of the node at depth ``length`` (its index // L), -1 at depth 0."""
    n = row_nodes.gather(1, length[:, None]).squeeze(1)
    return torch.where(length > 0, (n - 1) // max(L, 1), -1)


# -- the sampler's op --------------------------------------------------------------------------


def multipath_tree_reference(tb: TreeBatch, num_paths: int) -> TreeOutput:
    """GBV over K disjoint paths (module docstring). Returns ``TreeOutput``."""
    tb = as_probabilities(tb)
    B, N = tb.batch_size, tb.num_nodes
    L = N // num_paths if num_paths else 0
    plan = multipath_plan(tb, num_paths)
    assert tb.seeds is not None
    offsets = tb.offsets if tb.offsets is not None else torch.zeros_like(tb.seeds)
    u = accept_uniforms(tb.seeds, offsets, L)  # [B, L]: h_m tests column m - 1
    device = tb.target.device
    m_idx = torch.arange(1, L + 1, device=device, dtype=torch.int64)[None, :]
    passed = (u < plan.thresholds) & (m_idx <= plan.length[:, None])
    tau = torch.where(passed, m_idx, 0).amax(dim=1) if L else torch.zeros(B, dtype=torch.int64, device=device)
    residual = plan.residuals[torch.arange(B, device=device), tau].float()
    alive = tb.target_rows[:, 0] >= 0
    stop = torch.where(tau > 0, plan.path.clamp(min=0) * L + tau, 0)
    stop = torch.where(alive, stop, -1)
    q_row = _rows(tb.target, at(tb.target_rows, at(plan.row_nodes, tau)), torch.float32)
    return finish_multipath(tb, stop, residual, q_row.amax(dim=-1) > 0, torch.argmax(q_row, dim=-1))


def finish_multipath(
    tb: TreeBatch, stop: torch.Tensor, residual: torch.Tensor, q_ok: torch.Tensor, q_argmax: torch.Tensor
) -> TreeOutput:
    """The tail shared with the kernel launcher: greedy rows follow the argmax walk of
    :func:`spec_samplers.tree.reference.rejection_tree_walk`, then the final draw and the output
    (:func:`spec_samplers.output.finish_walk`)."""
    if tb.is_greedy is not None:
        g_stop, g_r, g_ok, g_arg = rejection_tree_walk(replace(tb, is_greedy=torch.ones_like(tb.is_greedy)))
        g = tb.is_greedy
        stop, residual = torch.where(g, g_stop, stop), torch.where(g[:, None], g_r, residual)
        q_ok, q_argmax = torch.where(g, g_ok, q_ok), torch.where(g, g_arg, q_argmax)
    return finish_walk(tb, stop, residual, q_ok, q_argmax)
