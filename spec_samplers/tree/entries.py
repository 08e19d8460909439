"""The tree entries every sampler with a tree rule has (:class:`TreeEntries`, a mixin).

``forward_tree`` (padded), ``forward_tree_ragged`` (flattened trees with cumulative node
counts) and their ``*_from_logits`` twins (``temperature`` or ``sampling_params=``) validate,
resolve seeds, describe the call (a :class:`~spec_samplers.layout.TreeCall`, the inputs as
given, for a kernel declaring ``tree_kernel_takes_call``: host checks only, the kernel adds the
counters; else a :class:`~spec_samplers.layout.TreeBatch`), run the sampler's tree op
(``tree_kernel`` when the Triton backend runs, else ``tree_reference``) and update the counters
(``num_accepted_per_position`` counts per depth). A kernel call of a shape checked before (same
shapes, dtypes, devices, host arguments and launch config) skips the checks and decisions
(:class:`TreePrepared`, kept in the chain entries' memo): only the seeds, the TreeCall and the
counters are each call's; strict mode, ``check_values``, ``seeded_seqs`` and Dynamo tracing check
every call. Layout:
:mod:`spec_samplers.layout`; rules and their exactness: :mod:`spec_samplers.tree.reference`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar, NamedTuple

import torch

from spec_samplers.base import Randomness, SpecDecodeBaseSampler, _call_key, _sampling_filters
from spec_samplers.chunking import run_tree_chunked
from spec_samplers.constants import input_error
from spec_samplers.kernels.backend import LaunchConfig, launch_config, use_triton
from spec_samplers.layout import (
    TreeBatch,
    TreeCall,
    as_parents,
    check_parents_tensor,
    check_parents_values,
    check_policy,
    clean_parents,
    node_depths,
    padded_maps,
    ragged_maps,
    static_max_depth,
)
from spec_samplers.output import TreeOutput
from spec_samplers.rng import row_seeds
from spec_samplers.sampling.reference import filtered_softmax_reference
from spec_samplers.sampling_params import SamplingParams, filter_tensors
from spec_samplers.torch_ops import probs_from_logits
from spec_samplers.validation import ID_DTYPES, PROBS_DTYPES, check_row_mask, check_temperature, require_tensor


def _check(name: str, t: object, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...], device: Any) -> None:
    t = require_tensor(name, t)
    if tuple(t.shape) != shape:
        raise input_error(name, f"shape {shape}", f"shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise input_error(name, "dtype in " + ", ".join(str(d) for d in dtypes), t.dtype)
    if device is not None and t.device != device:
        raise input_error(name, f"device {device}", f"device {t.device}")


def _rows_to_probs(
    logits: torch.Tensor,  # [R, V]
    row_request: torch.Tensor,  # [R] int64 request of each row
    temperature: torch.Tensor,  # [B] fp32 (0 = greedy)
    filters: dict[str, torch.Tensor],  # {top_k, top_p, min_p} [B] each, or {}
) -> torch.Tensor:
    """[R, V] fp32: each row's softmax at its request's temperature (and filters), the rule of
    the chain logits entries (:func:`spec_samplers.torch_ops.probs_from_logits`,
    :func:`spec_samplers.sampling.reference.filtered_softmax_reference`)."""
    if logits.shape[0] == 0:
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    t = temperature.to(torch.float32)[row_request]
    if not filters:
        return probs_from_logits(logits, t)
    top_k, top_p, min_p = (filters[name][row_request] for name in ("top_k", "top_p", "min_p"))
    return filtered_softmax_reference(logits, t, top_k, top_p, min_p)


class TreeEntries(SpecDecodeBaseSampler):
    """Mixin: the tree entries. A sampler class lists it before its base family and declares
    ``tree_reference`` (``fn(TreeBatch, **tree_options()) -> TreeOutput``), optionally
    ``tree_kernel`` (the launcher, same signature plus ``config=``) and ``tree_random``
    (whether the rule draws random numbers: then the entries take ``seeds`` / ``offsets`` /
    ``seeded_seqs``). A
    sampler without a tree rule sets ``tree_unsupported`` to the reason; its entries raise
    :class:`NotImplementedError` with it.

    Every entry returns :class:`~spec_samplers.output.TreeOutput` ``(token_ids [B, D+1],
    node_ids [B, D])`` int64, -1 padded, D = ``max_depth`` (default: the tree's depth when
    ``parents`` is a list, else the node count N, ``max_nodes`` ragged: never a device read).
    """

    tree_reference: ClassVar[Callable[..., TreeOutput] | None] = None
    tree_kernel: ClassVar[Callable[..., TreeOutput] | str | None] = None
    tree_random: ClassVar[bool] = True
    tree_unsupported: ClassVar[str | None] = None
    #: ``tree_kernel`` takes a :class:`~spec_samplers.layout.TreeCall` (the inputs as given,
    #: no PyTorch op before the launch) instead of a TreeBatch
    tree_kernel_takes_call: ClassVar[bool] = False

    def tree_options(self) -> dict[str, Any]:
        """Keyword options of the tree ops (the chain ops' by default)."""
        return self.op_options()

    # -- entries ----------------------------------------------------------------------------------

    def forward_tree(
        self,
        target_probs: torch.Tensor,  # [B, N+1, V] fp32/fp16/bf16: row j = target after the path root..j
        draft_probs: torch.Tensor | None,  # [B, N+1, V] or None: row j = what node j's children were drawn from
        draft_token_ids: torch.Tensor,  # [B, N] int32/int64: token of node j = 1..N
        parents: torch.Tensor | Sequence[int],  # [N] or [B, N] int: parent of node j, in [0, j)
        draft_sampling: str = "independent",
        *,
        max_depth: int | None = None,
        seeds: torch.Tensor | None = None,  # [B] int64
        offsets: torch.Tensor | None = None,  # [B] int64
        seeded_seqs: dict[int, torch.Generator] | None = None,
        is_greedy: torch.Tensor | None = None,  # [B] bool
    ) -> TreeOutput:
        """Verify one draft tree per request (layout: :mod:`spec_samplers.layout`).

        ``draft_sampling`` says how each node's children were drawn from its draft row:
        ``"independent"`` (i.i.d.), ``"without_replacement"`` (sequentially, drawn tokens
        removed, in index order) or ``"deterministic"`` (any rule of the context, e.g. top-k;
        ``draft_probs`` may be None, which means this for every policy). Returns
        ``TreeOutput(token_ids [B, D+1], node_ids [B, D])``.

        Example::

            >>> import torch
            >>> from spec_samplers import RejectionSampler
            >>> B, V, parents = 2, 16, [0, 0, 1, 1, 3]              # N = 5 nodes, depth 3
            >>> q = torch.softmax(torch.randn(B, 6, V), -1)         # [B, N+1, V]
            >>> p = torch.softmax(torch.randn(B, 6, V), -1)
            >>> ids = torch.randint(0, V, (B, 5))                    # [B, N]
            >>> out = RejectionSampler().forward_tree(q, p, ids, parents)
            >>> out.token_ids.shape, out.node_ids.shape
            (torch.Size([2, 4]), torch.Size([2, 3]))
        """
        host = ("forward_tree", draft_sampling, type(max_depth), max_depth, None)
        tensors = (target_probs, draft_probs, draft_token_ids, is_greedy, None)
        key, prepared = self._tree_memo(host, parents, tensors, seeds, offsets, seeded_seqs)
        if prepared is not None:
            return self._run_tree_prepared(prepared, target_probs, draft_probs, draft_token_ids, parents, None,
                                           is_greedy, None, seeds, offsets)  # fmt: skip
        B, N = self._check_padded(target_probs, draft_probs, draft_token_ids, "target_probs", "draft_probs")
        takes_call = self._takes_call(target_probs.device)
        args = (target_probs, draft_probs, draft_token_ids, parents, draft_sampling, max_depth, is_greedy)
        tb = self._padded_call(*args, None) if takes_call else self._padded_batch(*args)
        return self._run_tree(tb, B * N, seeds, offsets, seeded_seqs, key)

    def forward_tree_ragged(
        self,
        target_probs: torch.Tensor,  # [T+B, V]: request b's N_b+1 rows (root first) at cu[b-1] + b
        draft_probs: torch.Tensor | None,  # [T+B, V] or None
        draft_token_ids: torch.Tensor,  # [T] int: node j of request b at cu[b-1] + j - 1
        parents: torch.Tensor,  # [T] int: local parent indices, in [0, j)
        cu_num_nodes: torch.Tensor,  # [B] int32/int64 inclusive cumsum of N_b
        max_nodes: int,  # N >= every N_b
        draft_sampling: str = "independent",
        *,
        max_depth: int | None = None,
        seeds: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        seeded_seqs: dict[int, torch.Generator] | None = None,
        is_greedy: torch.Tensor | None = None,
    ) -> TreeOutput:
        """Trees of different sizes, flattened (layout: :mod:`spec_samplers.layout`). Same
        tokens as :meth:`forward_tree` on the same trees padded (and seeds)."""
        host = ("forward_tree_ragged", draft_sampling, type(max_depth), max_depth, (type(max_nodes), max_nodes))
        tensors = (target_probs, draft_probs, draft_token_ids, is_greedy, cu_num_nodes)
        key, prepared = self._tree_memo(host, parents, tensors, seeds, offsets, seeded_seqs)
        if prepared is not None:
            return self._run_tree_prepared(prepared, target_probs, draft_probs, draft_token_ids, parents, cu_num_nodes,
                                           is_greedy, None, seeds, offsets)  # fmt: skip
        names = ("target_probs", "draft_probs")
        self._check_ragged(target_probs, draft_probs, draft_token_ids, parents, cu_num_nodes, max_nodes, names)
        takes_call = self._takes_call(target_probs.device)
        args = (target_probs, draft_probs, draft_token_ids, parents, cu_num_nodes, max_nodes, draft_sampling)
        if takes_call:
            tb: TreeBatch | TreeCall = self._ragged_call(*args, max_depth, is_greedy, None)
        else:
            tb = self._ragged_batch(*args, max_depth, is_greedy)
        return self._run_tree(tb, draft_token_ids.shape[0], seeds, offsets, seeded_seqs, key)

    def forward_tree_from_logits(
        self,
        target_logits: torch.Tensor,  # [B, N+1, V]
        draft_logits: torch.Tensor | None,  # [B, N+1, V] or None
        draft_token_ids: torch.Tensor,  # [B, N]
        parents: torch.Tensor | Sequence[int],  # [N] or [B, N]
        temperature: torch.Tensor | None = None,  # [B] float, 0 = greedy request
        draft_sampling: str = "independent",
        *,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        max_depth: int | None = None,
        seeds: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        seeded_seqs: dict[int, torch.Generator] | None = None,
    ) -> TreeOutput:
        """:meth:`forward_tree` on q = softmax(target_logits / T), p = softmax(draft_logits / T)
        per request (T == 0: greedy on the target's argmax), or, with ``sampling_params=``, both
        processed as the chain logits entries do (temperature, min-p, top-k, top-p): exact for the
        processed target when the children were drawn from the processed draft rows."""
        host = ("forward_tree_from_logits", draft_sampling, type(max_depth), max_depth, None, sampling_params is None)
        tensors = (target_logits, draft_logits, draft_token_ids, temperature, None)
        key, prepared = self._tree_memo(host, parents, tensors, seeds, offsets, seeded_seqs)
        if prepared is not None:
            filters = None
            if sampling_params is not None:  # (the parameters' values are each call's)
                temperature, filters = filter_tensors(sampling_params, prepared.batch_size, target_logits.device)
            return self._run_tree_prepared(prepared, target_logits, draft_logits, draft_token_ids, parents, None, None,
                                           temperature, seeds, offsets, filters)  # fmt: skip
        B, N = self._check_padded(target_logits, draft_logits, draft_token_ids, "target_logits", "draft_logits")
        if self._takes_call(target_logits.device):  # the kernel reads the logits (softmax rule, filter cuts)
            t, filters = self._logits_params(temperature, sampling_params, B, target_logits.device)
            args = (target_logits, draft_logits, draft_token_ids, parents, draft_sampling, max_depth, None)
            call = replace(self._padded_call(*args, t), filters=filters)
            return self._run_tree(call, B * N, seeds, offsets, seeded_seqs, key)
        V = target_logits.shape[2]
        request = torch.arange(B, device=target_logits.device).repeat_interleave(N + 1)
        greedy, q, p, row_temp = self._logits_rows(
            target_logits.reshape(-1, V), None if draft_logits is None else draft_logits.reshape(-1, V),
            request, temperature, sampling_params, B,
        )  # fmt: skip
        q = q.view(B, N + 1, V)
        p = None if p is None else p.view(B, N + 1, V)
        rows = (q, p, draft_token_ids, parents, draft_sampling, max_depth, greedy)
        tb = replace(self._padded_batch(*rows), temperature=row_temp)
        return self._run_tree(tb, B * N, seeds, offsets, seeded_seqs)

    def forward_tree_ragged_from_logits(
        self,
        target_logits: torch.Tensor,  # [T+B, V]
        draft_logits: torch.Tensor | None,  # [T+B, V] or None
        draft_token_ids: torch.Tensor,  # [T]
        parents: torch.Tensor,  # [T]
        cu_num_nodes: torch.Tensor,  # [B]
        max_nodes: int,
        temperature: torch.Tensor | None = None,  # [B]
        draft_sampling: str = "independent",
        *,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        max_depth: int | None = None,
        seeds: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        seeded_seqs: dict[int, torch.Generator] | None = None,
    ) -> TreeOutput:
        """Ragged twin of :meth:`forward_tree_from_logits`."""
        host = ("forward_tree_ragged_from_logits", draft_sampling, type(max_depth), max_depth,
                (type(max_nodes), max_nodes), sampling_params is None)  # fmt: skip
        tensors = (target_logits, draft_logits, draft_token_ids, temperature, cu_num_nodes)
        key, prepared = self._tree_memo(host, parents, tensors, seeds, offsets, seeded_seqs)
        if prepared is not None:
            filters = None
            if sampling_params is not None:  # (the parameters' values are each call's)
                temperature, filters = filter_tensors(sampling_params, prepared.batch_size, target_logits.device)
            return self._run_tree_prepared(prepared, target_logits, draft_logits, draft_token_ids, parents,
                                           cu_num_nodes, None, temperature, seeds, offsets, filters)  # fmt: skip
        names = ("target_logits", "draft_logits")
        self._check_ragged(target_logits, draft_logits, draft_token_ids, parents, cu_num_nodes, max_nodes, names)
        B = cu_num_nodes.shape[0]
        args = (draft_token_ids, parents, cu_num_nodes, max_nodes, draft_sampling)
        if self._takes_call(target_logits.device):  # the kernel reads the logits (softmax rule, filter cuts)
            t, filters = self._logits_params(temperature, sampling_params, B, target_logits.device)
            call = replace(self._ragged_call(target_logits, draft_logits, *args, max_depth, None, t), filters=filters)
            return self._run_tree(call, draft_token_ids.shape[0], seeds, offsets, seeded_seqs, key)
        rows = torch.arange(target_logits.shape[0], device=target_logits.device)
        # row r belongs to the request b with cu[b-1] + b <= r < cu[b] + b + 1
        ends = cu_num_nodes.to(torch.int64) + torch.arange(1, B + 1, device=rows.device)
        request = torch.searchsorted(ends, rows, right=True).clamp(max=max(B - 1, 0))
        greedy, q, p, row_temp = self._logits_rows(
            target_logits, draft_logits, request, temperature, sampling_params, B
        )
        tb = replace(self._ragged_batch(q, p, *args, max_depth, greedy), temperature=row_temp)
        return self._run_tree(tb, draft_token_ids.shape[0], seeds, offsets, seeded_seqs)

    # -- the pipeline -----------------------------------------------------------------------------

    def _require_tree(self, entry: str) -> None:
        why = type(self).tree_unsupported
        if why is not None or type(self).tree_reference is None:
            raise NotImplementedError(f"{type(self).__name__}.{entry}: {why or 'no tree rule declared'}")

    def _check_padded(self, target: Any, draft: Any, tokens: Any, target_name: str, draft_name: str) -> tuple[int, int]:
        self._require_tree("forward_tree")
        if require_tensor(target_name, target).dim() != 3:
            raise input_error(target_name, "a [B, N+1, V] tensor", f"shape {tuple(target.shape)}")
        B, Np1, V = target.shape
        _check(target_name, target, (B, Np1, V), PROBS_DTYPES, None)
        if Np1 < 1 or V < 1:
            raise input_error(target_name, "N+1 >= 1 rows per request and V >= 1", f"shape {tuple(target.shape)}")
        if draft is not None:
            _check(draft_name, draft, (B, Np1, V), PROBS_DTYPES, target.device)
        _check("draft_token_ids", tokens, (B, Np1 - 1), ID_DTYPES, target.device)
        return B, Np1 - 1

    def _check_ragged(
        self,
        target: Any,
        draft: Any,
        tokens: Any,
        parents: Any,
        cu: Any,
        max_nodes: object,
        names: tuple[str, str],
    ) -> None:
        self._require_tree("forward_tree_ragged")
        if require_tensor("cu_num_nodes", cu).dim() != 1:
            raise input_error("cu_num_nodes", "a [B] int tensor", f"shape {tuple(cu.shape)}")
        if require_tensor("draft_token_ids", tokens).dim() != 1:
            raise input_error("draft_token_ids", "a [T] int tensor", f"shape {tuple(tokens.shape)}")
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 0:
            raise input_error("max_nodes", "an int >= 0", repr(max_nodes))
        B, T = cu.shape[0], tokens.shape[0]
        if require_tensor(names[0], target).dim() != 2:
            raise input_error(names[0], f"a [T+B, V] = [{T + B}, V] tensor", f"shape {tuple(target.shape)}")
        V = target.shape[1]
        _check(names[0], target, (T + B, V), PROBS_DTYPES, None)
        device = target.device
        if draft is not None:
            _check(names[1], draft, (T + B, V), PROBS_DTYPES, device)
        _check("draft_token_ids", tokens, (T,), ID_DTYPES, device)
        _check("parents", parents, (T,), ID_DTYPES, device)
        _check("cu_num_nodes", cu, (B,), ID_DTYPES, device)
        if self._strict_mode:
            from spec_samplers.validation import check_ragged_values

            check_ragged_values(cu, T, max_nodes)

    def _parents(self, parents: object, B: int, N: int, device: torch.device) -> tuple[torch.Tensor, int | None]:
        """([B, N] cleaned parents, the depth when it is known without a device read)."""
        known = static_max_depth(list(parents)) if isinstance(parents, (list, tuple)) else None
        t = as_parents(parents, device)
        if t.dim() == 1:
            if t.shape[0] != N:
                raise input_error("parents", f"shape ({N},) or ({B}, {N})", f"shape {tuple(t.shape)}")
            t = t[None, :].expand(B, N)
        elif tuple(t.shape) != (B, N):
            raise input_error("parents", f"shape ({N},) or ({B}, {N})", f"shape {tuple(t.shape)}")
        if self._strict_mode:
            check_parents_values(t)
        return clean_parents(t), known

    def _finish_batch(
        self,
        target: torch.Tensor,
        draft: torch.Tensor | None,
        rows: torch.Tensor,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        known_depth: int | None,
        draft_sampling: str,
        max_depth: int | None,
        is_greedy: torch.Tensor | None,
    ) -> TreeBatch:
        policy = check_policy(draft_sampling)
        if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0):
            raise input_error("max_depth", "an int >= 0 or None", repr(max_depth))
        B = tokens.shape[0]
        check_row_mask("is_greedy", is_greedy, B, target.device)
        if self._strict_mode and tokens.numel():
            from spec_samplers.validation import check_ids_in_range

            check_ids_in_range("draft_token_ids", torch.where(parents >= 0, tokens, 0), target.shape[1])
        depth = node_depths(parents)
        if max_depth is None:  # (never a device read: the node count bounds the depth)
            max_depth = known_depth if known_depth is not None else tokens.shape[1]
        return TreeBatch(
            target=target,
            draft=draft,
            target_rows=rows,
            draft_rows=rows,
            tokens=tokens.to(torch.int64),
            parents=parents,
            depth=depth,
            max_depth=max_depth,
            policy=policy,
            seeds=None,
            offsets=None,
            is_greedy=is_greedy,
        )

    def _padded_batch(
        self,
        target: torch.Tensor,
        draft: torch.Tensor | None,
        tokens: torch.Tensor,
        parents: object,
        draft_sampling: str,
        max_depth: int | None,
        is_greedy: torch.Tensor | None,
    ) -> TreeBatch:
        B, Np1, V = target.shape
        device = target.device
        par, known = self._parents(parents, B, Np1 - 1, device)
        flat_draft = None if draft is None else draft.reshape(-1, V)
        return self._finish_batch(
            target.reshape(-1, V), flat_draft, padded_maps(B, Np1 - 1, device), tokens, par, known,
            draft_sampling, max_depth, is_greedy,
        )  # fmt: skip

    def _ragged_batch(
        self,
        target: torch.Tensor,
        draft: torch.Tensor | None,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        cu: torch.Tensor,
        max_nodes: int,
        draft_sampling: str,
        max_depth: int | None,
        is_greedy: torch.Tensor | None,
    ) -> TreeBatch:
        rows, node_tokens, node_parents = ragged_maps(cu, tokens.shape[0], max_nodes, tokens, parents)
        if self._strict_mode:
            check_parents_values(torch.where(node_parents >= 0, node_parents, 0))
        return self._finish_batch(
            target, draft, rows, node_tokens, clean_parents(node_parents), None, draft_sampling, max_depth, is_greedy
        )

    def _logits_rows(
        self,
        target: torch.Tensor,  # [R, V] logits
        draft: torch.Tensor | None,  # [R, V] or None
        request: torch.Tensor,  # [R] request of each row
        temperature: torch.Tensor | None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        B: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(is_greedy [B], target rows, draft rows, temperature per row [R] or None). Without
        SamplingParams filters the rows stay logits (the kernels apply the softmax as they read;
        the references call :func:`~spec_samplers.layout.as_probabilities`); with filters
        they are processed into probabilities here."""
        if (temperature is None) == (sampling_params is None):
            raise input_error("temperature", "a [B] float tensor (0 = greedy), or sampling_params= (one of them)", None)
        filters: dict[str, torch.Tensor] = {}
        if temperature is not None:
            check_temperature(temperature, B, target.device, self._strict_mode)
            t = temperature.to(torch.float32)
        else:
            assert sampling_params is not None
            t, filters = _sampling_filters(sampling_params, B, target.device)
        if not filters:
            return t == 0, target, draft, t[request] if target.shape[0] else t[:0]
        q = _rows_to_probs(target, request, t, filters)
        p = None if draft is None else _rows_to_probs(draft, request, t, filters)
        return t == 0, q, p, None

    def _takes_call(self, device: torch.device) -> bool:
        """Whether the tree op of this call is a kernel that reads a :class:`TreeCall` (declared by
        ``tree_kernel_takes_call``; the backend decision of :meth:`_choose_op`): then the entry
        builds no :class:`TreeBatch`."""
        cls = type(self)
        kernel = cls.tree_kernel is not None and use_triton(self.backend, device, launch_config())
        return cls.tree_kernel_takes_call and kernel

    def _logits_params(
        self,
        temperature: torch.Tensor | None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        B: int,
        device: torch.device,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(temperature [B], {top_k, top_p, min_p} [B] each, or {} without filters) of a logits
        entry whose kernel reads the logits: ``temperature=`` checked, or ``sampling_params=``'s
        (:func:`~spec_samplers.sampling_params.filter_tensors`); one of them."""
        if (temperature is None) == (sampling_params is None):
            raise input_error("temperature", "a [B] float tensor (0 = greedy), or sampling_params= (one of them)", None)
        if sampling_params is None:
            assert temperature is not None
            check_temperature(temperature, B, device, self._strict_mode)
            return temperature, {}
        return filter_tensors(sampling_params, B, device)

    def _call_checks(self, draft_sampling: str, max_depth: int | None, is_greedy: Any, B: int, device: Any) -> str:
        """The host checks of :meth:`_finish_batch` (metadata only)."""
        policy = check_policy(draft_sampling)
        if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0):
            raise input_error("max_depth", "an int >= 0 or None", repr(max_depth))
        check_row_mask("is_greedy", is_greedy, B, device)
        return policy

    def _padded_call(
        self,
        target: torch.Tensor,  # [B, N+1, V]
        draft: torch.Tensor | None,
        tokens: torch.Tensor,  # [B, N]
        parents: object,
        draft_sampling: str,
        max_depth: int | None,
        is_greedy: torch.Tensor | None,
        temperature: torch.Tensor | None,  # [B]: the rows hold logits
    ) -> TreeCall:
        """The padded call as the kernels read it: host checks only (strict mode: the
        :class:`TreeBatch` checks too, which read the device)."""
        B, Np1, V = target.shape
        N = Np1 - 1
        device = target.device
        policy = self._call_checks(draft_sampling, max_depth, is_greedy, B, device)
        known = None
        if isinstance(parents, (list, tuple)):
            par = _parents_tensor(parents, device)
            known = static_max_depth(list(parents))
        else:
            par = check_parents_tensor(parents, device)
        if tuple(par.shape) not in ((N,), (B, N)):
            raise input_error("parents", f"shape ({N},) or ({B}, {N})", f"shape {tuple(par.shape)}")
        if self._strict_mode:
            self._padded_batch(target, draft, tokens, parents, draft_sampling, max_depth, is_greedy)
        depth = max_depth if max_depth is not None else known if known is not None else N
        flat_draft = None if draft is None else draft.reshape(-1, V)
        return TreeCall(
            target.reshape(-1, V), flat_draft, tokens, par, None, B, N, depth, policy, is_greedy, temperature
        )

    def _ragged_call(
        self,
        target: torch.Tensor,  # [T+B, V]
        draft: torch.Tensor | None,
        tokens: torch.Tensor,  # [T]
        parents: torch.Tensor,  # [T]
        cu: torch.Tensor,  # [B]
        max_nodes: int,
        draft_sampling: str,
        max_depth: int | None,
        is_greedy: torch.Tensor | None,
        temperature: torch.Tensor | None,
    ) -> TreeCall:
        """The ragged call as the kernels read it (checked by :meth:`_check_ragged`; strict mode:
        the :class:`TreeBatch` checks too)."""
        B = cu.shape[0]
        policy = self._call_checks(draft_sampling, max_depth, is_greedy, B, target.device)
        if self._strict_mode:
            self._ragged_batch(target, draft, tokens, parents, cu, max_nodes, draft_sampling, max_depth, is_greedy)
        depth = max_depth if max_depth is not None else max_nodes
        return TreeCall(target, draft, tokens, parents, cu, B, max_nodes, depth, policy, is_greedy, temperature)

    def _run_tree(
        self,
        tb: TreeBatch | TreeCall,
        num_nodes: int,
        seeds: torch.Tensor | None,
        offsets: torch.Tensor | None,
        seeded_seqs: dict[int, torch.Generator] | None,
        key: tuple[Any, ...] | None = None,
    ) -> TreeOutput:
        """The tree pipeline's tail, shared with the chain entries: seeds (:meth:`_seeds`), the
        backend decision (:meth:`_choose_op`; options bound at the call: a sampler may set them
        while building the batch), the counters (added by the kernel of a :class:`TreeCall`).
        A :class:`TreeCall` checked under ``key`` is remembered (:meth:`_tree_memo`)."""
        cls = type(self)
        device = tb.target.device
        assert cls.tree_reference is not None  # _require_tree
        op = self._choose_op(cls.tree_kernel, cls.tree_reference, run_tree_chunked, device, {})
        if cls.tree_random:
            seeds, offsets = self._seeds(tb.batch_size, device, Randomness(seeded_seqs, seeds, offsets))
            if isinstance(tb, TreeBatch):
                offsets = torch.zeros_like(seeds) if offsets is None else offsets
            tb = replace(tb, seeds=seeds, offsets=offsets)
        elif seeds is not None or offsets is not None or seeded_seqs:
            raise input_error("seeds", f"None ({cls.__name__} draws no random numbers)", "seeds")
        if isinstance(tb, TreeBatch):
            out = op(tb, **self.tree_options())
            self._update_counters(out.token_ids, num_draft_tokens=num_nodes)
            return out
        prepared = TreePrepared(
            config=launch_config(),
            op=op,
            options_call=_options_call(cls),
            padded=tb.cu_num_nodes is None,
            parents=tb.parents,
            batch_size=tb.batch_size,
            num_nodes=tb.num_nodes,
            max_depth=tb.max_depth,
            policy=tb.policy,
            vocab_size=tb.vocab_size,
            draft_nodes=num_nodes,
            meta=device.type == "meta",
            random=cls.tree_random,
        )
        if key is not None:
            if len(self._prepared) >= 64:  # (as the chain entries' memo: a few shapes per engine)
                self._prepared.clear()
            memo: dict[tuple[Any, ...], Any] = self._prepared
            memo[key] = prepared
        return self._run_tree_prepared(prepared, tb.target, tb.draft, tb.tokens, tb.parents, tb.cu_num_nodes,
                                       tb.is_greedy, tb.temperature, tb.seeds, tb.offsets, tb.filters)  # fmt: skip

    def _tree_memo(
        self,
        host: tuple[Any, ...],  # the entry's name and its host arguments that the checks read
        parents: object,
        tensors: tuple[torch.Tensor | None, ...],
        seeds: torch.Tensor | None,
        offsets: torch.Tensor | None,
        seeded_seqs: dict[int, torch.Generator] | None,
    ) -> tuple[tuple[Any, ...] | None, TreePrepared | None]:
        """(the key of this call's shape, its :class:`TreePrepared` when a call of that shape was
        checked under this launch config): the chain entries' memo
        (:meth:`~spec_samplers.base.SpecDecodeBaseSampler._prepare`, ``_prepared``), under the same
        rules (strict mode, ``check_values`` and Dynamo tracing check every call; a parents list is
        part of the key, by value and type; ``seeded_seqs`` draws per call: checked every call)."""
        if self._strict_mode or self._check_values or seeded_seqs or torch.compiler.is_compiling():
            return None, None
        if isinstance(parents, torch.Tensor):
            host += (None,)
            tensors += (parents,)
        elif isinstance(parents, (list, tuple)):
            host += (type(parents), tuple(parents), tuple(map(type, parents)))
        else:
            return None, None
        key = _call_key(host + (self.backend,), tensors + (seeds, offsets))
        try:
            prepared: TreePrepared | None = self._prepared.get(key) if key is not None else None  # type: ignore[assignment]
        except TypeError:  # an unhashable argument: its check raises by name
            return None, None
        if prepared is None or prepared.config is not launch_config():
            return key, None
        return key, prepared

    def _run_tree_prepared(
        self,
        prepared: TreePrepared,
        target: torch.Tensor,
        draft: torch.Tensor | None,
        tokens: torch.Tensor,
        parents: object,
        cu: torch.Tensor | None,
        is_greedy: torch.Tensor | None,
        temperature: torch.Tensor | None,
        seeds: torch.Tensor | None,
        offsets: torch.Tensor | None,
        filters: dict[str, torch.Tensor] | None = None,  # the requests' {top_k, top_p, min_p} (logits rows)
    ) -> TreeOutput:
        """A call of a shape checked before (:meth:`_tree_memo`), or just checked (:meth:`_run_tree`,
        the seeds resolved): only what depends on the values runs (the seeds, the
        :class:`TreeCall`, the counters: the kernel adds them; a scratch buffer on meta tensors,
        where nothing is counted), the op's options bound now."""
        p = prepared
        device = target.device
        if p.padded:
            V = p.vocab_size
            target, draft = target.reshape(-1, V), None if draft is None else draft.reshape(-1, V)
        if p.random:
            seeds = row_seeds(p.batch_size, device) if seeds is None else seeds.to(torch.int64)
            offsets = None if offsets is None else offsets.to(torch.int64)
        par = parents if isinstance(parents, torch.Tensor) else p.parents
        D = p.max_depth
        counts = torch.empty(2 + D, dtype=torch.long, device=device) if p.meta else self._counter_slots(D, device)
        tc = TreeCall(target, draft, tokens, par, cu, p.batch_size, p.num_nodes, D, p.policy, is_greedy, temperature,
                      seeds, offsets, counts, filters)  # fmt: skip
        out: TreeOutput = p.op(tc, **(self.tree_options() if p.options_call else self._options))
        if not p.meta:
            self.num_draft_tokens += p.draft_nodes
        return out


