"""Launchers of the tree kernels (:mod:`spec_samplers.kernels.tree_kernels`): shapes, strides,
scratch, the outputs, one launch by keyword. The kernel reads the call's inputs as given
(:class:`~spec_samplers.layout.TreeCall`) and writes the whole output, the final draw and
the counters included, so a tree entry on this path is one launch and no PyTorch op.

This module does not import triton: each launcher imports its kernel, so a sampler can name the
launcher (``tree_kernel = staticmethod(rejection_tree_triton)``) and ``import spec_samplers``
needs only torch."""

from __future__ import annotations

import functools

import torch

from spec_samplers.constants import fp32_value
from spec_samplers.kernels.backend import KernelLaunch, LaunchConfig, interpreting, recorded
from spec_samplers.layout import TreeCall
from spec_samplers.output import TreeOutput

#: vocabulary block of the per-request loops: one race group (the final draw races group by group)
TREE_BLOCK_V = 256
#: output slots per vector step of the output's tail
TREE_BLOCK_D = 16
#: :func:`~spec_samplers.constants.fp32_value`, remembered: a sampler's options repeat every call
_fp32 = functools.lru_cache(maxsize=64)(fp32_value)


def _rows(x: torch.Tensor | None, V: int, device: torch.device) -> torch.Tensor:
    """[R, V] with vocab stride 1 (a strided or expanded view is copied; the row stride is kept);
    an empty one becomes one zero row (never read: a pointer for the kernel)."""
    if x is None or x.shape[0] == 0:
        return torch.zeros(1, V, dtype=torch.float32, device=device)
    return x if x.stride(-1) == 1 else x.contiguous()


def _unit_stride(x: torch.Tensor | None) -> torch.Tensor | None:
    """``x`` with stride 1 along its last dimension (a [B] tensor per request, [B, N] or [N] nodes):
    the kernels read element i at ``ptr + i``, so a strided view would read its neighbours' values
    and an expanded one (stride 0) past its storage."""
    return x if x is None or x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()


def _layout_args(call: TreeCall) -> dict[str, object]:
    """The kernels' layout arguments (rows, tokens, parents, ragged spans) and their outputs:
    token_ids [B, D+1] (``out_ptr``) and node_ids [B, D] (``nodes_ptr``, a view of at least one
    column, so that the kernel never gets an empty tensor's pointer) int64, written by the kernel."""
    device = call.target.device
    B, D = call.batch_size, call.max_depth
    nodes = torch.empty(B, max(D, 1), dtype=torch.int64, device=device)
    target = _rows(call.target, call.target.shape[1], device)
    tokens, parents = _unit_stride(call.tokens), _unit_stride(call.parents)
    assert tokens is not None and parents is not None
    cu = _unit_stride(call.cu_num_nodes)
    # (request strides: 0 for one parents row shared by the batch)
    stride_tb = tokens.stride(0) if tokens.dim() == 2 and tokens.shape[0] > 1 else 0
    stride_pb = parents.stride(0) if parents.dim() == 2 and parents.shape[0] > 1 else 0
    return dict(
        target_ptr=target, stride_t=target.stride(0), tokens_ptr=tokens, stride_tb=stride_tb,
        parents_ptr=parents, stride_pb=stride_pb, cu_ptr=cu,
        num_tokens=call.tokens.shape[0] if cu is not None else 0,
        out_ptr=torch.empty(B, D + 1, dtype=torch.int64, device=device), nodes_ptr=nodes[:, :D],
    )  # fmt: skip


def _walk_args(call: TreeCall, device: torch.device) -> dict[str, object]:
    """The arguments the two walk kernels (rejection, block) share: the layout, the draft rows
    and their policy, the per-request seeds, offsets, greedy mask and temperature."""
    from spec_samplers.kernels.tree_kernels import INDEPENDENT, POINT_MASS, WITHOUT_REPLACEMENT

    point_mass = call.draft is None or call.policy == "deterministic"
    draft = None if point_mass else _rows(call.draft, call.target.shape[1], device)
    policy = POINT_MASS if point_mass else WITHOUT_REPLACEMENT if call.policy == "without_replacement" else INDEPENDENT
    return dict(
        _layout_args(call),
        draft_ptr=draft, stride_d=0 if draft is None else draft.stride(0),
        seed_ptr=_unit_stride(call.seeds), offset_ptr=_unit_stride(call.offsets),
        greedy_ptr=_unit_stride(call.is_greedy), temp_ptr=_unit_stride(call.temperature),
        POLICY=policy,
    )  # fmt: skip


