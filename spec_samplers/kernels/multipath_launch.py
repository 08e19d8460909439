"""Launcher of the GBV kernels (:mod:`spec_samplers.kernels.multipath_kernels`): the pick (with
each request's shape, the keys of the rows it visits, and with the request filters the (kept
sum, cut) of the rows the kernels read), a sort of those key rows (the order), then the
verification, which sums the order's CDF, draws the final token and writes the output and the
counters. Three operations per call, with or without filters; the inputs are read as given
(:class:`~spec_samplers.layout.TreeCall`).

This module does not import triton (the launcher imports its kernels when it runs), so the
sampler can name it and ``import spec_samplers`` needs only torch."""

from __future__ import annotations

import torch

from spec_samplers.constants import input_error
from spec_samplers.kernels.backend import KernelLaunch, LaunchConfig, interpreting, recorded, triton_next_pow2
from spec_samplers.kernels.tree_launch import _cut_sizes, _layout_args, _rows, _unit_stride
from spec_samplers.layout import TreeCall
from spec_samplers.output import TreeOutput

#: vocabulary block of the per-request passes: one race group (the final draw races group by group)
MULTIPATH_BLOCK_V = 256
#: output slots per vector step of the output's tail
MULTIPATH_BLOCK_D = 16
#: a + r F and rho q - p~ round like the reference's separate multiply and add
NO_FMA = {"enable_fp_fusion": False}


def _pick_filters(call: TreeCall, device: torch.device) -> tuple[dict[str, object], int]:
    """(the pick's filter arguments, its warps): with the request filters, the filters, each
    target and draft row's (kept sum, cut) [R, 2] fp32 (which the pick writes and both kernels
    read), one search scratch per request, and the searches' warps
    (:data:`~spec_samplers.kernels.sampling_kernels.SEARCH_WARPS`); without, Nones and one warp."""
    if not call.filters:
        none: dict[str, object] = dict(greedy_ptr=None, top_k_ptr=None, top_p_ptr=None, min_p_ptr=None)
        return dict(none, cut_ptr=None, d_cut_ptr=None, scratch_ptr=None, cap=0, CUT_BLOCK_V=16), 1
    from spec_samplers.kernels.sampling_kernels import SEARCH_WARPS

    B, V = call.batch_size, call.target.shape[1]
    cap, block = _cut_sizes(B, V)
    R = max(call.target.shape[0], 1)
    args: dict[str, object] = dict(
        greedy_ptr=_unit_stride(call.is_greedy), top_k_ptr=_unit_stride(call.filters["top_k"]),
        top_p_ptr=_unit_stride(call.filters["top_p"]), min_p_ptr=_unit_stride(call.filters["min_p"]),
        cut_ptr=torch.empty(R, 2, dtype=torch.float32, device=device),
        d_cut_ptr=torch.empty(R, 2, dtype=torch.float32, device=device),
        scratch_ptr=torch.empty(B, cap, dtype=torch.float32, device=device), cap=cap, CUT_BLOCK_V=block,
    )  # fmt: skip
    return args, SEARCH_WARPS


def plan_multipath(call: TreeCall) -> tuple[KernelLaunch, KernelLaunch, torch.Tensor, TreeOutput]:
    """(the pick's launch, the verification's launch, the keys [B, max(LMAX, 1), V] fp32 the pick
    writes, the output the verification writes), LMAX = min(N, D): the longest path a request
    may have. The verification's ``order_ptr`` is the keys' sort, set by the caller."""
    from spec_samplers.kernels.multipath_kernels import multipath_pick_kernel, multipath_verify_kernel

    B, N, V, D = call.batch_size, call.num_nodes, call.target.shape[1], call.max_depth
    device = call.target.device
    LMAX = min(N, D)
    layout = _layout_args(call)
    draft = _rows(call.draft, V, device)
    filters, pick_warps = _pick_filters(call, device)
    temp = _unit_stride(call.temperature)
    picked = torch.empty(B, LMAX + 6, dtype=torch.int64, device=device)
    keys = torch.empty(B, max(LMAX, 1), V, dtype=torch.float32, device=device)
    common = dict(
        target_ptr=layout["target_ptr"], stride_t=layout["stride_t"], draft_ptr=draft, stride_d=draft.stride(0),
        tokens_ptr=layout["tokens_ptr"], stride_tb=layout["stride_tb"], cu_ptr=layout["cu_ptr"],
        num_tokens=layout["num_tokens"], temp_ptr=temp, cut_ptr=filters["cut_ptr"],
        d_cut_ptr=filters["d_cut_ptr"], pick_ptr=picked, N=N, LMAX=LMAX, V=V,
        BLOCK_N=max(2, triton_next_pow2(N)), BLOCK_V=MULTIPATH_BLOCK_V, PRECISE=not interpreting(),
    )  # fmt: skip
    pick = dict(common, **filters, parents_ptr=layout["parents_ptr"], stride_pb=layout["stride_pb"], keys_ptr=keys)
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
        KernelLaunch(multipath_pick_kernel, (B,), pick, num_warps=pick_warps, name="multipath_pick"),
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

    if call.draft is None:
        raise input_error("draft_probs", "the draft rows the K paths were sampled from", None)
    assert call.seeds is not None, "GBV needs per-request seeds"
    pick, verify, keys, out = plan_multipath(call)
    if call.batch_size == 0:
        return out
    if not recorded(config, pick):
        multipath_pick_kernel[pick.grid](**pick.args, num_warps=pick.num_warps)
    # the order of each verified position's tokens (best first, ties by id): the one step the
    # kernels leave to PyTorch (the verification sums the CDF in this order)
    verify.args["order_ptr"] = torch.sort(keys, dim=-1, descending=True, stable=True).indices
    if not recorded(config, verify):
        multipath_verify_kernel[verify.grid](**verify.args, num_warps=verify.num_warps, **verify.options)
    return out