def _options_call(cls: type[TreeEntries]) -> bool:
    """Whether the tree ops' options come from an overridden ``tree_options()`` / ``op_options()``
    (called every call), else the sampler's ``_options`` (read as they are then)."""
    return cls.tree_options is not TreeEntries.tree_options or cls.op_options is not SpecDecodeBaseSampler.op_options


class TreePrepared(NamedTuple):
    """What the tree kernel calls of one shape share (:meth:`TreeEntries._tree_memo`): checked once."""

    config: LaunchConfig | None  # the launch config it was planned under (kernels.backend.planned_for)
    op: Callable[..., TreeOutput]  # the tree kernel's launcher (options not bound)
    options_call: bool  # the options come from an overridden tree_options() / op_options()
    padded: bool  # [B, N+1, V] rows (viewed as [B*(N+1), V]); else ragged
    parents: torch.Tensor  # the parents tensor (a parents list's is reused; a tensor's is each call's)
    batch_size: int  # B
    num_nodes: int  # N (ragged: max_nodes)
    max_depth: int  # D
    policy: str
    vocab_size: int  # V
    draft_nodes: int  # the draft nodes counted (B*N padded, T ragged)
    meta: bool  # meta tensors, planned for a device (nothing is counted)
    random: bool  # the rule draws random numbers (tree_random)


#: (parents, device) -> the parents' device tensor, for lists given on every call (no copy per call)
_PARENTS: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def _parents_tensor(parents: Sequence[int], device: torch.device) -> torch.Tensor:
    """A list of parents as an int64 tensor on ``device``, kept per device (a GPU copy per call
    would be a transfer per call); CPU and meta tensors are made each time (no transfer)."""
    if device.type in ("cpu", "meta"):
        return as_parents(parents, device)
    key = (tuple(parents), device)
    t = _PARENTS.get(key)
    if t is None:
        if len(_PARENTS) >= 64:
            _PARENTS.clear()
        t = _PARENTS[key] = as_parents(parents, device)
    return t
