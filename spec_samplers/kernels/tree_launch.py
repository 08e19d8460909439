"""Launchers of the tree kernels (:mod:`spec_samplers.kernels.tree_kernels`): shapes, strides,
scratch, one launch by keyword, then the final draw and output through
:func:`spec_samplers.output.finish_walk` (the same code the reference finishes with).

This module does not import triton: each launcher imports its kernel, so a sampler can name the
launcher (``tree_kernel = staticmethod(rejection_tree_triton)``) and ``import spec_samplers``
needs only torch."""

from __future__ import annotations

import torch

from spec_samplers.constants import fp32_value
from spec_samplers.kernels.backend import LaunchConfig, interpreting, launches_to_run
from spec_samplers.kernels.launch_common import KernelLaunch
from spec_samplers.layout import TreeBatch, as_probabilities
from spec_samplers.output import TreeOutput, finish_walk, path_to, seeds_of, tree_output

#: vocabulary block of the per-request loops
TREE_BLOCK_V = 256


# PRECISE: libdevice exp/log when compiled; the interpreter has none


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[R, V] with vocab stride 1 (a strided or expanded view is copied; the row stride is kept)."""
    return x if x.stride(-1) == 1 or x.shape[0] == 0 else x.contiguous()


def rejection_tree_triton(tb: TreeBatch, *, config: LaunchConfig | None = None) -> TreeOutput:
    """:func:`spec_samplers.tree.reference.rejection_tree_reference` on the Triton kernel: same
    tokens on the same inputs and seeds. With ``config.launches`` a list, the launch is recorded
    there, not run (the output is then not meaningful)."""
    from spec_samplers.kernels.tree_kernels import INDEPENDENT, POINT_MASS, WITHOUT_REPLACEMENT, rejection_tree_kernel

    B, N, V = tb.batch_size, tb.num_nodes, tb.vocab_size
    device = tb.target.device
    seeds, offsets = seeds_of(tb)
    target = _rows(tb.target)
    if target.shape[0] == 0:
        target = torch.zeros(1, V, dtype=torch.float32, device=device)
    point_mass = tb.draft is None or tb.policy == "deterministic"
    draft = None if point_mass else _rows(tb.draft)  # type: ignore[arg-type]
    if draft is not None and draft.shape[0] == 0:
        draft = torch.zeros(1, V, dtype=torch.float32, device=device)
    policy = POINT_MASS if point_mass else WITHOUT_REPLACEMENT if tb.policy == "without_replacement" else INDEPENDENT
    scratch = torch.empty(B, 2, V, dtype=torch.float32, device=device)
    residual = torch.zeros(B, V, dtype=torch.float32, device=device)
    stop = torch.empty(B, dtype=torch.int64, device=device)
    q_ok = torch.empty(B, dtype=torch.int8, device=device)
    q_argmax = torch.empty(B, dtype=torch.int64, device=device)
    args = dict(
        target_ptr=target, stride_t=target.stride(0),
        draft_ptr=draft, stride_d=0 if draft is None else draft.stride(0),
        rows_ptr=tb.target_rows.contiguous(), drows_ptr=tb.draft_rows.contiguous(),
        tokens_ptr=tb.tokens.contiguous(), parents_ptr=tb.parents.contiguous(), depth_ptr=tb.depth.contiguous(),
        seed_ptr=seeds.contiguous(), offset_ptr=offsets.contiguous(),
        greedy_ptr=None if tb.is_greedy is None else tb.is_greedy.contiguous(),
        scratch_ptr=scratch, resid_ptr=residual, stop_ptr=stop, qok_ptr=q_ok, amax_ptr=q_argmax,
        temp_ptr=None if tb.temperature is None else tb.temperature.to(torch.float32).contiguous(),
        N=N, V=V, max_depth=tb.max_depth,
        POLICY=policy, BLOCK_V=TREE_BLOCK_V, PRECISE=not interpreting(),
    )  # fmt: skip
    planned = [KernelLaunch(rejection_tree_kernel, (B,), args, name="rejection_tree")] if B else []
    for launch in launches_to_run(config, planned):
        launch.kernel[launch.grid](**launch.args)
    return finish_walk(tb, stop, residual, q_ok.bool(), q_argmax)


def typical_tree_triton(
    tb: TreeBatch, posterior_threshold: float, posterior_alpha: float, *, config: LaunchConfig | None = None
) -> TreeOutput:
    """:func:`spec_samplers.tree.reference.typical_tree_reference` on the Triton kernel
    (``config`` as :func:`rejection_tree_triton`)."""
    from spec_samplers.kernels.tree_kernels import typical_tree_kernel

    tb = as_probabilities(tb)  # (no fused softmax in the typical tree kernel)
    B, N, V = tb.batch_size, tb.num_nodes, tb.vocab_size
    device = tb.target.device
    target = _rows(tb.target)
    if target.shape[0] == 0:
        target = torch.zeros(1, V, dtype=torch.float32, device=device)
    thr = torch.empty(B, N + 1, dtype=torch.float64, device=device)
    amax = torch.empty(B, N + 1, dtype=torch.int64, device=device)
    row_ok = torch.empty(B, N + 1, dtype=torch.int8, device=device)
    passes = torch.empty(B, N + 1, dtype=torch.int8, device=device)
    stop = torch.full((B,), -1, dtype=torch.int64, device=device)
    final = torch.full((B,), -1, dtype=torch.int64, device=device)
    args = dict(
        target_ptr=target, stride_t=target.stride(0), rows_ptr=tb.target_rows.contiguous(),
        tokens_ptr=tb.tokens.contiguous(), parents_ptr=tb.parents.contiguous(), depth_ptr=tb.depth.contiguous(),
        thr_ptr=thr, amax_ptr=amax, rowok_ptr=row_ok, pass_ptr=passes, stop_ptr=stop, final_ptr=final,
        # fp32 values: a Triton float argument is fp32, and the reference rounds alike
        posterior_threshold=fp32_value(posterior_threshold), posterior_alpha=fp32_value(posterior_alpha),
        N=N, V=V, max_depth=tb.max_depth, BLOCK_V=TREE_BLOCK_V, PRECISE=not interpreting(),
    )  # fmt: skip
    planned = [KernelLaunch(typical_tree_kernel, (B,), args, name="typical_tree")] if B else []
    for launch in launches_to_run(config, planned):
        launch.kernel[launch.grid](**launch.args)
    return tree_output(tb.tokens, path_to(stop, tb.parents, tb.depth, tb.max_depth), final, stop >= 0)
