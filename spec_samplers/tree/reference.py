"""PyTorch references of the tree verifiers (kernels compare against these token for token).

Recursive rejection sampling (SpecInfer's multi-step speculative sampling; Miao et al. 2024,
Chen et al. 2023 for one draft; Jeon et al. 2024 "Recursive Speculative Decoding" for drafts
without replacement). The walk starts at the root with the residual r = q_0 (the root's target
row). At the current node u, the children c_1, c_2, ... (in index order) are tried one by one
against the draft distribution each was drawn from:

* ``independent``: every child an i.i.d. sample of p_u, so p'_i = p_u;
* ``without_replacement``: c_i drawn from p_u with c_1..c_{i-1} removed and renormalised, so
  p'_i = p_u / (1 - sum_{l<i} p_u(c_l)) off the removed tokens (0 on them);
* ``deterministic`` (or ``draft_probs=None``): c_i any function of the context (top-k ...), so
  p'_i = the point mass at c_i.

Child c_i is accepted with probability min(1, r(c_i) / p'_i(c_i)): the walk moves to c_i and
starts over with r = q_{c_i}. On rejection r becomes (r - p'_i)+ normalised (for point masses:
r without c_i, normalised) and the next child is tried. When u has no child left (a leaf, or all
rejected) the final token is drawn from r: the recovered token, or the "bonus" token at a leaf.

Exactness (the whole output has the target's law). Induction from the last sibling down, at a
fixed node u with history H (the siblings tried so far, all rejected, r the current residual): the
law of the next emitted token given H is r. With no child left it is a draw of r. Otherwise the
next child c ~ p'_i given H (this is what each policy states), and r' = norm((r - p'_i)+) does
not depend on c; by hypothesis the rest, given (H, c rejected), emits a draw of r'. So
P(x | H) = p'_i(x) min(1, r(x)/p'_i(x)) + P(reject | H) r'(x) = min(p'_i, r)(x) + (r - p'_i)+(x)
= r(x), since P(reject | H) = 1 - sum min(p'_i, r) = sum (r - p'_i)+. (Without replacement:
p'_{i+1} depends on c_i, but the hypothesis only needs c_{i+1}'s law given everything before,
which is p'_{i+1}.) At the root r = q_0, so the first token has law q_0; given that token x was
emitted by accepting child c (token x), the walk continues at c with r = q_c = the target after
x, and c's subtree was drawn from c's draft rows (independent of the sibling tests), so the same
argument applies one level down; given that x was drawn as the final token, the walk stops and the
engine continues from x with fresh target samples. By induction over depth, the tokens emitted
(then continued by the target) follow the target's joint law. A rejected child has r(c) <
p'_i(c), so (r - p'_i)+(c) = 0: the residual is set to 0 there exactly, and the removed tokens of
``without_replacement`` need no mask. A child that could not have been drawn (id outside [0, V),
p'_i(c) = 0, no draft row) is skipped: not accepted, residual unchanged (the law of the rest is
untouched). A residual with mass <= RESIDUAL_MASS_EPS (a rejection of probability ~0) keeps the
previous one.

Costs: gathered scalars for every tried child, one vocabulary pass per rejected child (r'), none
for an accepted one; the final race reads one residual row.

Random numbers: child j (node index) tests u_j = the accept uniform of counter j - 1 (stream
STREAM_ACCEPT; each node is tried at most once); the final draw is the recovery race at the stop
node's depth (:func:`spec_samplers.output.final_draw`). For a chain (parents 0, 1, .., k-1)
these are the chain sampler's numbers, so the chain given as a tree emits the chain entry's
tokens (with an out-of-range bonus id, which makes the chain sample its bonus row).

Typical acceptance (Medusa's tree rule): node j passes iff its parent passes and q_parent(x_j) >
min(posterior_threshold, posterior_alpha exp(-H(q_parent))); the accepted path is the deepest
passing node (ties: the lowest index), and the final token argmax q at its end. Deterministic
and lossy, as the chain rule.
"""

from __future__ import annotations

import torch

from spec_samplers.constants import PLACEHOLDER_TOKEN_ID, RESIDUAL_MASS_EPS
from spec_samplers.layout import TreeBatch, as_probabilities
from spec_samplers.output import TreeOutput, finish_walk, path_to, tree_output
from spec_samplers.output import at as _at
from spec_samplers.output import seeds_of as _seeds
from spec_samplers.reference import typical_accepts
from spec_samplers.rng import accept_uniforms
from spec_samplers.torch_ops import clean_probs, valid_ids


