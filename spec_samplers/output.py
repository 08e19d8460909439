"""The output layouts: a chain sampler's (accepted drafts, one more token, then -1) and the tree
verifiers' (:class:`TreeOutput`, below)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from spec_samplers import rng
from spec_samplers.constants import PLACEHOLDER_TOKEN_ID
from spec_samplers.layout import TreeBatch

__all__ = ["PLACEHOLDER_TOKEN_ID", "build_output", "num_leading_accepted"]


def num_leading_accepted(accepted: torch.Tensor) -> torch.Tensor:
    """accepted: [B, k] bool. Returns [B] int64, the length of each row's accepted prefix."""
    return accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)


def build_output(
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    num_accepted: torch.Tensor,  # [B] int64 in [0, k]
    final_token_ids: torch.Tensor,  # [B] int64: recovered token, or bonus when num_accepted == k
) -> torch.Tensor:
    """[B, k+1] int64: drafts [0, n), final token at n, PLACEHOLDER_TOKEN_ID after."""
    B, k = draft_token_ids.shape
    pos = torch.arange(k + 1, device=draft_token_ids.device)[None, :]
    n = num_accepted[:, None]
    drafts = torch.nn.functional.pad(draft_token_ids.to(torch.int64), (0, 1), value=PLACEHOLDER_TOKEN_ID)
    out = torch.where(pos < n, drafts, torch.full_like(drafts, PLACEHOLDER_TOKEN_ID))
    return torch.where(pos == n, final_token_ids.to(torch.int64)[:, None], out)


# --- Tree verifiers' output (spec_samplers.tree) ----------------------------------------------
# What every tree verifier returns, and the final draw they share (reference and kernels).
#
# :class:`TreeOutput` ``(token_ids [B, D+1], node_ids [B, D])``: the accepted path's tokens, then
# one more token (the draw at the node where the walk stopped), then -1; the accepted nodes along
# the path, then -1 (what an engine keeps in its KV cache).


class TreeOutput(NamedTuple):
    token_ids: torch.Tensor  # [B, D+1] int64, -1 padded
    node_ids: torch.Tensor  # [B, D] int64, -1 padded


def path_to(
    stop: torch.Tensor,  # [B] int64 node where the walk stopped (-1: the request emits nothing)
    parents: torch.Tensor,  # [B, N] int64, cleaned
    depth: torch.Tensor,  # [B, N+1] int64
    max_depth: int,  # D
) -> torch.Tensor:
    """[B, D] int64: the nodes on the path root -> ``stop`` (root excluded), -1 after it.

    Walks up from ``stop`` D times (one [B] gather each), writing node n at slot depth(n) - 1."""
    B = stop.shape[0]
    device = stop.device
    nodes = torch.full((B, max_depth + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    node = stop
    for _ in range(max_depth):
        d = torch.where(node > 0, depth.gather(1, node.clamp(min=0)[:, None]).squeeze(1), 0)  # [B]
        slot = torch.where(node > 0, d - 1, max_depth)  # slot D is scratch
        nodes.scatter_(1, slot[:, None], node[:, None])
        if parents.shape[1] == 0:
            break
        up = parents.gather(1, (node - 1).clamp(min=0)[:, None]).squeeze(1)
        node = torch.where(node > 0, up, node)
    return nodes[:, :max_depth]


def tree_output(
    tokens: torch.Tensor,  # [B, N] int64 node tokens
    node_ids: torch.Tensor,  # [B, D] from path_to
    final: torch.Tensor,  # [B] int64: the token after the path (-1: none)
    alive: torch.Tensor,  # [B] bool: the request has a root row (else all -1)
) -> TreeOutput:
    """Assemble the output: path tokens, then ``final``, then -1; dead requests all -1."""
    B, D = node_ids.shape
    has = node_ids > 0
    if tokens.shape[1]:
        path_tokens = torch.where(has, tokens.gather(1, (node_ids - 1).clamp(min=0)), PLACEHOLDER_TOKEN_ID)
    else:
        path_tokens = torch.full_like(node_ids, PLACEHOLDER_TOKEN_ID)
    length = has.sum(dim=1)  # [B]
    out = torch.nn.functional.pad(path_tokens, (0, 1), value=PLACEHOLDER_TOKEN_ID)
    out = out.scatter(1, length[:, None], final[:, None])
    out = torch.where(alive[:, None], out, PLACEHOLDER_TOKEN_ID)
    return TreeOutput(out, torch.where(alive[:, None], node_ids, PLACEHOLDER_TOKEN_ID))


def final_draw(
    residual: torch.Tensor,  # [B, V] fp32 >= 0: the distribution left at the stop node (unnormalised)
    q_has_mass: torch.Tensor,  # [B] bool: the stop node's target row has probability mass
    stop_depth: torch.Tensor,  # [B] int64: depth of the stop node
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
    greedy_token: torch.Tensor | None,  # [B] int64 argmax of the stop node's target row
    is_greedy: torch.Tensor | None,  # [B] bool
) -> torch.Tensor:
    """[B] int64: the token after the accepted path. The recovery race of the chain samplers
    (:func:`spec_samplers.rng.recovery_race`, stream STREAM_RECOVER) at position = the stop
    node's depth, which is the chain's position of the same draw, so a chain given as a tree
    draws with the chain's random numbers. Greedy rows take ``greedy_token``; a stop node whose
    target row has no mass gives -1 (no token)."""
    token = rng.recovery_race(residual, seeds, offsets, stop_depth)
    if is_greedy is not None and greedy_token is not None:
        token = torch.where(is_greedy, greedy_token, token)
    return torch.where(q_has_mass, token, PLACEHOLDER_TOKEN_ID)


def at(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, M], idx [B] -> [B] x[b, idx[b]]."""
    return x.gather(1, idx[:, None]).squeeze(1)


def seeds_of(tb: TreeBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's [B] int64 seeds and offsets (default 0)."""
    assert tb.seeds is not None, "tree rejection sampling needs per-request seeds"
    offsets = tb.offsets if tb.offsets is not None else torch.zeros_like(tb.seeds)
    return tb.seeds, offsets


def finish_walk(
    tb: TreeBatch, stop: torch.Tensor, residual: torch.Tensor, q_ok: torch.Tensor, q_argmax: torch.Tensor
) -> TreeOutput:
    """The final draw at the stop node and the output (the references' tail; the tree kernels do
    the same in their epilogue)."""
    seeds, offsets = seeds_of(tb)
    alive = stop >= 0
    stop_depth = at(tb.depth, stop.clamp(min=0))
    final = final_draw(residual, q_ok & alive, stop_depth, seeds, offsets, q_argmax, tb.is_greedy)
    return tree_output(tb.tokens, path_to(stop, tb.parents, tb.depth, tb.max_depth), final, alive)
