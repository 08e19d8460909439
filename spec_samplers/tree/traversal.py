"""Traversal Verification (Weng et al. 2025, "Traversal Verification for Speculative Tree
Decoding"): the tree generalisation of block verification, as a PyTorch reference.
:class:`spec_samplers.BlockVerificationSampler` uses it for trees on the torch backend; on the
Triton backend its twin :func:`spec_samplers.kernels.tree_kernels.block_tree_kernel` (one launch,
the same tokens) runs instead.

State of every node u: alpha_u (the acceptance probability of the path root..u), Q_u (the
current target row, q_u at first) and P_u (the law the next untried child of u is drawn from,
given everything before: the draft row p_u; ``without_replacement``: p_u with the tried
children's tokens removed, renormalised; ``deterministic``: the point mass at that child).
alpha_root = 1; a child c of u with token x gets alpha_c = min(alpha_u Q_u(x) / P_u(x), 1) when
it is entered, with u's state at that moment.

The walk visits the tree in depth-first order, children in index order, and tests each node
after its whole subtree was rejected (post-order: the first leaf of what is left): node v passes
iff eta_v < alpha_v. A pass accepts the path root..v and emits one more token, a draw of Q_v (a
leaf that was never updated emits from q_v: the bonus). A failure deletes v, and its parent u
becomes, with P = P_u before the update and Z = sum (alpha_u Q_u - P)+,

    Q_u <- (alpha_u Q_u - P)+ / Z,   alpha_u <- Z / (Z + 1 - alpha_u)  (1 when alpha_u >= 1),

and P_u moves to the law of the next child (without replacement: v's token removed). The root is
tested last and always passes (alpha_root stays 1), emitting a draw of its current Q.

Exactness. Lemma: for a node u in state (alpha, Q, P), where P is the law of u's next child given
everything so far, the walk of u's remaining subtree accepts something below or at u and emits
the continuation y with probability alpha * Q(y_1) * q(y_2 | y_1) ..., i.e. alpha times the
target's law started from Q, and deletes u with probability 1 - alpha. A leaf: accepted with
probability alpha, then a draw of Q. Otherwise the next child c has token x ~ P, alpha_c =
min(alpha Q(x) / P(x), 1), and c's subtree was drawn from c's own rows; by induction c emits
(x, y') with probability P(x) alpha_c q_c-law(y') = min(alpha Q(x), P(x)) q_c-law(y') and fails
with probability (P(x) - alpha Q(x))+ given x, F = sum (P - alpha Q)+ = Z + 1 - alpha in all. After
the failure u's state (alpha', Q') does not depend on x, so by induction the rest emits y with
probability F alpha' Q'(y_1) ... = (alpha Q - P)+(y_1) ...; the sum over both cases is
alpha Q(y_1) ..., and the deletion probability F (1 - alpha') = 1 - alpha. The policy only
enters through "P is the law of the next child given the history": i.i.d. children keep P,
children drawn without replacement remove the failed token (whose Q' is 0, since a failure has
alpha_c < 1), deterministic children are point masses (then Z = alpha (1 - Q(x))). At the root
alpha = 1 and Q = q_0: the output has the target's law. On a chain the thresholds are block
verification's h_m = Z_m / (Z_m + 1 - rho_m) tested from the end (the largest m that passes), so
the chain given as a tree is :func:`spec_samplers.reference.block_reference`, token for token
up to float rounding (same random numbers).

A child that could not have been drawn (id outside [0, V), P(x) = 0) is skipped: alpha_c = 0,
so nothing in its subtree passes, and its failure leaves u unchanged. A residual with mass <=
RESIDUAL_MASS_EPS (a failure of probability ~0) keeps Q_u. Greedy rows follow the argmax path
of :func:`spec_samplers.tree.reference.rejection_tree_walk`.

Random numbers: node j tests the accept uniform of counter j - 1 (STREAM_ACCEPT; each node is
tested at most once); the final draw is the recovery race at the stop node's depth, as the other
tree rules. Cost: 2N + 1 steps of [B]-vectorised work, one vocabulary pass per step (the kernel:
one per failed child, two when its parent's residual is renormalised).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from spec_samplers.constants import RESIDUAL_MASS_EPS
from spec_samplers.layout import TreeBatch, as_probabilities
from spec_samplers.output import TreeOutput, at, finish_walk, seeds_of
from spec_samplers.reference import block_thresholds
from spec_samplers.rng import accept_uniforms
from spec_samplers.torch_ops import valid_ids
from spec_samplers.tree.reference import _mass, gather_rows, rejection_tree_walk


def _set_row(state: torch.Tensor, node: torch.Tensor, row: torch.Tensor, where: torch.Tensor) -> None:
    """state [B, N+1, V], in place: row ``node[b]`` replaced by ``row[b]`` where ``where[b]``
    (one [B, V] write, not a copy of the state)."""
    b = torch.arange(state.shape[0], device=state.device)
    state[b, node] = torch.where(where[:, None], row, state[b, node])


def _set(x: torch.Tensor, node: torch.Tensor, value: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """x [B, N+1]: x[b, node[b]] = value[b] where ``where[b]``."""
    return x.scatter(1, node[:, None], torch.where(where, value, at(x, node))[:, None])


def traversal_tree_walk(tb: TreeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The walk of the module docstring. Returns (stop node [B] (-1: no root row), its current
    target row Q [B, V] fp32, its original target row has mass [B] bool, argmax of that row [B])."""
    tb = as_probabilities(tb)
    B, N, V = tb.batch_size, tb.num_nodes, tb.vocab_size
    device = tb.target.device
    seeds, offsets = seeds_of(tb)
    point_mass = tb.draft is None or tb.policy == "deterministic"
    eta = accept_uniforms(seeds, offsets, N)  # [B, N]: node j tests column j - 1
    one = torch.ones((), device=device)
    node_index = torch.arange(1, N + 1, device=device, dtype=torch.int64)[None, :]  # [1, N]
    present = (tb.depth[:, 1:] >= 1) & (tb.depth[:, 1:] <= tb.max_depth)  # [B, N]

    alive = tb.target_rows[:, 0] >= 0
    done = ~alive
    stop = torch.full((B,), -1, dtype=torch.int64, device=device)
    cur = torch.zeros(B, dtype=torch.int64, device=device)
    q_state = torch.zeros(B, N + 1, V, dtype=torch.float32, device=device)
    q_state[:, 0] = gather_rows(tb.target, tb.target_rows[:, 0])
    alpha = torch.zeros(B, N + 1, dtype=torch.float32, device=device)
    alpha[:, 0] = 1.0
    removed = torch.zeros(B, N + 1, dtype=torch.float32, device=device)  # drawn mass (without replacement)
    last_child = torch.zeros(B, N + 1, dtype=torch.int64, device=device)  # last entered child of each node
    skipped = torch.zeros(B, N + 1, dtype=torch.bool, device=device)  # could not have been drawn

    if N == 0:  # no node: the walk stops at the root (and the loop's gathers have nothing to read)
        stop = torch.zeros_like(stop)
    for _ in range(2 * N + 1 if N else 0):
        # the next untried child of cur, if any (children in index order)
        kids = (tb.parents == cur[:, None]) & present & (node_index > at(last_child, cur)[:, None])
        enter = kids.any(dim=1) & ~done
        leave = ~kids.any(dim=1) & ~done
        child = torch.where(enter, torch.argmax(kids.to(torch.int8), dim=1) + 1, 0)

        # parent side: u = cur when entering, the parent of cur when leaving a non-root node
        up = torch.where(cur > 0, tb.parents.gather(1, (cur - 1).clamp(min=0)[:, None]).squeeze(1), 0)
        u = torch.where(enter, cur, up.clamp(min=0))
        x_node = torch.where(enter, child, cur)  # the child of u concerned (entered or failed)
        valid, tok = valid_ids(tb.tokens.gather(1, (x_node - 1).clamp(min=0)[:, None]).squeeze(1), V)
        q_u = q_state[torch.arange(B, device=device), u]  # [B, V]
        alpha_u = at(alpha, u)
        if point_mass:
            p_row = None
            p_x = torch.ones(B, dtype=torch.float32, device=device)
            rem = torch.ones(B, dtype=torch.float32, device=device)
        else:
            assert tb.draft is not None
            p_row = gather_rows(tb.draft, at(tb.draft_rows, u))
            rem = 1.0 - at(removed, u) if tb.policy == "without_replacement" else torch.ones_like(alpha_u)
            p_x = torch.where(rem > 0, at(p_row, tok) / torch.where(rem > 0, rem, one), 0.0)  # P_u(x)

        # entering child c of u: alpha_c = min(alpha_u Q_u(x) / P_u(x), 1)
        drawable = valid & (p_x > 0)
        ratio = at(q_u, tok) / torch.where(drawable, p_x, one)
        alpha_c = torch.where(drawable & (alpha_u > 0), torch.minimum(alpha_u * ratio, one), 0.0)
        alpha = _set(alpha, child, alpha_c, enter)
        skipped = _set(skipped, child, ~drawable, enter)
        q_c = gather_rows(tb.target, at(tb.target_rows, child))
        _set_row(q_state, child, q_c, enter)
        last_child = _set(last_child, u, child, enter)

        # leaving cur: test it (the root always passes)
        passes = leave & ((cur == 0) | (at(eta, (cur - 1).clamp(min=0)) < at(alpha, cur)))
        stop = torch.where(passes, cur, stop)
        done = done | passes
        fail = leave & ~passes
        # the parent's update after the failure of its child cur (skipped children change nothing)
        update = fail & ~at(skipped, cur)
        if p_row is None:
            resid = alpha_u[:, None] * q_u
            resid = resid.scatter(1, tok[:, None], (at(resid, tok) - 1.0).clamp_min(0.0)[:, None])
        else:
            resid = (alpha_u[:, None] * q_u - p_row / torch.where(rem > 0, rem, one)[:, None]).clamp_min(0.0)
        z = _mass(resid)
        new_alpha = block_thresholds(z, alpha_u)
        keep_q = z <= RESIDUAL_MASS_EPS
        new_q = torch.where(keep_q[:, None], q_u, resid / torch.where(keep_q, one, z)[:, None])
        alpha = _set(alpha, u, new_alpha, update)
        _set_row(q_state, u, new_q, update)
        if tb.policy == "without_replacement" and p_row is not None:
            removed = _set(removed, u, at(removed, u) + at(p_row, tok), update)
        cur = torch.where(enter, child, torch.where(fail, u, cur))

    stop = torch.where(alive, stop, -1)
    safe = stop.clamp(min=0)
    residual = q_state[torch.arange(B, device=device), safe]
    q_orig = gather_rows(tb.target, at(tb.target_rows, safe))
    q_ok = q_orig.amax(dim=-1) > 0
    q_argmax = torch.argmax(q_orig, dim=-1)
    if tb.is_greedy is not None:
        g_stop, g_r, g_ok, g_arg = rejection_tree_walk(replace(tb, is_greedy=torch.ones_like(tb.is_greedy)))
        g = tb.is_greedy
        stop, residual = torch.where(g, g_stop, stop), torch.where(g[:, None], g_r, residual)
        q_ok, q_argmax = torch.where(g, g_ok, q_ok), torch.where(g, g_arg, q_argmax)
    return stop, residual, q_ok, q_argmax


def traversal_tree_reference(tb: TreeBatch) -> TreeOutput:
    """Traversal Verification over a tree (module docstring). Returns ``TreeOutput``."""
    stop, residual, q_ok, q_argmax = traversal_tree_walk(tb)
    return finish_walk(tb, stop, residual, q_ok, q_argmax)
