"""Tree drafting for :class:`~spec_samplers.decoding.SpeculativeDecoder` (``tree=``).

A round drafts a token tree per request level by level, the target scores it in one pass with
tree attention, the sampler's ``forward_tree`` verifies it, and both KV caches keep only the
accepted path. Nodes are numbered level by level (parents first); level d has a fixed number of
slots w_d for every request, so the batch keeps one static shape:

* a branching list ``[b_1, .., b_D]`` (EAGLE's static trees): every node of level d-1 gets b_d
  children, w_d = b_1 ... b_d;
* :class:`NodeBudget` (a dynamic tree, EAGLE-2-like): N nodes split evenly over D levels; level
  d's w_d slots go to the frontier's best candidates (parent u, token v) by draft path probability
  P(u) p_u(v). ``expansion="top_k"`` takes those tokens (siblings are then a deterministic function
  of the draft's context: verify with ``draft_sampling="deterministic"``); ``"sampled"`` keeps
  only the number of children each parent got and samples them from p_u by the decoder's
  ``draft_sampling`` ("independent" or "without_replacement").

Exactness with an adaptive shape: the number of children of u depends on draft probabilities and
tokens drawn before u's children, never on u's children themselves or on the target, so given
everything the verifier has seen when it reaches u, u's children are draws of p_u as the policy
states; that is all :mod:`spec_samplers.tree.reference`'s proof uses.

Caches: the target holds every committed token but the last (the root of the next tree); the
draft holds every committed token up to the last round's root, and reads the accepted path and
the new token (the round's output row, -1 padded) at the start of the next round. Draft
distributions of a level come from a tree-attention pass over the nodes drafted so far, whose
slots are dropped at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from spec_samplers.constants import input_error
from spec_samplers.decoding.output import RoundTarget, left_pad, model_device
from spec_samplers.decoding.rounds import RoundCounters, fit_vocab, for_draft, last_logits
from spec_samplers.decoding.strategy import DRAFT_STREAM, SampleStrategy

if TYPE_CHECKING:
    from spec_samplers.decoding.output import GenerationOutput, GenerationStart
    from spec_samplers.decoding.speculative import SpeculativeDecoder

#: expansions of a NodeBudget
EXPANSIONS = ("top_k", "sampled")


@dataclass(frozen=True)
class NodeBudget:
    """A dynamic tree: at most ``num_nodes`` nodes over ``max_depth`` levels (module docstring)."""

    num_nodes: int
    max_depth: int
    expansion: str = "top_k"

    def __post_init__(self) -> None:
        for name in ("num_nodes", "max_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise input_error(name, "an int >= 1", repr(value))
        if self.max_depth > self.num_nodes:
            raise input_error("max_depth", f"<= num_nodes = {self.num_nodes}", self.max_depth)
        if self.expansion not in EXPANSIONS:
            raise input_error("expansion", " or ".join(map(repr, EXPANSIONS)), repr(self.expansion))


@dataclass(frozen=True)
class TreeShape:
    """Slots per level and, for static trees, the branching."""

    widths: tuple[int, ...]  # w_1 .. w_D
    branching: tuple[int, ...] | None  # static trees
    expansion: str | None  # budget trees

    @property
    def num_nodes(self) -> int:
        return sum(self.widths)

    @property
    def depth(self) -> int:
        return len(self.widths)

    def level_start(self, d: int) -> int:
        """Node index of level d's first slot (level 0: the root, node 0)."""
        return 1 + sum(self.widths[: d - 1]) if d > 0 else 0


def as_tree_shape(tree: Sequence[int] | NodeBudget) -> TreeShape:
    if isinstance(tree, NodeBudget):
        base, extra = divmod(tree.num_nodes, tree.max_depth)
        widths = tuple(base + (1 if d < extra else 0) for d in range(tree.max_depth))
        return TreeShape(widths, None, tree.expansion)
    if isinstance(tree, (str, bytes)) or not isinstance(tree, Sequence) or not tree:
        raise input_error("tree", "a non-empty list of children per depth (e.g. [2, 2, 1]) or a NodeBudget", tree)
    if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in tree):
        raise input_error("tree", "children per depth, each an int >= 1", list(tree))
    level_widths, w = [], 1
    for b in tree:
        w *= b
        level_widths.append(w)
    return TreeShape(tuple(level_widths), tuple(tree), None)


