"""Launcher of the GBV kernels (:mod:`spec_samplers.kernels.multipath_kernels`): the pick, the
order's CDF of the visited rows (the reference's function), the verification, then the final
draw through the reference's own tail (:func:`spec_samplers.tree.multipath.finish_multipath`).

This module does not import triton (the launcher imports its kernels when it runs), so the
sampler can name it and ``import spec_samplers`` needs only torch."""

from __future__ import annotations

import torch

from spec_samplers.constants import input_error
from spec_samplers.kernels.backend import LaunchConfig, launches_to_run
from spec_samplers.kernels.launch_common import KernelLaunch, vocab_contiguous
from spec_samplers.layout import TreeBatch, as_probabilities
from spec_samplers.output import TreeOutput, seeds_of
from spec_samplers.tree.multipath import finish_multipath, multipath_tree_reference, visited_cdf

#: vocabulary block of the per-request passes
MULTIPATH_BLOCK_V = 256
#: a + r F and rho q - p~ round like the reference's separate multiply and add
NO_FMA = {"enable_fp_fusion": False}


def _flat(x: torch.Tensor, V: int, device: torch.device) -> torch.Tensor:
    """[R, V] rows with vocab stride 1; one zero row when there are none (a valid pointer)."""
    return vocab_contiguous(x) if x.shape[0] else torch.zeros(1, V, dtype=torch.float32, device=device)


def plan_pick(tb: TreeBatch, num_paths: int, nodes: torch.Tensor, length: torch.Tensor, path: torch.Tensor):
    """The pick's launch (``multipath_pick_kernel``, grid (B,)) writing ``nodes`` [B, L+1],
    ``length`` and ``path`` [B]."""
    from spec_samplers.kernels.multipath_kernels import multipath_pick_kernel

    B, N, V = tb.batch_size, tb.num_nodes, tb.vocab_size
    assert tb.draft is not None
    target, draft = _flat(tb.target, V, nodes.device), _flat(tb.draft, V, nodes.device)
    args = dict(
        target_ptr=target, stride_t=target.stride(0), draft_ptr=draft, stride_d=draft.stride(0),
        rows_ptr=tb.target_rows.contiguous(), drows_ptr=tb.draft_rows.contiguous(),
        tokens_ptr=tb.tokens.contiguous(), depth_ptr=tb.depth.contiguous(),
        nodes_ptr=nodes, len_ptr=length, path_ptr=path,
        K=num_paths, L=N // num_paths, V=V, BLOCK_K=max(2, triton_next_pow2(num_paths)),
    )  # fmt: skip
    return KernelLaunch(multipath_pick_kernel, (B,), args, num_warps=1, name="multipath_pick")


def plan_verify(tb: TreeBatch, num_paths: int, picked: tuple[torch.Tensor, ...], cdf: tuple[torch.Tensor, ...], out):
    """The verification's launch (``multipath_verify_kernel``, grid (B,)): ``picked`` = (nodes,
    length, path) from the pick, ``cdf`` = (F(x), F(x-)) [B, L, V] fp32, ``out`` = (state,
    residual, stop, q_ok, q_argmax)."""
    from spec_samplers.kernels.multipath_kernels import multipath_verify_kernel

    B, N, V = tb.batch_size, tb.num_nodes, tb.vocab_size
    assert tb.draft is not None
    device = tb.target.device
    target, draft = _flat(tb.target, V, device), _flat(tb.draft, V, device)
    seeds, offsets = seeds_of(tb)
    nodes, length, path = picked
    state, residual, stop, q_ok, q_argmax = out
    args = dict(
        target_ptr=target, stride_t=target.stride(0), draft_ptr=draft, stride_d=draft.stride(0),
        rows_ptr=tb.target_rows.contiguous(), drows_ptr=tb.draft_rows.contiguous(), tokens_ptr=tb.tokens.contiguous(),
        nodes_ptr=nodes, len_ptr=length, path_ptr=path, feq_ptr=cdf[0], flt_ptr=cdf[1],
        seed_ptr=seeds.contiguous(), offset_ptr=offsets.contiguous(), state_ptr=state,
        resid_ptr=residual, stop_ptr=stop, qok_ptr=q_ok, amax_ptr=q_argmax,
        K=num_paths, L=N // num_paths, V=V, BLOCK_V=MULTIPATH_BLOCK_V,
    )  # fmt: skip
    return KernelLaunch(multipath_verify_kernel, (B,), args, name="multipath_verify", options=NO_FMA)


def triton_next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def multipath_tree_triton(tb: TreeBatch, num_paths: int, *, config: LaunchConfig | None = None) -> TreeOutput:
    """:func:`spec_samplers.tree.multipath.multipath_tree_reference` on the Triton kernels: the
    same tokens on the same inputs and seeds. With ``config.launches`` a list, the two launches
    are recorded there, not run (the output is then not meaningful)."""
    tb = as_probabilities(tb)
    if tb.draft is None:
        raise input_error("draft_probs", "the draft rows the K paths were sampled from", None)
    if num_paths == 0 or tb.batch_size == 0:  # no request has a path: one token from each root row
        return multipath_tree_reference(tb, num_paths)
    B, N, V = tb.batch_size, tb.num_nodes, tb.vocab_size
    L = N // num_paths
    device = tb.target.device
    planning = config is not None and config.launches is not None
    # nodes [B, L+1], length [B] and path [B] in one buffer
    picked = torch.empty(B * (L + 3), dtype=torch.int64, device=device)
    if planning:  # the launches are recorded, not run: the steps between them index with zeros
        picked.zero_()
    nodes, length, path = picked[: B * (L + 1)].view(B, L + 1), picked[B * (L + 1) : B * (L + 2)], picked[B * (L + 2) :]
    for launch in launches_to_run(config, [plan_pick(tb, num_paths, nodes, length, path)]):
        launch.kernel[launch.grid](**launch.args, num_warps=launch.num_warps, **launch.options)
    f_eq, f_lt = visited_cdf(tb, nodes[:, :L])
    state = torch.empty(B, L + 1, 4, dtype=torch.float32, device=device)
    residual = torch.empty(B, V, dtype=torch.float32, device=device)
    stop, q_argmax = torch.empty(B, dtype=torch.int64, device=device), torch.empty(B, dtype=torch.int64, device=device)
    q_ok = torch.empty(B, dtype=torch.int8, device=device)
    if planning:
        stop.fill_(-1)
    out = (state, residual, stop, q_ok, q_argmax)
    verify = plan_verify(tb, num_paths, (nodes, length, path), (f_eq, f_lt), out)
    for launch in launches_to_run(config, [verify]):
        launch.kernel[launch.grid](**launch.args, num_warps=launch.num_warps, **launch.options)
    return finish_multipath(tb, stop, residual, q_ok.bool(), q_argmax)