def _filter_cuts(
    call: TreeCall, layout: dict[str, object], draft: torch.Tensor | None
) -> tuple[KernelLaunch | None, dict[str, object]]:
    """(the launch of ``tree_filter_cut_kernel`` when the requests filter, else None; the tree
    kernel's ``cut_ptr`` and ``d_cut_ptr``) on the launcher's ``layout`` (:func:`_layout_args`):
    each target row's and each ``draft`` row's (kept sum, cut), which the tree kernels read with
    the logits (the chain's filter cuts on the tree layout,
    :func:`spec_samplers.kernels.verify_launch.plan_filter_cuts`)."""
    if not call.filters:
        return None, dict(cut_ptr=None, d_cut_ptr=None)
    from spec_samplers.kernels.sampling_kernels import SEARCH_WARPS
    from spec_samplers.kernels.tree_kernels import tree_filter_cut_kernel

    B, N, V = call.batch_size, call.num_nodes, call.target.shape[1]
    device = call.target.device
    sides = 1 if draft is None else 2
    cap, block = _cut_sizes(sides * B * (N + 1), V)
    R = max(call.target.shape[0], 1)
    cuts: dict[str, object] = dict(cut_ptr=torch.empty(R, 2, dtype=torch.float32, device=device),
                d_cut_ptr=None if draft is None else torch.empty(R, 2, dtype=torch.float32, device=device))  # fmt: skip
    args = dict(
        target_ptr=layout["target_ptr"], stride_t=layout["stride_t"],
        draft_ptr=draft, stride_d=0 if draft is None else draft.stride(0),
        cu_ptr=layout["cu_ptr"], num_tokens=layout["num_tokens"], temp_ptr=_unit_stride(call.temperature),
        top_k_ptr=_unit_stride(call.filters["top_k"]), top_p_ptr=_unit_stride(call.filters["top_p"]),
        min_p_ptr=_unit_stride(call.filters["min_p"]),
        **cuts, scratch_ptr=torch.empty(sides, B, N + 1, cap, dtype=torch.float32, device=device),
        N=N, V=V, cap=cap, BLOCK_V=block, PRECISE=not interpreting(),
    )  # fmt: skip
    return KernelLaunch(tree_filter_cut_kernel, (B, N + 1, sides), args, SEARCH_WARPS, "tree_filter_cut"), cuts


@functools.lru_cache(maxsize=64)
def _cut_sizes(searches: int, vocab_size: int) -> tuple[int, int]:
    """(scratch entries per search, BLOCK_V) of ``tree_filter_cut_kernel``
    (:func:`~spec_samplers.kernels.sampling_kernels.search_scratch`, ``search_block``): planned
    once per shape."""
    from spec_samplers.kernels.sampling_kernels import search_block, search_scratch

    return search_scratch(searches, vocab_size), search_block(vocab_size)


def rejection_tree_triton(call: TreeCall, *, config: LaunchConfig | None = None) -> TreeOutput:
    """:func:`spec_samplers.tree.reference.rejection_tree_reference` on the Triton kernel: same
    tokens on the same inputs and seeds. With ``config.launches`` a list, the launch is recorded
    there, not run (the output is then not meaningful)."""
    from spec_samplers.kernels.tree_kernels import rejection_tree_kernel, tree_filter_cut_kernel

    B, N, V = call.batch_size, call.num_nodes, call.target.shape[1]
    device = call.target.device
    assert call.seeds is not None, "tree rejection sampling needs per-request seeds"
    walk = _walk_args(call, device)
    cuts, cut_args = _filter_cuts(call, walk, walk["draft_ptr"])  # type: ignore[arg-type]
    args = dict(
        walk, **cut_args,
        scratch_ptr=torch.empty(B, 2, V, dtype=torch.float32, device=device),
        counts_ptr=call.counts,
        N=N, V=V, max_depth=call.max_depth,
        BLOCK_V=TREE_BLOCK_V, BLOCK_D=TREE_BLOCK_D, PRECISE=not interpreting(),
    )  # fmt: skip
    tree = KernelLaunch(rejection_tree_kernel, (B,), args, name="rejection_tree")
    if B and cuts is not None and not recorded(config, cuts):
        tree_filter_cut_kernel[cuts.grid](**cuts.args, num_warps=cuts.num_warps)
    if B and not recorded(config, tree):
        rejection_tree_kernel[tree.grid](**tree.args)
    return TreeOutput(args["out_ptr"], args["nodes_ptr"])  # type: ignore[arg-type]


