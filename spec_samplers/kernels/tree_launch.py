"""Launchers of the tree kernels (:mod:`spec_samplers.kernels.tree_kernels`): shapes, strides,
scratch, the outputs, one launch by keyword. The kernel reads the call's inputs as given
(:class:`~spec_samplers.layout.TreeCall`) and writes the whole output, the final draw and
the counters included, so a tree entry on this path is one launch and no PyTorch op.

This module does not import triton: each launcher imports its kernel, so a sampler can name the
launcher (``tree_kernel = staticmethod(rejection_tree_triton)``) and ``import spec_samplers``
needs only torch."""

from __future__ import annotations

import torch

from spec_samplers.constants import fp32_value
from spec_samplers.kernels.backend import KernelLaunch, LaunchConfig, interpreting, launches_to_run
from spec_samplers.layout import TreeCall
from spec_samplers.output import TreeOutput

#: vocabulary block of the per-request loops: one race group (the final draw races group by group)
TREE_BLOCK_V = 256
#: output slots per vector step of the output's tail
TREE_BLOCK_D = 16


def _rows(x: torch.Tensor | None, V: int, device: torch.device) -> torch.Tensor:
    """[R, V] with vocab stride 1 (a strided or expanded view is copied; the row stride is kept);
    an empty one becomes one zero row (never read: a pointer for the kernel)."""
    if x is None or x.shape[0] == 0:
        return torch.zeros(1, V, dtype=torch.float32, device=device)
    return x if x.stride(-1) == 1 else x.contiguous()


