"""Tree test workloads shared by tests/test_tree.py and tests/test_tree_kernels.py.

Rows depend only on depth: the target's row of a node at depth d is Q[d] and the draft's P[d],
so the target's joint law of the first three tokens is Q[0] x Q[1] x Q[2], whatever the path.
"""

from __future__ import annotations

import torch

from spec_samplers.layout import clean_parents, node_depths

#: tree shapes of the exactness tests (parent of node j = 1..N)
SHAPES = {
    "binary": [0, 0, 1, 1, 2, 2],
    "wide_root": [0, 0, 0, 0],
    "chain": [0, 1, 2],
    "uneven": [0, 0, 1, 3, 1, 0],
}
POLICIES = ("independent", "without_replacement", "deterministic")

V = 4
#: target and draft distributions by depth (full support, chosen far apart so that a wrong
#: verifier shows: the naive one over-emits tokens where q > p)
Q = torch.tensor(
    [[0.55, 0.25, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.3, 0.05, 0.05, 0.6], [0.25, 0.25, 0.25, 0.25]],
    dtype=torch.float64,
)
P = torch.tensor(
    [[0.2, 0.3, 0.3, 0.2], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]],
    dtype=torch.float64,
)


def depths(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] parents -> [B, N+1] depths (root 0, -1 detached)."""
    return node_depths(clean_parents(parents.to(torch.int64)))


def draw_tree_tokens(
    parents: torch.Tensor, policy: str, gen: torch.Generator, p_by_depth: torch.Tensor = P
) -> torch.Tensor:
    """[B, N] parents -> [B, N] tokens drawn as ``policy`` says from P[depth(parent)]."""
    B, N = parents.shape
    depth = depths(parents)
    tokens = torch.zeros(B, N, dtype=torch.int64)
    rank = torch.zeros(B, N, dtype=torch.int64)  # index among its siblings
    for j in range(1, N + 1):
        par = parents[:, j - 1]
        base = p_by_depth[depth.gather(1, par.clamp(min=0)[:, None]).squeeze(1).clamp(min=0)].clone()  # [B, V]
        mask = torch.ones_like(base)
        for s in range(1, j):
            same = parents[:, s - 1] == par
            rank[:, j - 1] += same.long()
            if policy == "without_replacement":
                mask[same, tokens[same, s - 1]] = 0.0
        if policy == "deterministic":
            order = torch.argsort(base, dim=1, descending=True, stable=True)
            tokens[:, j - 1] = order.gather(1, rank[:, j - 1 : j].clamp(max=base.shape[1] - 1)).squeeze(1)
        else:
            tokens[:, j - 1] = torch.multinomial(base * mask, 1, generator=gen).squeeze(1)
    return tokens


def depth_rows(dists: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """[B, N+1, V] fp32: row j = dists[depth(j)] (a detached node gets the last row)."""
    d = depths(parents)
    return dists[d.clamp(min=0, max=dists.shape[0] - 1)].to(torch.float32)


def tree_workload(shape: list[int], policy: str, B: int, seed: int):
    """(target [B, N+1, V], draft [B, N+1, V], tokens [B, N], parents [B, N], seeds [B])."""
    gen = torch.Generator().manual_seed(seed)
    parents = torch.tensor(shape, dtype=torch.int64)[None, :].expand(B, -1).contiguous()
    tokens = draw_tree_tokens(parents, policy, gen)
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    return depth_rows(Q, parents), depth_rows(P, parents), tokens, parents, seeds


def complete_three(token_ids: torch.Tensor, gen: torch.Generator, q_by_position: torch.Tensor = Q) -> torch.Tensor:
    """[B, D+1] verifier output -> [B] cell index of its first three tokens, each missing token a
    fresh sample of the target at its position (Q[i]: the rows depend on depth only)."""
    B = token_ids.shape[0]
    out = torch.full((B, 3), -1, dtype=torch.int64)
    w = min(3, token_ids.shape[1])
    out[:, :w] = token_ids[:, :w]
    for i in range(3):
        fresh = torch.multinomial(q_by_position[i].float().expand(B, -1), 1, generator=gen).squeeze(1)
        out[:, i] = torch.where(out[:, i] >= 0, out[:, i], fresh)
    Vq = q_by_position.shape[1]
    return out[:, 0] * Vq * Vq + out[:, 1] * Vq + out[:, 2]


def joint_three(q_by_position: torch.Tensor = Q) -> torch.Tensor:
    """[V**3] the target's joint law of three tokens."""
    return torch.einsum("a,b,c->abc", q_by_position[0], q_by_position[1], q_by_position[2]).reshape(-1)


def ragged_from_padded(
    target: torch.Tensor, draft: torch.Tensor | None, tokens: torch.Tensor, parents: torch.Tensor, counts: list[int]
):
    """Flatten per-request trees of N_b = counts[b] nodes (the first N_b of the padded ones):
    (target [T+B, V], draft, tokens [T], parents [T], cu [B])."""
    t_rows, d_rows, toks, pars = [], [], [], []
    for b, n in enumerate(counts):
        t_rows.append(target[b, : n + 1])
        if draft is not None:
            d_rows.append(draft[b, : n + 1])
        toks.append(tokens[b, :n])
        pars.append(parents[b, :n])
    cu = torch.tensor(counts, dtype=torch.int64).cumsum(0)
    return (
        torch.cat(t_rows),
        None if draft is None else torch.cat(d_rows),
        torch.cat(toks),
        torch.cat(pars),
        cu,
    )
