"""Launcher of the tree kernel (:mod:`spec_samplers.kernels.tree_kernels`): shapes, strides,
scratch, then the final draw and output through :func:`spec_samplers.tree.output.finish_walk`
(the same code the reference finishes with)."""

from __future__ import annotations

import torch

from spec_samplers.constants import fp32_value
from spec_samplers.kernels import launch_common as lc
from spec_samplers.tree.layout import TreeBatch, as_probabilities
from spec_samplers.tree.output import TreeOutput, finish_walk, path_to, seeds_of, tree_output

#: vocabulary block of the per-request loops
TREE_BLOCK_V = 256


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[R, V] with vocab stride 1 (a strided or expanded view is copied; the row stride is kept)."""
    return x if x.stride(-1) == 1 or x.shape[0] == 0 else x.contiguous()


def rejection_tree_triton(tb: TreeBatch) -> TreeOutput:
    """:func:`spec_samplers.tree.reference.rejection_tree_reference` on the Triton kernel: same
    tokens on the same inputs and seeds."""
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
    if B:
        rejection_tree_kernel[(B,)](
            target, target.stride(0),
            draft, 0 if draft is None else draft.stride(0),
            tb.target_rows.contiguous(), tb.draft_rows.contiguous(),
            tb.tokens.contiguous(), tb.parents.contiguous(), tb.depth.contiguous(),
            seeds.contiguous(), offsets.contiguous(),
            None if tb.is_greedy is None else tb.is_greedy.contiguous(),
            scratch, residual, stop, q_ok, q_argmax,
            None if tb.temperature is None else tb.temperature.to(torch.float32).contiguous(),
            N, V, tb.max_depth,
            POLICY=policy, BLOCK_V=TREE_BLOCK_V, PRECISE=lc.precise_math(),
        )  # fmt: skip
    return finish_walk(tb, stop, residual, q_ok.bool(), q_argmax)


def typical_tree_triton(tb: TreeBatch, posterior_threshold: float, posterior_alpha: float) -> TreeOutput:
    """:func:`spec_samplers.tree.reference.typical_tree_reference` on the Triton kernel."""
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
    if B:
        typical_tree_kernel[(B,)](
            target, target.stride(0), tb.target_rows.contiguous(), tb.tokens.contiguous(),
            tb.parents.contiguous(), tb.depth.contiguous(), thr, amax, row_ok, passes, stop, final,
            (fp32_value(posterior_threshold), fp32_value(posterior_alpha)), N, V, tb.max_depth,
            BLOCK_V=TREE_BLOCK_V, PRECISE=lc.precise_math(),
        )  # fmt: skip
    return tree_output(tb.tokens, path_to(stop, tb.parents, tb.depth, tb.max_depth), final, stop >= 0)
