"""Token trees: how a batch of draft trees is laid out, checked and described to the verifiers.

A tree has a root, node 0 (the last accepted token, whose target row gives the distribution of
the first new token), and N draft nodes 1..N. Node j holds one draft token and has a parent in
[0, j): parents come before their children, so processing nodes in index order visits every
parent before its children. Siblings (nodes with the same parent) are ordered by index: that is
the order in which the verifiers try them and, for ``"without_replacement"`` drafts, the order in
which they were drawn. Example (N = 5, ``parents = [0, 0, 1, 1, 3]``)::

    node:    0 (root)
            / \\
           1   2          depth 1
          / \\
         3   4            depth 2
         |
         5                depth 3

Rows (padded layout): ``target[b, j]`` is the target distribution after the path root..j (row 0:
after the root), ``draft[b, j]`` the draft distribution node j's children were drawn from
(leaves' rows are never read), ``draft_token_ids[b, j - 1]`` node j's token.

Ragged layout: request b has N_b nodes; ``cu_num_nodes`` is the inclusive cumulative sum of N_b.
Node tokens and parents are flat [T] (T = sum N_b; node j of request b at cu[b-1] + j - 1, parents
local indices), target and draft rows flat [T + B, V] with request b's N_b + 1 rows (root first)
at cu[b-1] + b. A request whose counts are malformed (as :mod:`spec_samplers.layout`'s rule, with
``max_nodes`` for K and T + B rows) reads nothing and emits no token.

Invalid parents (no host synchronisation): a parent outside [0, j) detaches node j: it is never a
child of any node, so neither it nor its subtree is ever tried. Strict mode raises instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from spec_samplers.errors import input_error
from spec_samplers.layout import request_spans
from spec_samplers.torch_ops import probs_from_logits

#: the sibling policies: how the children of one node were drawn from the node's draft row
POLICIES = ("independent", "without_replacement", "deterministic")

#: the Medusa / EAGLE convention for "no parent": a padding node
NO_PARENT = -1


def check_policy(draft_sampling: object) -> str:
    if draft_sampling not in POLICIES:
        raise input_error("draft_sampling", " or ".join(repr(p) for p in POLICIES), repr(draft_sampling))
    assert isinstance(draft_sampling, str)
    return draft_sampling


def as_parents(parents: object, device: torch.device) -> torch.Tensor:
    """``parents`` as an int64 tensor on ``device`` (a list or tuple of ints is accepted)."""
    if isinstance(parents, (list, tuple)):
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in parents):
            raise input_error("parents", "a list of ints or an int tensor", repr(parents))
        return torch.tensor(list(parents), dtype=torch.int64, device=device)
    return check_parents_tensor(parents, device).to(torch.int64)


def check_parents_tensor(parents: object, device: torch.device) -> torch.Tensor:
    """``parents`` as given, checked: an int32/int64 tensor on ``device`` (metadata only)."""
    if not isinstance(parents, torch.Tensor):
        raise input_error("parents", "a [N] or [B, N] int tensor (or a list of ints)", type(parents).__name__)
    if parents.dtype not in (torch.int32, torch.int64):
        raise input_error("parents", "dtype int32 or int64", parents.dtype)
    if parents.device != device:
        raise input_error("parents", f"device {device}", f"device {parents.device}")
    return parents


def clean_parents(parents: torch.Tensor) -> torch.Tensor:
    """[..., N] int64 -> the same with every parent outside [0, j) (node j = index + 1) set to -1."""
    N = parents.shape[-1]
    node = torch.arange(1, N + 1, device=parents.device, dtype=torch.int64)
    return torch.where((parents >= 0) & (parents < node), parents, NO_PARENT)


def node_depths(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] cleaned parents -> [B, N+1] int64 depth of every node (root 0; -1 for a detached
    node and its subtree). One step per node (parents come first), vectorised over the batch."""
    B, N = parents.shape
    depth = torch.full((B, N + 1), -1, dtype=torch.int64, device=parents.device)
    depth[:, 0] = 0
    for j in range(1, N + 1):
        par = parents[:, j - 1]
        d = depth.gather(1, par.clamp(min=0)[:, None]).squeeze(1)
        depth[:, j] = torch.where((par >= 0) & (d >= 0), d + 1, -1)
    return depth


def static_max_depth(parents: Sequence[int]) -> int:
    """The depth of a tree given as a Python list (no tensor, no synchronisation)."""
    depth = [0]
    for j, p in enumerate(parents, start=1):
        depth.append(depth[p] + 1 if 0 <= p < j and depth[p] >= 0 else -1)
    return max(depth)


def check_parents_values(parents: torch.Tensor) -> None:
    """Strict mode: every parent in [0, j) (synchronises with the host)."""
    N = parents.shape[-1]
    node = torch.arange(1, N + 1, device=parents.device, dtype=torch.int64)
    bad = (parents < 0) | (parents >= node)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise input_error("parents", "parent of node j in [0, j)", f"{int(parents[index])} at index {index}")


