"""Where each (request, position) of a verification batch reads its vocabulary rows.

One description serves both layouts engines use:

* padded (vLLM V0): targets [B, k+1, V] (row k is the bonus row), drafts [B, k, V], ids [B, k];
* ragged (vLLM V1 and later): targets and drafts [T, V] with one row per draft token, requests
  delimited by ``cu_num_draft_tokens`` (inclusive cumulative sum of k_b, some k_b may be 0), no
  bonus rows.

:class:`RowLayout` holds the shapes (and, ragged, the counts); :class:`VerifyBatch` bundles a
layout with the tensors of one call. References and kernel launchers take a ``VerifyBatch``, so a
sampler writes its algorithm once for both layouts and for probabilities or logits.

Inconsistent ragged metadata (one rule, both backends, no host synchronisation): request b reads
rows [s_b, e_b) with e_b = ``cu_num_draft_tokens[b]`` and s_b = ``cu_num_draft_tokens[b-1]``
(s_0 = 0). It is *well formed* iff 0 <= s_b <= e_b <= T and e_b - s_b <= max_spec_len. A
malformed request reads no row and emits no token (its output row is all -1); well-formed requests
are verified as usual, even when the whole tensor is inconsistent (rows past the last count are
ignored; a non-monotone tensor can give two requests overlapping rows, each reads them as its own).
Strict mode raises instead (:func:`spec_samplers.validation.check_ragged_values`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from spec_samplers.constants import input_error
from spec_samplers.torch_ops import probs_from_logits


@dataclass(frozen=True)
class RowLayout:
    """Shapes of a verification batch, padded or ragged (use :meth:`padded` / :meth:`ragged`).

    ``num_rows`` is the number of flat target rows: B * (K+1) padded, T ragged.
    """

    ragged: bool
    batch_size: int  # B
    max_drafts: int  # K (padded: k; ragged: max_spec_len)
    vocab_size: int  # V
    num_rows: int
    cu_num_draft_tokens: torch.Tensor | None  # [B] int32/int64, ragged only

    @classmethod
    def padded(cls, batch_size: int, k: int, vocab_size: int) -> RowLayout:
        return cls(False, batch_size, k, vocab_size, batch_size * (k + 1), None)

    @classmethod
    def ragged_from(
        cls,
        cu_num_draft_tokens: torch.Tensor,  # [B] int32/int64, inclusive cumsum of k_b
        num_tokens: int,  # T
        max_spec_len: int,  # K
        vocab_size: int,
    ) -> RowLayout:
        # [B] metadata is read as contiguous by the kernels: a strided or expanded view is copied
        cu = cu_num_draft_tokens.contiguous()
        return cls(True, cu.shape[0], max_spec_len, vocab_size, num_tokens, cu)

    def spans(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(start [B], num_draft [B]) int64: request b's first flat row and k_b, with k_b = -1 for a
        malformed request (see the module docstring; ragged only)."""
        assert self.cu_num_draft_tokens is not None
        return request_spans(self.cu_num_draft_tokens, self.num_rows, self.max_drafts)

    def maps(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(target_rows [B, K+1], draft_rows [B, K], num_draft [B]) int64 flat-row indices.

        Padded: target row (b, i) = b * (K+1) + i (i = K is the bonus row), draft row b * K + i.
        Ragged: row start_b + i for i < k_b, else -1 (and every bonus slot is -1); a malformed
        request has k_b = -1 and no rows.
        """
        B, K = self.batch_size, self.max_drafts
        if not self.ragged:
            b = torch.arange(B, device=device, dtype=torch.int64)[:, None]
            target_rows = b * (K + 1) + torch.arange(K + 1, device=device)[None, :]
            draft_rows = b * K + torch.arange(K, device=device)[None, :]
            return target_rows, draft_rows, torch.full((B,), K, dtype=torch.int64, device=device)
        start, num_draft = self.spans(device)
        pos = torch.arange(K + 1, device=start.device, dtype=torch.int64)[None, :]
        target_rows = torch.where(pos < num_draft[:, None], start[:, None] + pos, -1)
        return target_rows, target_rows[:, :K], num_draft

    def request_of_rows(self, num_rows: int, per_request: int, device: torch.device) -> torch.Tensor:
        """[num_rows] int64 request index of each flat row (padded: ``per_request`` rows each;
        ragged: from the cumulative counts), clamped into [0, B) so it can index [B] tensors."""
        if not self.ragged:
            rows = torch.arange(num_rows, device=device, dtype=torch.int64)
            return rows // max(per_request, 1)
        assert self.cu_num_draft_tokens is not None
        rows = torch.arange(num_rows, device=device, dtype=torch.int64)
        req = torch.searchsorted(self.cu_num_draft_tokens.to(torch.int64), rows, right=True)
        return req.clamp(max=max(self.batch_size - 1, 0))


def request_spans(
    cu_num_draft_tokens: torch.Tensor,  # [B] int32/int64, inclusive cumsum of k_b
    num_tokens: int | None,  # T (None: the upper bound e_b <= T is not checked)
    max_spec_len: int,  # K
) -> tuple[torch.Tensor, torch.Tensor]:
    """(start [B], num_draft [B]) int64 of a ragged batch; num_draft is -1 for a malformed
    request (not 0 <= s_b <= e_b <= T, or e_b - s_b > K). Comparisons come before the
    subtraction, so no value of the tensor can overflow into a well-formed span."""
    end = cu_num_draft_tokens.to(torch.int64)
    start = torch.nn.functional.pad(end[:-1], (1, 0), value=0) if end.shape[0] else end
    ok = (start >= 0) & (end >= start)
    if num_tokens is not None:
        ok = ok & (end <= num_tokens)
    count = torch.where(ok, end - start, 0)
    ok = ok & (count <= max_spec_len)
    return start, torch.where(ok, count, -1)


def ragged_layout(
    cu_num_draft_tokens: torch.Tensor, max_spec_len: int, num_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:meth:`RowLayout.maps` of a ragged batch (engine adapters build their own views with it).

    Pass ``num_tokens`` (T) so that requests reaching past T count as malformed (num_draft -1,
    no rows); without it only the other rules apply."""
    start, num_draft = request_spans(cu_num_draft_tokens, num_tokens, max_spec_len)
    pos = torch.arange(max_spec_len + 1, device=start.device, dtype=torch.int64)[None, :]
    target_rows = torch.where(pos < num_draft[:, None], start[:, None] + pos, -1)
    return target_rows, target_rows[:, :max_spec_len], num_draft


#: the [B] fields of a VerifyBatch that the kernels read as contiguous (made so at construction)
_CONTIGUOUS_FIELDS = (
    "bonus_token_ids", "seeds", "offsets", "is_greedy", "temperature", "top_k", "top_p", "min_p", "draft_rows",
    "draft_temperature",
)  # fmt: skip


@dataclass(frozen=True)
class VerifyBatch:
    """The inputs of one verification call, in either layout (validated by the sampler).

    ``logits``: ``target`` / ``draft`` hold logits and ``temperature`` [B] is given (0 = greedy
    request); otherwise they hold probabilities.
    """

    layout: RowLayout
    target: torch.Tensor  # [B, K+1, V] padded or [T, V] ragged, fp32/fp16/bf16
    draft: torch.Tensor | None  # [B, K, V] padded or [T, V] ragged, or None (point-mass drafts)
    draft_token_ids: torch.Tensor  # [B, K] padded or [T] ragged, int32/int64
    bonus_token_ids: torch.Tensor  # [B] int32/int64
    seeds: torch.Tensor | None = None  # [B] int64 (stochastic samplers)
    offsets: torch.Tensor | None = None  # [B] int64, default 0
    is_greedy: torch.Tensor | None = None  # [B] bool (probability inputs)
    temperature: torch.Tensor | None = None  # [B] float (logits inputs), 0 = greedy
    # Per-request filters of logits inputs (SamplingParams' top_k / top_p / min_p, applied to target
    # and draft alike in vLLM's order; spec_samplers.sampling.reference.filtered_softmax_reference).
    # Set together or not at all; a neutral value (0, 1, 0) leaves a request unfiltered.
    top_k: torch.Tensor | None = None  # [B] int64, 0 = off
    top_p: torch.Tensor | None = None  # [B] fp32, 1 = off
    min_p: torch.Tensor | None = None  # [B] fp32, 0 = off
    # Ragged logits inputs: draft row t is ``draft[draft_rows[t]]`` of an [N, V] draft matrix (any
    # row stride: an engine's cache read in place); an index outside [0, N) rejects the draft
    # there (the row is never read). ``draft_temperature`` is the draft rows' T (default
    # ``temperature``; a value not > 0 counts as 1 there).
    draft_rows: torch.Tensor | None = None  # [T] int32/int64
    draft_temperature: torch.Tensor | None = None  # [B] float
    # Ragged logits inputs whose drafts come as probabilities (an engine whose drafter hands over
    # q itself, e.g. vLLM V1's draft probabilities): ``draft`` holds probabilities, read as given
    # (no temperature), while ``target`` holds logits.
    draft_is_probs: bool = False
    #: [2 + >= K] int64, the sampler's acceptance counters ``[accepted, emitted, per position...]``
    #: that a counting launcher adds this call's output to in its finishing step (the sampler
    #: declares ``kernel_counts``); None: the sampler counts with eager ops
    counters: torch.Tensor | None = None

    # Written out (a dataclass keeps a class's own __init__; the fields above stay the list, and
    # tests/test_cpu_path.py checks that this signature is theirs): the generated frozen __init__ sets
    # each of the 16 fields with object.__setattr__, ~1.5 us of a ~17 us host path at B = 1 on
    # CPU, one update of __dict__ ~0.4 us (the instance stays frozen: assignment still raises).
    def __init__(
        self,
        layout: RowLayout,
        target: torch.Tensor,
        draft: torch.Tensor | None,
        draft_token_ids: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        seeds: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        is_greedy: torch.Tensor | None = None,
        temperature: torch.Tensor | None = None,
        top_k: torch.Tensor | None = None,
        top_p: torch.Tensor | None = None,
        min_p: torch.Tensor | None = None,
        draft_rows: torch.Tensor | None = None,
        draft_temperature: torch.Tensor | None = None,
        draft_is_probs: bool = False,
        counters: torch.Tensor | None = None,
    ) -> None:
        fields = self.__dict__
        fields.update(
            layout=layout, target=target, draft=draft, draft_token_ids=draft_token_ids,
            bonus_token_ids=bonus_token_ids, seeds=seeds, offsets=offsets, is_greedy=is_greedy,
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, draft_rows=draft_rows,
            draft_temperature=draft_temperature, draft_is_probs=draft_is_probs, counters=counters,
        )  # fmt: skip
        # The kernels read every [B] tensor as contiguous: a strided or expanded (stride 0) view
        # would be read at the wrong elements or past its storage. The copies are [B] long (a
        # no-op for contiguous tensors) and need no host synchronisation.
        for name in _CONTIGUOUS_FIELDS:
            t = fields[name]
            if t is not None and not t.is_contiguous():
                fields[name] = t.contiguous()

    @property
    def logits(self) -> bool:
        return self.temperature is not None

    @property
    def target_kind(self) -> str:
        """What ``target`` holds: "logits" (``temperature`` [B] given; 0 = greedy request) or
        "probs". Launchers and references branch on this, not on which tensors are present."""
        return "logits" if self.temperature is not None else "probs"

    @property
    def draft_kind(self) -> str:
        """What the drafts are: "point_mass" (no draft law: greedy drafting), "probs" (read as
        given) or "logits" (softmax at ``draft_temperature``, default ``temperature``)."""
        if self.draft is None:
            return "point_mass"
        return "logits" if self.temperature is not None and not self.draft_is_probs else "probs"

    @property
    def filtered(self) -> bool:
        """Logits inputs with per-request top-k / top-p / min-p filters."""
        return self.temperature is not None and self.top_k is not None

    @classmethod
    def padded(
        cls,
        target: torch.Tensor,  # [B, k+1, V]
        bonus_token_ids: torch.Tensor,  # [B, 1] or [B]
        draft: torch.Tensor | None,  # [B, k, V] or None
        draft_token_ids: torch.Tensor,  # [B, k]
        **extra: Any,  # the optional fields by name (tensors, or draft_is_probs)
    ) -> VerifyBatch:
        B, kp1, V = target.shape
        layout = RowLayout.padded(B, kp1 - 1, V)
        return cls(layout, target, draft, draft_token_ids, bonus_token_ids.reshape(B), **extra)

    @classmethod
    def ragged(
        cls,
        target: torch.Tensor,  # [T, V]
        bonus_token_ids: torch.Tensor,  # [B] or [B, 1]
        draft: torch.Tensor | None,  # [T, V] or None
        draft_token_ids: torch.Tensor,  # [T]
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,  # K
        **extra: Any,  # the optional fields by name (tensors, or draft_is_probs)
    ) -> VerifyBatch:
        T, V = target.shape
        layout = RowLayout.ragged_from(cu_num_draft_tokens, T, max_spec_len, V)
        return cls(layout, target, draft, draft_token_ids, bonus_token_ids.reshape(layout.batch_size), **extra)


#: the [B] fields of a VerifyBatch, sliced with its requests
_REQUEST_FIELDS = ("bonus_token_ids", "seeds", "offsets", "is_greedy", "temperature", "top_k", "top_p", "min_p")
_REQUEST_FIELDS_RAGGED = ("draft_temperature",)


def request_slice(batch: VerifyBatch, start: int, stop: int, rows: tuple[int, int] | None = None) -> VerifyBatch:
    """Requests [start, stop) of ``batch`` as a batch of their own (views: nothing is copied but
    [B]-sized metadata). Padded: their [K+1] / [K] rows. Ragged: ``rows`` = (lo, hi) must be the
    flat rows they read, ``cu_num_draft_tokens[start-1]`` (0 for the first) and
    ``cu_num_draft_tokens[stop-1]``, of metadata that is non-decreasing from 0 and ends <= T
    (:func:`spec_samplers.chunking.chunk_bounds` checks that; each request then reads the same
    rows as in the whole batch)."""
    layout = batch.layout
    fields: dict[str, Any] = {}
    for name in _REQUEST_FIELDS + _REQUEST_FIELDS_RAGGED:
        t = getattr(batch, name)
        fields[name] = None if t is None else t[start:stop]
    if not layout.ragged:
        return VerifyBatch(
            RowLayout.padded(stop - start, layout.max_drafts, layout.vocab_size),
            batch.target[start:stop],
            None if batch.draft is None else batch.draft[start:stop],
            batch.draft_token_ids[start:stop],
            draft_rows=batch.draft_rows,
            draft_is_probs=batch.draft_is_probs,
            counters=batch.counters,  # (each chunk's op adds its requests')
            **fields,
        )
    assert rows is not None and layout.cu_num_draft_tokens is not None
    lo, hi = rows
    cu = layout.cu_num_draft_tokens[start:stop] - lo
    draft = batch.draft
    draft_rows = batch.draft_rows
    if draft_rows is not None:  # the draft is an [N, V] matrix that draft_rows index: kept whole
        draft_rows = draft_rows[lo:hi]
    elif draft is not None:
        draft = draft[lo:hi]
    return VerifyBatch(
        RowLayout(True, stop - start, layout.max_drafts, layout.vocab_size, hi - lo, cu),
        batch.target[lo:hi],
        draft,
        batch.draft_token_ids[lo:hi],
        draft_rows=draft_rows,
        draft_is_probs=batch.draft_is_probs,
        counters=batch.counters,
        **fields,
    )


# --- Token trees (spec_samplers.tree) ---------------------------------------------------------
# Token trees: how a batch of draft trees is laid out, checked and described to the verifiers.
#
# A tree has a root, node 0 (the last accepted token, whose target row gives the distribution of
# the first new token), and N draft nodes 1..N. Node j holds one draft token and has a parent in
# [0, j): parents come before their children, so processing nodes in index order visits every
# parent before its children. Siblings (nodes with the same parent) are ordered by index: that is
# the order in which the verifiers try them and, for ``"without_replacement"`` drafts, the order in
# which they were drawn. Example (N = 5, ``parents = [0, 0, 1, 1, 3]``)::
#
#     node:    0 (root)
#             / \\
#            1   2          depth 1
#           / \\
#          3   4            depth 2
#          |
#          5                depth 3
#
# Rows (padded layout): ``target[b, j]`` is the target distribution after the path root..j (row 0:
# after the root), ``draft[b, j]`` the draft distribution node j's children were drawn from
# (leaves' rows are never read), ``draft_token_ids[b, j - 1]`` node j's token.
#
# Ragged layout: request b has N_b nodes; ``cu_num_nodes`` is the inclusive cumulative sum of N_b.
# Node tokens and parents are flat [T] (T = sum N_b; node j of request b at cu[b-1] + j - 1, parents
# local indices), target and draft rows flat [T + B, V] with request b's N_b + 1 rows (root first)
# at cu[b-1] + b. A request whose counts are malformed (as :mod:`spec_samplers.layout`'s rule, with
# ``max_nodes`` for K and T + B rows) reads nothing and emits no token.
#
# Invalid parents (no host synchronisation): a parent outside [0, j) detaches node j: it is never a
# child of any node, so neither it nor its subtree is ever tried. Strict mode raises instead.


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
    #: {top_k, top_p, min_p} [B] each when the requests filter (sampling_params=; logits rows), else None or {}
    filters: dict[str, torch.Tensor] | None = None

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