def typical_tree_triton(
    call: TreeCall, posterior_threshold: float, posterior_alpha: float, *, config: LaunchConfig | None = None
) -> TreeOutput:
    """:func:`spec_samplers.tree.reference.typical_tree_reference` on the Triton kernel
    (``config`` as :func:`rejection_tree_triton`); logits rows are read through the softmax rule."""
    from spec_samplers.kernels.tree_kernels import tree_filter_cut_kernel, typical_tree_kernel

    B, N = call.batch_size, call.num_nodes
    device = call.target.device
    logits = call.temperature is not None
    layout = _layout_args(call)
    cuts, cut_args = _filter_cuts(call, layout, None)
    args = dict(
        layout,
        temp_ptr=_unit_stride(call.temperature), cut_ptr=cut_args["cut_ptr"],
        stat_ptr=torch.empty(B, N + 1, 4, dtype=torch.float32, device=device) if logits else None,
        lidx_ptr=torch.empty(B, N + 1, dtype=torch.int64, device=device) if logits else None,
        thr_ptr=torch.empty(B, N + 1, dtype=torch.float64, device=device),
        amax_ptr=torch.empty(B, N + 1, dtype=torch.int64, device=device),
        rowok_ptr=torch.empty(B, N + 1, dtype=torch.int8, device=device),
        pdepth_ptr=torch.empty(B, N + 1, dtype=torch.int64, device=device),
        counts_ptr=call.counts,
        # fp32 values: a Triton float argument is fp32, and the reference rounds alike
        posterior_threshold=_fp32(posterior_threshold), posterior_alpha=_fp32(posterior_alpha),
        N=N, V=call.target.shape[1], max_depth=call.max_depth,
        BLOCK_V=TREE_BLOCK_V, BLOCK_D=TREE_BLOCK_D, PRECISE=not interpreting(),
    )  # fmt: skip
    tree = KernelLaunch(typical_tree_kernel, (B,), args, name="typical_tree")
    if B and cuts is not None and not recorded(config, cuts):
        tree_filter_cut_kernel[cuts.grid](**cuts.args, num_warps=cuts.num_warps)
    if B and not recorded(config, tree):
        typical_tree_kernel[tree.grid](**tree.args)
    return TreeOutput(args["out_ptr"], args["nodes_ptr"])  # type: ignore[arg-type]


def block_tree_triton(call: TreeCall, *, config: LaunchConfig | None = None) -> TreeOutput:
    """:func:`spec_samplers.tree.traversal.traversal_tree_reference` (Traversal Verification) on
    the Triton kernel: same tokens on the same inputs and seeds (``config`` as
    :func:`rejection_tree_triton`). The kernel initialises its node workspaces itself; it is
    compiled without FP fusion, as the chain's block kernels."""
    from spec_samplers.kernels.tree_kernels import (
        NODE_F,
        NODE_I,
        block_tree_kernel,
        tree_filter_cut_kernel,
    )

    B, N, V = call.batch_size, call.num_nodes, call.target.shape[1]
    device = call.target.device
    assert call.seeds is not None, "tree block verification needs per-request seeds"
    walk = _walk_args(call, device)
    cuts, cut_args = _filter_cuts(call, walk, walk["draft_ptr"])  # type: ignore[arg-type]
    args = dict(
        walk, **cut_args,
        # Q rows live only on the walk's current path: one per depth that can be updated, and a spare
        q_ptr=torch.empty(B, min(call.max_depth, N) + 1, V, dtype=torch.float32, device=device),
        nf_ptr=torch.empty(B, N + 1, NODE_F, dtype=torch.float32, device=device),
        ni_ptr=torch.empty(B, N + 1, NODE_I, dtype=torch.int64, device=device),
        counts_ptr=call.counts,
        N=N, V=V, max_depth=call.max_depth,
        BLOCK_V=TREE_BLOCK_V, BLOCK_D=TREE_BLOCK_D, PRECISE=not interpreting(),
    )  # fmt: skip
    options = dict(enable_fp_fusion=False)  # alpha Q - p rounds as the reference's multiply, then subtract
    tree = KernelLaunch(block_tree_kernel, (B,), args, name="block_tree", options=options)
    if B and cuts is not None and not recorded(config, cuts):
        tree_filter_cut_kernel[cuts.grid](**cuts.args, num_warps=cuts.num_warps)
    if B and not recorded(config, tree):
        block_tree_kernel[tree.grid](**tree.args, **tree.options)
    return TreeOutput(args["out_ptr"], args["nodes_ptr"])  # type: ignore[arg-type]