def gather_rows(flat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """flat [R, V], rows [B] (-1: none) -> [B, V] fp32 cleaned, zero where rows == -1."""
    if flat.shape[0] == 0:
        return torch.zeros(rows.shape[0], flat.shape[1], dtype=torch.float32, device=flat.device)
    out = clean_probs(flat[rows.clamp(min=0)])
    return torch.where((rows >= 0)[:, None], out, torch.zeros((), device=flat.device))


def _mass(r: torch.Tensor) -> torch.Tensor:
    """[B] fp32 sum of r [B, V], accumulated in float64 so that a kernel's other summation order
    rounds to the same fp32 (except within ~1e-16 of a rounding boundary)."""
    return r.to(torch.float64).sum(dim=-1).to(torch.float32)


def rejection_tree_walk(tb: TreeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The walk of the module docstring. Returns (stop node [B] (-1: no root row), residual at
    the stop node [B, V] fp32, its target row has mass [B] bool, argmax of that row [B])."""
    tb = as_probabilities(tb)
    B, N, V = tb.batch_size, tb.num_nodes, tb.vocab_size
    device = tb.target.device
    seeds, offsets = _seeds(tb)
    point_mass = tb.draft is None or tb.policy == "deterministic"
    greedy = tb.is_greedy
    u = accept_uniforms(seeds, offsets, N)  # [B, N]: node j tests column j - 1
    one = torch.ones((), device=device)

    alive = tb.target_rows[:, 0] >= 0
    cur = torch.where(alive, 0, -1)
    r = gather_rows(tb.target, tb.target_rows[:, 0])  # residual at the current node
    z = torch.ones(B, dtype=torch.float32, device=device)  # its mass (1: a target row as given)
    removed = torch.zeros(B, dtype=torch.float32, device=device)  # drawn mass (without replacement)
    q_ok = r.amax(dim=-1) > 0
    q_argmax = torch.argmax(r, dim=-1)
    for j in range(1, N + 1):
        par = tb.parents[:, j - 1]
        tried = (par == cur) & (tb.depth[:, j] >= 1) & (tb.depth[:, j] <= tb.max_depth)
        valid, tok = valid_ids(tb.tokens[:, j - 1], V)
        valid = valid & tried
        r_c = _at(r, tok)
        if point_mass:
            p_row = None
            p_c = torch.ones_like(r_c)
        else:
            assert tb.draft is not None
            p_row = gather_rows(tb.draft, _at(tb.draft_rows, cur.clamp(min=0)))  # [B, V]
            p_c = _at(p_row, tok)
        p_drawn = p_c  # p_u(c)
        rem = 1.0 - removed if tb.policy == "without_replacement" else torch.ones_like(removed)
        p_c = torch.where(rem > 0, p_c / torch.where(rem > 0, rem, one), 0.0)  # p'_i(c)
        ok = valid & (p_c > 0)
        accept = ok & (u[:, j - 1] < r_c / torch.where(ok, z * p_c, one))
        if greedy is not None:
            # greedy rows: the first child equal to argmax q_u (r stays q_u on greedy rows)
            accept = torch.where(greedy, valid & (tok == q_argmax) & (r_c > 0), accept)
        update = ok & ~accept
        if greedy is not None:
            update = update & ~greedy
        # the residual after rejecting c: (r / z - p')+ (point mass: r / z without c), 0 at c
        if p_row is None:
            new_r = r / z[:, None]
        else:
            new_r = (r / z[:, None] - p_row / rem[:, None]).clamp_min(0.0)
        new_r = new_r.scatter(1, tok[:, None], 0.0)
        new_z = _mass(new_r)
        update = update & (new_z > RESIDUAL_MASS_EPS)
        if tb.policy == "without_replacement":
            removed = torch.where(ok & ~accept, removed + p_drawn, removed)
        q_j = gather_rows(tb.target, tb.target_rows[:, j])
        r = torch.where(accept[:, None], q_j, torch.where(update[:, None], new_r, r))
        z = torch.where(accept, 1.0, torch.where(update, new_z, z))
        removed = torch.where(accept, 0.0, removed)
        q_ok = torch.where(accept, q_j.amax(dim=-1) > 0, q_ok)
        q_argmax = torch.where(accept, torch.argmax(q_j, dim=-1), q_argmax)
        cur = torch.where(accept, j, cur)
    return cur, r, q_ok, q_argmax


def rejection_tree_reference(tb: TreeBatch) -> TreeOutput:
    """Recursive rejection sampling over a tree (module docstring). Returns ``TreeOutput``."""
    stop, residual, q_ok, q_argmax = rejection_tree_walk(tb)
    return finish_walk(tb, stop, residual, q_ok, q_argmax)


def typical_tree_reference(tb: TreeBatch, posterior_threshold: float, posterior_alpha: float) -> TreeOutput:
    """Medusa's tree rule (module docstring): the deepest node whose whole path passes the
    typical test, then argmax q there. Returns ``TreeOutput``."""
    tb = as_probabilities(tb)
    B, N, V = tb.batch_size, tb.num_nodes, tb.vocab_size
    device = tb.target.device
    passes = torch.zeros(B, N + 1, dtype=torch.bool, device=device)
    passes[:, 0] = tb.target_rows[:, 0] >= 0
    for j in range(1, N + 1):
        par = tb.parents[:, j - 1]
        q_par = gather_rows(tb.target, _at(tb.target_rows, par.clamp(min=0)))
        valid, tok = valid_ids(tb.tokens[:, j - 1], V)
        ok = valid & (par >= 0) & _at(passes, par.clamp(min=0)) & (tb.depth[:, j] <= tb.max_depth)
        ok = ok & typical_accepts(q_par, _at(q_par, tok), posterior_threshold, posterior_alpha)
        passes[:, j] = ok
    # deepest passing node, lowest index on ties: maximise depth * (N+1) - index
    node = torch.arange(N + 1, device=device, dtype=torch.int64)[None, :]
    score = torch.where(passes, tb.depth * (N + 1) - node, -1)
    stop = torch.where(passes[:, 0], torch.argmax(score, dim=1), -1)
    q_stop = gather_rows(tb.target, _at(tb.target_rows, stop.clamp(min=0)))
    final = torch.where(q_stop.amax(dim=-1) > 0, torch.argmax(q_stop, dim=-1), PLACEHOLDER_TOKEN_ID)
    return tree_output(tb.tokens, path_to(stop, tb.parents, tb.depth, tb.max_depth), final, stop >= 0)