def static_parents(shape: TreeShape) -> list[int]:
    """Parents of a static tree, node j = 1..N (level by level)."""
    assert shape.branching is not None
    parents: list[int] = []
    for d, b in enumerate(shape.branching, start=1):
        start_prev = shape.level_start(d - 1)
        parents += [start_prev + s // b for s in range(shape.widths[d - 1])]
    return parents


def _level_children(
    shape: TreeShape,
    d: int,  # level being drafted (1..D)
    frontier_probs: torch.Tensor,  # [n, F, V] draft distributions of level d-1's nodes
    frontier_path: torch.Tensor,  # [n, F] draft path probabilities of those nodes
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(parent slot in the frontier [n, w_d], rank among siblings [n, w_d], top-k tokens [n, w_d]
    or None): who gets level d's slots."""
    n, F, V = frontier_probs.shape
    w = shape.widths[d - 1]
    device = frontier_probs.device
    if shape.branching is not None:
        b = shape.branching[d - 1]
        slot = torch.arange(w, device=device)
        parent = (slot // b)[None].expand(n, w)
        rank = (slot % b)[None].expand(n, w)
        return parent, rank, None
    scores = (frontier_path[:, :, None] * frontier_probs).reshape(n, F * V)
    top = torch.topk(scores, min(w, F * V), dim=1, sorted=True).indices  # [n, w] best first
    if top.shape[1] < w:  # more slots than candidates: repeat the best (never accepted twice)
        top = torch.cat([top, top[:, :1].expand(n, w - top.shape[1])], dim=1)
    parent, token = top // V, top % V
    same = parent[:, :, None] == parent[:, None, :]  # [n, w, w]
    rank = (same & torch.ones(w, w, dtype=torch.bool, device=device).tril(-1)).sum(dim=2)
    return parent, rank, token if shape.expansion == "top_k" else None


def _draw_level(
    probs: torch.Tensor,  # [n, w, V] each slot's parent's draft distribution
    parent: torch.Tensor,  # [n, w]
    rank: torch.Tensor,  # [n, w]
    top_tokens: torch.Tensor | None,  # [n, w] (top-k expansion)
    policy: str,
    strategy: SampleStrategy,
    rounds: torch.Tensor,  # [n] offsets
    first_node: int,
) -> torch.Tensor:
    """[n, w] tokens of one level drawn as ``policy`` says (positions = node indices)."""
    n, w, V = probs.shape
    if top_tokens is not None:
        return top_tokens
    if policy == "deterministic":
        order = torch.argsort(probs, dim=2, descending=True, stable=True)  # [n, w, V]
        return order.gather(2, rank.clamp(max=V - 1)[:, :, None]).squeeze(2)
    tokens = torch.zeros(n, w, dtype=torch.int64, device=probs.device)
    for s in range(w):
        weights = probs[:, s]
        if policy == "without_replacement" and s:
            earlier = (parent[:, :s] == parent[:, s : s + 1]).to(weights.dtype)  # [n, s] siblings before
            removed = torch.zeros_like(weights).scatter_add_(1, tokens[:, :s], earlier)
            weights = torch.where(removed > 0, 0.0, weights)
        # a sibling whose parent row has no mass left (e.g. a greedy draft without replacement)
        # is drawn as -1 by the sampling op: any token will do there, since its draft probability
        # is 0 and the verifier never accepts it
        tokens[:, s] = strategy.draw(weights, rounds, first_node + s, DRAFT_STREAM).clamp(min=0)
    return tokens


def draft_tree(
    decoder: SpeculativeDecoder,
    shape: TreeShape,
    p_root: torch.Tensor,  # [n, V] processed draft distribution at the root
    strategy: SampleStrategy,
    rounds: torch.Tensor,  # [n]
    draft_cache: Any,
    vocab: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens [n, N], parents [n, N], draft rows [n, N+1, V]) of one round's trees."""

    n, V = p_root.shape
    N = shape.num_nodes
    device = p_root.device
    tokens = torch.zeros(n, N, dtype=torch.int64, device=device)
    parents = torch.zeros(n, N, dtype=torch.int64, device=device)
    rows = torch.zeros(n, N + 1, V, dtype=torch.float32, device=device)
    rows[:, 0] = p_root
    path = torch.ones(n, N + 1, dtype=torch.float32, device=device)
    for d in range(1, shape.depth + 1):
        f0, f1 = shape.level_start(d - 1), shape.level_start(d)
        if d > 1:  # the draft distributions of level d-1: one tree pass over the nodes so far
            query_parents = parents[:, : f1 - 1] - 1  # query i is node i + 1; the root (-1) is in the cache
            logits = decoder.draft.forward_tree(for_draft(tokens[:, : f1 - 1], None), query_parents, draft_cache)  # type: ignore[attr-defined]
            draft_cache.keep_query_slots(torch.zeros(n, f1 - 1, dtype=torch.bool, device=device))
            rows[:, f0:f1] = strategy.probs(fit_vocab(logits[:, f0 - 1 : f1 - 1], vocab))
        parent_slot, rank, top = _level_children(shape, d, rows[:, f0:f1], path[:, f0:f1])
        parent = parent_slot + f0
        w = shape.widths[d - 1]
        parent_rows = rows.gather(1, parent[:, :, None].expand(n, w, V))
        policy = "deterministic" if top is not None else decoder.draft_sampling
        level = _draw_level(parent_rows, parent_slot, rank, top, policy, strategy, rounds, f1)
        tokens[:, f1 - 1 : f1 - 1 + w] = level
        parents[:, f1 - 1 : f1 - 1 + w] = parent
        path[:, f1 : f1 + w] = path.gather(1, parent) * parent_rows.gather(2, level[:, :, None]).squeeze(2)
    return tokens, parents, rows


def tree_policy(decoder: SpeculativeDecoder, shape: TreeShape) -> str:
    """The policy the verifier is told: top-k budget trees are deterministic by construction."""
    return "deterministic" if shape.expansion == "top_k" else decoder.draft_sampling


@torch.no_grad()
def generate_tree(
    decoder: SpeculativeDecoder, start: GenerationStart, stats: RoundCounters, strategy: SampleStrategy
) -> GenerationOutput:
    """The rounds of :meth:`SpeculativeDecoder.generate` with tree drafting (module docstring), on
    the requests :func:`~spec_samplers.decoding.rounds.begin_rounds` set up (at least one)."""

    shape = decoder.tree
    assert shape is not None
    N, D = shape.num_nodes, shape.depth
    prompts, buffer, B = start.prompts, start.buffer, start.batch_size
    device = model_device(decoder.target)
    # SlotKVCache-like caches (keep_query_slots): what the tree-attention models write
    target_cache: Any = decoder.target.new_kv_cache()
    draft_cache: Any = decoder.draft.new_kv_cache()
    longest = max(len(p) for p in prompts)
    lengths = torch.tensor([len(p) for p in prompts])
    vocab = getattr(decoder.target, "vocab_size", None)
    if longest > 1:
        before = left_pad([p[:-1] for p in prompts], longest - 1, device)
        prefill_logits = last_logits(decoder.target, before, target_cache)  # filling the caches: logits unread
        vocab = vocab or prefill_logits.shape[-1]
        last_logits(decoder.draft, for_draft(before, None), draft_cache)
        stats.target_passes += (lengths > 1).to(torch.int64)
        stats.draft_passes += (lengths > 1).to(torch.int64)
    pending = torch.tensor([[p[-1]] for p in prompts], device=device)  # [B, P] committed, not in the draft
    root = pending[:, 0]  # [B] last committed token, not in the target cache
    policy = tree_policy(decoder, shape)
    parents_static = static_parents(shape) if shape.branching is not None else None
    paths = path_tree = None
    if getattr(decoder.sampler, "tree_layout", None) == "paths":  # K paths: the decoder checked the shape
        from spec_samplers.tree.multipath import path_order, path_parents

        paths = torch.tensor(path_order(shape.widths[0], D), device=device)
        path_tree = path_parents(shape.widths[0], D)
    active = torch.arange(B)
    rounds = torch.zeros(B, dtype=torch.int64, device=device)
    random = getattr(decoder.sampler, "tree_random", True)
    while active.numel():
        n = active.numel()
        # pending is right-padded with -1 (the last round's output row): read its last token's logits
        last = (pending >= 0).sum(dim=1) - 1
        logits = decoder.draft.forward(for_draft(pending, None), draft_cache)
        logits = logits.gather(1, last[:, None, None].expand(n, 1, logits.shape[-1]))[:, 0]
        vocab = vocab or logits.shape[-1]
        p_root = strategy.probs(fit_vocab(logits, vocab))
        tokens, parents, p_rows = draft_tree(decoder, shape, p_root, strategy, rounds, draft_cache, vocab)
        query = torch.cat([root[:, None], tokens], dim=1)  # [n, N+1]
        query_parents = torch.cat([torch.full((n, 1), -1, device=device), parents], dim=1)
        target_logits = decoder.target.forward_tree(query, query_parents, target_cache)  # type: ignore[attr-defined]
        q = strategy.probs(target_logits)
        extra: dict[str, Any] = {"seeds": strategy.seeds, "offsets": rounds} if random else {}
        greedy = strategy.tensors.is_greedy
        verified: tuple[Any, ...] = (q, p_rows, tokens, parents_static if parents_static is not None else parents)
        if paths is not None:  # a path-major verifier (multi-path block verification): the nodes reordered
            verified = (q[:, paths], p_rows[:, paths], tokens[:, paths[1:] - 1], path_tree)
        out = decoder.sampler.forward_tree(*verified, policy, max_depth=D, is_greedy=greedy, **extra)  # type: ignore[operator]
        token_ids, node_ids = out.token_ids, out.node_ids  # [n, D+1], [n, D]
        if paths is not None:
            node_ids = torch.where(node_ids >= 0, paths[node_ids.clamp(min=0)], node_ids)
        keep = torch.zeros(n, N + 1, dtype=torch.bool, device=device)
        keep[:, 0] = True
        keep.scatter_(1, node_ids.clamp(min=0), node_ids >= 0)
        keep[:, 0] = True
        target_cache.keep_query_slots(keep)
        out_host = token_ids.cpu()  # the round's read-back
        num_accepted = (node_ids.cpu() >= 0).sum(dim=1)
        # emitted token j was drawn at node_ids[j - 1] (the root for j = 0)
        emitted = torch.cat([torch.zeros_like(node_ids[:, :1]), node_ids.clamp(min=0)], dim=1)
        finished = buffer.append(active, out_host, num_accepted + 1, RoundTarget(target_logits, q, emitted))
        stats.round(active, num_accepted, torch.zeros(n, D, dtype=torch.float64))
        stats.drafted[active] += N - D
        pending = token_ids
        root = token_ids.gather(1, num_accepted.to(device)[:, None])[:, 0]
        rounds = rounds + 1
        if bool(finished.any()):
            keep_rows = (~finished).nonzero()[:, 0]
            active = active[keep_rows]
            index = keep_rows.to(device)
            pending, root, rounds = pending[index], root[index], rounds[index]
            strategy = strategy.select(keep_rows)
            target_cache.batch_select_indices(index)
            draft_cache.batch_select_indices(index)
    return stats.output(buffer)