@dataclass(frozen=True)
class TreeBatch:
    """One tree verification call, both layouts, as flat rows and per-request index maps.

    Probabilities only (the logits entries turn logits into probabilities first). Row maps hold
    flat row indices into ``target`` / ``draft`` or -1 (no row). ``depth`` is -1 for absent or
    detached nodes, so ``depth >= 1`` marks the nodes that can be tried.
    """

    target: torch.Tensor  # [R, V] fp32/fp16/bf16 (may be a strided view; vocab stride 1 not required)
    draft: torch.Tensor | None  # [R', V] or None: point-mass ("deterministic") drafts
    target_rows: torch.Tensor  # [B, N+1] int64
    draft_rows: torch.Tensor  # [B, N+1] int64
    tokens: torch.Tensor  # [B, N] int64 as given (range checked by the verifiers)
    parents: torch.Tensor  # [B, N] int64, cleaned (-1: no parent)
    depth: torch.Tensor  # [B, N+1] int64
    max_depth: int  # D: the output has D+1 token slots
    policy: str
    seeds: torch.Tensor | None  # [B] int64
    offsets: torch.Tensor | None  # [B] int64
    is_greedy: torch.Tensor | None  # [B] bool
    # [R] fp32 temperature of each flat row when ``target`` / ``draft`` hold logits (0: greedy;
    # target and draft rows share flat indices), None for probabilities
    temperature: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @property
    def vocab_size(self) -> int:
        return self.target.shape[1]


@dataclass(frozen=True)
class TreeCall:
    """One tree verification call as the tree kernels read it: the inputs as given (no index
    map, no cleaned parents, no depths: the kernels derive them), so that the entry runs no
    PyTorch op before the launch. :class:`TreeBatch` is the references' description of the
    same call (built only when a reference runs)."""

    target: torch.Tensor  # [R, V] rows: the padded [B, N+1, V] flattened, or the ragged [T+B, V]
    draft: torch.Tensor | None  # [R, V] or None: point-mass drafts
    tokens: torch.Tensor  # [B, N] padded / [T] ragged int32/int64 as given
    parents: torch.Tensor  # [N] or [B, N] padded / [T] ragged int32/int64 as given (cleaned by the kernels)
    cu_num_nodes: torch.Tensor | None  # [B] ragged, None: padded
    batch_size: int  # B
    num_nodes: int  # N (ragged: max_nodes)
    max_depth: int  # D: the output has D+1 token slots
    policy: str
    is_greedy: torch.Tensor | None  # [B] bool
    temperature: torch.Tensor | None = None  # [B] float per request when the rows hold logits (0: greedy)
    seeds: torch.Tensor | None = None  # [B] int64
    offsets: torch.Tensor | None = None  # [B] int64, None: 0
    counts: torch.Tensor | None = None  # the sampler's counters' buffer (the kernels add the output to it)

    @property
    def vocab_size(self) -> int:
        return self.target.shape[1]


def as_probabilities(tb: TreeBatch) -> TreeBatch:
    """``tb`` with logits rows turned into probabilities (:func:`spec_samplers.torch_ops.probs_from_logits`,
    each row at its temperature); ``tb`` itself when it holds probabilities."""
    t = tb.temperature
    if t is None:
        return tb
    target = probs_from_logits(tb.target, t) if tb.target.shape[0] else tb.target.float()
    draft = None if tb.draft is None else probs_from_logits(tb.draft, t) if tb.draft.shape[0] else tb.draft.float()
    return replace(tb, target=target, draft=draft, temperature=None)


def padded_maps(batch_size: int, num_nodes: int, device: torch.device) -> torch.Tensor:
    """[B, N+1] flat rows of a padded [B, N+1, V] tensor: b * (N+1) + j."""
    b = torch.arange(batch_size, device=device, dtype=torch.int64)[:, None]
    return b * (num_nodes + 1) + torch.arange(num_nodes + 1, device=device, dtype=torch.int64)[None, :]


def ragged_maps(
    cu_num_nodes: torch.Tensor,  # [B] inclusive cumsum of N_b
    num_tokens: int,  # T (flat node count)
    max_nodes: int,  # N >= every N_b
    tokens: torch.Tensor,  # [T] int
    parents: torch.Tensor,  # [T] int64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows [B, N+1], tokens [B, N], parents [B, N]) of a ragged batch: row (b, j) = start_b +
    b + j for j <= N_b (else -1), node j's token and parent at flat index start_b + j - 1 (parent
    -1 past N_b). A malformed request gets no rows at all."""
    start, count = request_spans(cu_num_nodes, num_tokens, max_nodes)  # count -1: malformed
    B = start.shape[0]
    device = start.device
    j = torch.arange(max_nodes + 1, device=device, dtype=torch.int64)[None, :]
    req = torch.arange(B, device=device, dtype=torch.int64)[:, None]
    rows = torch.where(j <= count[:, None], start[:, None] + req + j, -1)
    flat = torch.where(j[:, 1:] <= count[:, None], start[:, None] + j[:, 1:] - 1, -1)  # [B, N]
    safe = flat.clamp(min=0)
    if num_tokens == 0:
        return rows, torch.zeros_like(flat), torch.full_like(flat, NO_PARENT)
    node_tokens = torch.where(flat >= 0, tokens.to(torch.int64)[safe], -1)
    node_parents = torch.where(flat >= 0, parents.to(torch.int64)[safe], NO_PARENT)
    return rows, node_tokens, node_parents