def _nodes(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(node tensor with node stride 1, its request stride: 0 for one row shared by the batch)."""
    x = x if x.dim() == 0 or x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()
    return x, x.stride(0) if x.dim() == 2 and x.shape[0] > 1 else 0


def _per_request(x: torch.Tensor | None) -> torch.Tensor | None:
    """A [B] tensor with stride 1: the kernels read element b at ``ptr + b``, so a strided view
    would read its neighbours' values and an expanded one (stride 0) past its storage."""
    return x if x is None or x.shape[0] <= 1 or x.stride(0) == 1 else x.contiguous()


def _outputs(call: TreeCall) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_ids [B, D+1], node_ids [B, D]) int64, written by the kernel (node_ids a view of at
    least one column, so that the kernel never gets an empty tensor's pointer)."""
    B, D = call.batch_size, call.max_depth
    device = call.target.device
    nodes = torch.empty(B, max(D, 1), dtype=torch.int64, device=device)
    return torch.empty(B, D + 1, dtype=torch.int64, device=device), nodes[:, :D]


def _layout_args(call: TreeCall) -> dict[str, object]:
    """The kernels' layout arguments: rows, tokens, parents, ragged spans."""
    device = call.target.device
    target = _rows(call.target, call.vocab_size, device)
    tokens, stride_tb = _nodes(call.tokens)
    parents, stride_pb = _nodes(call.parents)
    cu = _per_request(call.cu_num_nodes)
    return dict(
        target_ptr=target, stride_t=target.stride(0), tokens_ptr=tokens, stride_tb=stride_tb,
        parents_ptr=parents, stride_pb=stride_pb, cu_ptr=cu,
        num_tokens=call.tokens.shape[0] if cu is not None else 0,
    )  # fmt: skip


def _walk_args(call: TreeCall, device: torch.device) -> dict[str, object]:
    """The arguments the two walk kernels (rejection, block) share: the layout, the draft rows
    and their policy, the per-request seeds, offsets, greedy mask and temperature."""
    from spec_samplers.kernels.tree_kernels import INDEPENDENT, POINT_MASS, WITHOUT_REPLACEMENT

    point_mass = call.draft is None or call.policy == "deterministic"
    draft = None if point_mass else _rows(call.draft, call.vocab_size, device)
    policy = POINT_MASS if point_mass else WITHOUT_REPLACEMENT if call.policy == "without_replacement" else INDEPENDENT
    return dict(
        _layout_args(call),
        draft_ptr=draft, stride_d=0 if draft is None else draft.stride(0),
        seed_ptr=_per_request(call.seeds), offset_ptr=_per_request(call.offsets),
        greedy_ptr=_per_request(call.is_greedy), temp_ptr=_per_request(call.temperature),
        POLICY=policy,
    )  # fmt: skip


def rejection_tree_triton(call: TreeCall, *, config: LaunchConfig | None = None) -> TreeOutput:
    """:func:`spec_samplers.tree.reference.rejection_tree_reference` on the Triton kernel: same
    tokens on the same inputs and seeds. With ``config.launches`` a list, the launch is recorded
    there, not run (the output is then not meaningful)."""
    from spec_samplers.kernels.tree_kernels import rejection_tree_kernel

    B, N, V = call.batch_size, call.num_nodes, call.vocab_size
    device = call.target.device
    assert call.seeds is not None, "tree rejection sampling needs per-request seeds"
    token_ids, node_ids = _outputs(call)
    args = dict(
        _walk_args(call, device),
        scratch_ptr=torch.empty(B, 2, V, dtype=torch.float32, device=device),
        out_ptr=token_ids, nodes_ptr=node_ids, counts_ptr=call.counts,
        N=N, V=V, max_depth=call.max_depth,
        BLOCK_V=TREE_BLOCK_V, BLOCK_D=TREE_BLOCK_D, PRECISE=not interpreting(),
    )  # fmt: skip
    if B and launches_to_run(config, [KernelLaunch(rejection_tree_kernel, (B,), args, name="rejection_tree")]):
        rejection_tree_kernel[(B,)](**args)
    return TreeOutput(token_ids, node_ids)


def typical_tree_triton(
    call: TreeCall, posterior_threshold: float, posterior_alpha: float, *, config: LaunchConfig | None = None
) -> TreeOutput:
    """:func:`spec_samplers.tree.reference.typical_tree_reference` on the Triton kernel
    (``config`` as :func:`rejection_tree_triton`); logits rows are read through the softmax rule."""
    from spec_samplers.kernels.tree_kernels import typical_tree_kernel

    B, N = call.batch_size, call.num_nodes
    device = call.target.device
    logits = call.temperature is not None
    token_ids, node_ids = _outputs(call)
    args = dict(
        _layout_args(call),
        temp_ptr=_per_request(call.temperature),
        stat_ptr=torch.empty(B, N + 1, 4, dtype=torch.float32, device=device) if logits else None,
        lidx_ptr=torch.empty(B, N + 1, dtype=torch.int64, device=device) if logits else None,
        thr_ptr=torch.empty(B, N + 1, dtype=torch.float64, device=device),
        amax_ptr=torch.empty(B, N + 1, dtype=torch.int64, device=device),
        rowok_ptr=torch.empty(B, N + 1, dtype=torch.int8, device=device),
        pdepth_ptr=torch.empty(B, N + 1, dtype=torch.int64, device=device),
        out_ptr=token_ids, nodes_ptr=node_ids, counts_ptr=call.counts,
        # fp32 values: a Triton float argument is fp32, and the reference rounds alike
        posterior_threshold=fp32_value(posterior_threshold), posterior_alpha=fp32_value(posterior_alpha),
        N=N, V=call.vocab_size, max_depth=call.max_depth,
        BLOCK_V=TREE_BLOCK_V, BLOCK_D=TREE_BLOCK_D, PRECISE=not interpreting(),
    )  # fmt: skip
    if B and launches_to_run(config, [KernelLaunch(typical_tree_kernel, (B,), args, name="typical_tree")]):
        typical_tree_kernel[(B,)](**args)
    return TreeOutput(token_ids, node_ids)


def block_tree_triton(call: TreeCall, *, config: LaunchConfig | None = None) -> TreeOutput:
    """:func:`spec_samplers.tree.traversal.traversal_tree_reference` (Traversal Verification) on
    the Triton kernel: same tokens on the same inputs and seeds (``config`` as
    :func:`rejection_tree_triton`). The kernel initialises its node workspaces itself; it is
    compiled without FP fusion, as the chain's block kernels."""
    from spec_samplers.kernels.tree_kernels import (
        NODE_F,
        NODE_I,
        block_tree_kernel,
    )

    B, N, V = call.batch_size, call.num_nodes, call.vocab_size
    device = call.target.device
    assert call.seeds is not None, "tree block verification needs per-request seeds"
    token_ids, node_ids = _outputs(call)
    args = dict(
        _walk_args(call, device),
        # Q rows live only on the walk's current path: one per depth that can be updated, and a spare
        q_ptr=torch.empty(B, min(call.max_depth, N) + 1, V, dtype=torch.float32, device=device),
        nf_ptr=torch.empty(B, N + 1, NODE_F, dtype=torch.float32, device=device),
        ni_ptr=torch.empty(B, N + 1, NODE_I, dtype=torch.int64, device=device),
        out_ptr=token_ids, nodes_ptr=node_ids, counts_ptr=call.counts,
        N=N, V=V, max_depth=call.max_depth,
        BLOCK_V=TREE_BLOCK_V, BLOCK_D=TREE_BLOCK_D, PRECISE=not interpreting(),
    )  # fmt: skip
    options = dict(enable_fp_fusion=False)  # alpha Q - p rounds as the reference's multiply, then subtract
    launch = KernelLaunch(block_tree_kernel, (B,), args, name="block_tree", options=options)
    if B and launches_to_run(config, [launch]):
        block_tree_kernel[(B,)](**args, **options)
    return TreeOutput(token_ids, node_ids)
