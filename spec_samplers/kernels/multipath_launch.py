"""Launcher of the GBV kernels (:mod:`spec_samplers.kernels.multipath_kernels`): the pick (with
each request's shape and the keys of the rows it visits), a sort of those key rows (the order),
then the verification, which sums the order's CDF, draws the final token and writes the output
and the counters. Three operations per call; the inputs are read as given
(:class:`~spec_samplers.layout.TreeCall`).

This module does not import triton (the launcher imports its kernels when it runs), so the
sampler can name it and ``import spec_samplers`` needs only torch."""

from __future__ import annotations

import torch

from spec_samplers.constants import input_error
from spec_samplers.kernels.backend import KernelLaunch, LaunchConfig, interpreting, launches_to_run, triton_next_pow2
from spec_samplers.kernels.tree_launch import _filter_cuts, _layout_args, _rows, _unit_stride
from spec_samplers.layout import TreeCall
from spec_samplers.output import TreeOutput

#: vocabulary block of the per-request passes: one race group (the final draw races group by group)
MULTIPATH_BLOCK_V = 256
#: output slots per vector step of the output's tail
MULTIPATH_BLOCK_D = 16
#: a + r F and rho q - p~ round like the reference's separate multiply and add
NO_FMA = {"enable_fp_fusion": False}


def plan_multipath(
    call: TreeCall,
) -> tuple[list[KernelLaunch], KernelLaunch, KernelLaunch, torch.Tensor, TreeOutput]:
    """(the filter cuts' launch when the requests filter (else []), the pick's launch, the
    verification's launch, the keys [B, max(LMAX, 1), V] fp32 the pick writes, the output the
    verification writes), LMAX = min(N, D): the longest path a request may have. The
    verification's ``order_ptr`` is the keys' sort, set by the caller."""
    from spec_samplers.kernels.multipath_kernels import multipath_pick_kernel, multipath_verify_kernel

    B, N, V, D = call.batch_size, call.num_nodes, call.target.shape[1], call.max_depth
    device = call.target.device
    LMAX = min(N, D)
    layout = _layout_args(call)
    draft = _rows(call.draft, V, device)
    cuts, cut_args = _filter_cuts(call, layout, draft)
    temp = _unit_stride(call.temperature)
    picked = torch.empty(B, LMAX + 6, dtype=torch.int64, device=device)
    keys = torch.empty(B, max(LMAX, 1), V, dtype=torch.float32, device=device)
    common = dict(
        target_ptr=layout["target_ptr"], stride_t=layout["stride_t"], draft_ptr=draft, stride_d=draft.stride(0),
        tokens_ptr=layout["tokens_ptr"], stride_tb=layout["stride_tb"], cu_ptr=layout["cu_ptr"],
        num_tokens=layout["num_tokens"], temp_ptr=temp, **cut_args, pick_ptr=picked, N=N, LMAX=LMAX, V=V,
        BLOCK_N=max(2, triton_next_pow2(N)), BLOCK_V=MULTIPATH_BLOCK_V, PRECISE=not interpreting(),
    )  # fmt: skip
    pick = dict(common, parents_ptr=layout["parents_ptr"], stride_pb=layout["stride_pb"], keys_ptr=keys)
    token_ids, node_ids = layout["out_ptr"], layout["nodes_ptr"]
    assert isinstance(token_ids, torch.Tensor) and isinstance(node_ids, torch.Tensor)
    verify = dict(
        common,
        greedy_ptr=_unit_stride(call.is_greedy), seed_ptr=_unit_stride(call.seeds),
        offset_ptr=_unit_stride(call.offsets), order_ptr=None,
        feq_ptr=torch.empty(keys.shape, dtype=torch.float32, device=device),
        flt_ptr=torch.empty(keys.shape, dtype=torch.float32, device=device),
        state_ptr=torch.empty(B, LMAX + 1, 4, dtype=torch.float32, device=device),
        resid_ptr=torch.empty(B, V, dtype=torch.float32, device=device),
        out_ptr=token_ids, nodes_ptr=node_ids, counts_ptr=call.counts, max_depth=D, BLOCK_D=MULTIPATH_BLOCK_D,
    )  # fmt: skip
    return (
        cuts,
        KernelLaunch(multipath_pick_kernel, (B,), pick, num_warps=1, name="multipath_pick"),
        KernelLaunch(multipath_verify_kernel, (B,), verify, name="multipath_verify", options=NO_FMA),
        keys,
        TreeOutput(token_ids, node_ids),
    )


def multipath_tree_triton(
    call: TreeCall, num_paths: int | None = None, *, config: LaunchConfig | None = None
) -> TreeOutput:
    """:func:`spec_samplers.tree.multipath.multipath_tree_reference` on the Triton kernels: the
    same tokens on the same inputs and seeds. ``num_paths`` (the sampler's option, from the host
    check of a parents list) is not needed: the pick reads each request's K and L from its
    parents, so a parents tensor is never read on the host (a request of another shape than K
    paths of L <= D emits nothing). With ``config.launches`` a list, the launches are recorded
    there, not run (the output is then not meaningful)."""
    from spec_samplers.kernels.multipath_kernels import multipath_pick_kernel, multipath_verify_kernel
    from spec_samplers.kernels.tree_kernels import tree_filter_cut_kernel

    if call.draft is None:
        raise input_error("draft_probs", "the draft rows the K paths were sampled from", None)
    assert call.seeds is not None, "GBV needs per-request seeds"
    cuts, pick, verify, keys, out = plan_multipath(call)
    B = call.batch_size
    if B == 0:
        return out
    if launches_to_run(config, cuts + [pick]):
        for cut in cuts:
            tree_filter_cut_kernel[cut.grid](**cut.args, num_warps=cut.num_warps)
        multipath_pick_kernel[(B,)](**pick.args, num_warps=pick.num_warps)
    # the order of each verified position's tokens (best first, ties by id): the one step the
    # kernels leave to PyTorch (the verification sums the CDF in this order)
    verify.args["order_ptr"] = torch.sort(keys, dim=-1, descending=True, stable=True).indices
    if launches_to_run(config, [verify]):
        multipath_verify_kernel[(B,)](**verify.args, num_warps=verify.num_warps, **verify.options)
    return out
