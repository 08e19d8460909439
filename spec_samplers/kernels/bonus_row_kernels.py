"""The two small kernels around the verification of an engine batch whose rows include each
request's bonus row (vLLM Model Runner V2's layout): before it, the per-request and per-row
inputs of the bonus-row verification with the seam's metadata checks, gathered in one launch
instead of about thirty eager ops (:func:`spec_samplers.bonus_rows.chunk_inputs`; without the
checks :func:`spec_samplers.bonus_rows.bonus_row_inputs`); after it, the seam's tail in one
launch (:func:`spec_samplers.bonus_rows.chunk_outputs`). The PyTorch twins are in the same module.

Request r's rows are [cu[r], cu[r+1]), the last one its bonus row; its parameters live at its
request state s = state[r] (T and seed per state), its counter offset is the position of its
first row, row i scores the sampled id ``sampled[i + 1]`` (the bonus row scores the -1
placeholder) and, with a drafter cache, reads cache row ``state_of_row * num_steps + step_of_row``
(-1 at the bonus row: no drafter row). Grid (R,); every load is masked to [0, L) and to the
request's rows, so inconsistent counts read nothing outside the tensors.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from spec_samplers.kernels import backend
from spec_samplers.kernels.backend import KernelLaunch, LaunchConfig, recorded, triton_next_pow2

#: (temperature [R] fp32, seeds [R] int64, offsets [R] int64, bonus [R] int64, ids [L], draft rows [L] or None)
Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


# L, num_steps, num_states and max_rows follow the batch: left unspecialised so that a new batch
# reuses the variant.
@triton.jit(do_not_specialize=["L", "num_steps", "num_states", "max_rows"])
def bonus_row_inputs_kernel(
    cu_ptr,  # [R+1] int32/int64: request r's rows are [cu[r], cu[r+1])
    state_ptr,  # [R] int32/int64: request r's state
    temp_ptr,  # [num_states] float: T per state
    seed_ptr,  # [num_states] int64: seed per state
    pos_ptr,  # [L'] int: position of each row (L' >= L)
    sampled_ptr,  # [L'] int32/int64: row i scores sampled[i + 1]
    row_state_ptr,  # [L'] int: state of each row, or None (no drafter cache)
    row_step_ptr,  # [L'] int: step of each row, or None
    temp_out,  # [R] fp32
    seed_out,  # [R] int64
    offset_out,  # [R] int64
    bonus_out,  # [R] int64: -1 (every request's last draft is the rejected placeholder)
    ids_out,  # [L] (dtype of sampled): the draft id each row scores, -1 at bonus rows
    rows_out,  # [L] int64: drafter cache row of each row, -1 at bonus rows; or None
    ok_out,  # [R] bool: the request is well formed (the seam's checks); None: every request taken as one
    sign_out,  # [R] fp32: sign(T), the T of logits vLLM divided already; or None
    L,  # rows of the batch
    num_steps,  # cached steps per state (the cache's S')
    num_states,  # states of temp_ptr / seed_ptr (the checks' bound)
    max_rows,  # rows a request may have (S + 1: the checks' bound)
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    lo = tl.load(cu_ptr + r).to(tl.int64)
    hi = tl.load(cu_ptr + r + 1).to(tl.int64)
    state = tl.load(state_ptr + r).to(tl.int64)
    ok = r >= 0
    if ok_out is not None:
        # v2_runner.chunk_metadata's checks: rows [lo, hi) inside [0, L), at most max_rows of them
        # (its bonus row last), row 0 first, no earlier request reaching past lo, a known state
        ok = (lo >= 0) & (hi > lo) & (hi <= L) & (hi - lo <= max_rows) & ((r > 0) | (lo == 0))
        ok = ok & (state >= 0) & (state < num_states)
        reach = lo
        for s in range(0, r, BLOCK):
            offs = s + tl.arange(0, BLOCK)
            earlier = tl.load(cu_ptr + offs, mask=offs < r, other=0).to(tl.int64)
            reach = tl.maximum(reach, tl.max(tl.where(offs < r, earlier, lo), axis=0))
        ok = ok & (reach == lo)
        tl.store(ok_out + r, ok)
        state = tl.where(ok, state, 0)
        hi = tl.where(ok, hi, lo)  # a malformed request writes no row: every row is one request's
    temp = tl.load(temp_ptr + state, mask=ok, other=0).to(tl.float32)
    tl.store(temp_out + r, temp)
    if sign_out is not None:
        tl.store(sign_out + r, tl.where(temp > 0, 1.0, tl.where(temp < 0, -1.0, 0.0)))  # torch.sign: NaN gives 0
    tl.store(seed_out + r, tl.load(seed_ptr + state, mask=ok, other=0).to(tl.int64))
    tl.store(offset_out + r, tl.load(pos_ptr + lo, mask=(lo >= 0) & (lo < L), other=0).to(tl.int64))
    tl.store(bonus_out + r, tl.full([], -1, tl.int64))
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = (offs < hi) & (offs >= 0) & (offs < L)
        is_bonus = offs == hi - 1
        # a draft row i < hi - 1 <= L - 1 reads sampled[i + 1] inside [0, L)
        draft_row = inside & (offs != hi - 1)
        nxt = tl.load(sampled_ptr + offs + 1, mask=draft_row, other=-1)
        tl.store(ids_out + offs, tl.where(is_bonus, -1, nxt), mask=inside)
        if rows_out is not None:
            step = tl.load(row_step_ptr + offs, mask=draft_row, other=0).to(tl.int64)
            row_state = tl.load(row_state_ptr + offs, mask=draft_row, other=0).to(tl.int64)
            tl.store(rows_out + offs, tl.where(is_bonus, -1, row_state * num_steps + step), mask=inside)


# L and T follow the batch: left unspecialised so that a new batch reuses the variant.
@triton.jit(do_not_specialize=["L", "T", "max_rows"])
def step_inputs_kernel(
    cu_ptr,  # [B] int32/int64: inclusive cumulative sum of each request's k_r + 1 rows
    draft_ptr,  # [T] int32/int64: the draft ids, back to back (request r's after r earlier bonus rows)
    ids_out,  # [L] (dtype of the drafts): the draft id each row scores, -1 at bonus rows
    rows_out,  # [L] int64: the draft row of each row (i - r), -1 at bonus rows; or None
    bonus_out,  # [B] int64: -1 (every request's last draft is the rejected placeholder)
    ok_out,  # [B] bool: 0 <= start <= end <= L and at most max_rows rows (ragged.well_formed_requests)
    L,  # rows of the step (T + B)
    T,  # drafts of the step
    max_rows,  # K + 1
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    hi = tl.load(cu_ptr + r).to(tl.int64)
    lo = tl.load(cu_ptr + r - 1, mask=r > 0, other=0).to(tl.int64)
    ok = (lo >= 0) & (hi >= lo) & (hi <= L) & (hi - lo <= max_rows)
    tl.store(ok_out + r, ok)
    tl.store(bonus_out + r, tl.full([], -1, tl.int64))
    for start in range(lo, tl.where(ok, hi, lo), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < hi
        is_bonus = offs == hi - 1
        t = offs - r  # vLLM's target_logits_indices: draft t of request r is row t + r
        draft_row = inside & (~is_bonus) & (t >= 0) & (t < T)
        x = tl.load(draft_ptr + t, mask=draft_row, other=-1)
        tl.store(ids_out + offs, tl.where(draft_row, x, -1), mask=inside)
        if rows_out is not None:
            tl.store(rows_out + offs, tl.where(draft_row, t, -1), mask=inside)


@triton.jit
def chunk_outputs_kernel(
    out_ptr,  # [R, >= width] int64: the sampler's tokens
    stride_out,  # row stride of out
    stride_col,  # column stride of out
    dst_ptr,  # [R, width] contiguous: where the tokens go (another dtype); None: out, in place
    ok_ptr,  # [R] bool: the request is well formed
    num_sampled_ptr,  # [R] int32: tokens of each row, or None
    width,  # S + 1 columns
    BLOCK: tl.constexpr,  # >= width
):
    """v2_runner's tail in one launch: a malformed request emits nothing; a well-formed one at least
    one token (-1 in its first slot becomes 0: ragged.at_least_one_token); ``num_sampled`` counts
    the tokens."""
    r = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < width
    at = out_ptr + r * stride_out + offs * stride_col
    row = tl.load(at, mask=m, other=-1)
    ok = tl.load(ok_ptr + r) != 0
    row = tl.where(ok, row, -1)
    row = tl.where(ok & (offs == 0), tl.maximum(row, 0), row)
    if dst_ptr is None:
        tl.store(at, row, mask=m)
    else:
        tl.store(dst_ptr + r * width + offs, row, mask=m)
    if num_sampled_ptr is not None:
        tl.store(num_sampled_ptr + r, tl.sum((m & (row != -1)).to(tl.int32), axis=0))


def plan_bonus_row_inputs(
    cu: torch.Tensor,  # [R+1] int32/int64
    state: torch.Tensor,  # [R] int32/int64
    temperature: torch.Tensor,  # [num_states] float
    seed: torch.Tensor,  # [num_states] int64
    pos: torch.Tensor,  # [L'] int
    sampled: torch.Tensor,  # [L'] int32/int64
    row_state: torch.Tensor | None,  # [L'] int, or None
    row_step: torch.Tensor | None,  # [L'] int, or None
    num_rows: int,  # L
    num_steps: int,  # S' of the drafter cache (unused without it)
    max_rows_per_request: int,  # a bound on cu[r+1] - cu[r] (the vector step; longer requests loop)
    *,
    checked: bool = False,  # the seam's checks: also (ok [R] bool, sign(T) [R] fp32)
    workspace: bool = False,  # outputs the caller's later launches read, then drop: kept per shape
) -> tuple[list[KernelLaunch], tuple[torch.Tensor | None, ...]]:
    """The launch (none for an empty batch) and its outputs: (temperature [R] fp32, seeds [R]
    int64, offsets [R] int64, bonus [R] int64, ids [L], draft rows [L] int64 or None), the values of
    :func:`spec_samplers.bonus_rows.bonus_row_inputs_reference`, then with ``checked`` (ok [R]
    bool, sign(T) [R] fp32). Every [R] / [L] input is read through unit strides (made contiguous
    here: [R]- and [L]-sized copies at most). With ``workspace`` the outputs are allocated once
    per shape and stream (:func:`spec_samplers.kernels.backend.workspaces`): for a caller
    whose own later launches read them, as the seams' (the next call rewrites them)."""
    R = cu.shape[0] - 1
    device = cu.device
    has_rows = row_state is not None
    num_states = temperature.shape[0]
    key = (R, num_rows, sampled.dtype, has_rows, checked, num_steps, num_states, max_rows_per_request)

    def plan() -> tuple[dict[str, Any], tuple[torch.Tensor | None, ...]]:
        def make() -> tuple[torch.Tensor | None, ...]:
            f32, i64 = torch.float32, torch.int64
            per_request = [torch.empty(R, dtype=dtype, device=device) for dtype in (f32, i64, i64, i64)]
            ids = torch.empty(num_rows, dtype=sampled.dtype, device=device)
            rows = torch.empty(num_rows, dtype=i64, device=device) if has_rows else None
            checks = [torch.empty(R, dtype=torch.bool, device=device), torch.empty(R, dtype=f32, device=device)]
            return (*per_request, ids, rows, *(checks if checked else ()))

        made = backend.workspaces("bonus_row_inputs", key, device, make) if workspace else make()
        outs = ("temp_out", "seed_out", "offset_out", "bonus_out", "ids_out", "rows_out", "ok_out", "sign_out")
        constants: dict[str, Any] = dict(zip(outs, (*made, None, None)))
        constants.update(L=num_rows, num_steps=num_steps, num_states=num_states, max_rows=max_rows_per_request)
        constants["BLOCK"] = max(16, triton_next_pow2(max(1, max_rows_per_request)))
        return constants, made

    # the seam's workspaces and constexprs once per shape and stream (backend.plan_cache)
    constants, made = backend.plan_cache("bonus_row_inputs", key, device, plan) if workspace else plan()
    args = dict(
        constants,
        cu_ptr=cu.contiguous(),
        state_ptr=state.contiguous(),
        temp_ptr=temperature.contiguous(),
        seed_ptr=seed.contiguous(),
        pos_ptr=pos.contiguous(),
        sampled_ptr=sampled.contiguous(),
        row_state_ptr=None if row_state is None else row_state.contiguous(),
        row_step_ptr=None if row_step is None else row_step.contiguous(),
    )
    launches = [KernelLaunch(bonus_row_inputs_kernel, (R,), args, 1, "bonus_row_inputs")] if R > 0 else []
    return launches, made


def bonus_row_inputs_triton(
    *args: Any, config: LaunchConfig | None = None, checked: bool = False, workspace: bool = False
) -> tuple[torch.Tensor | None, ...]:
    """:func:`plan_bonus_row_inputs`'s outputs, its launch run (same arguments); with
    ``config.launches`` a list, the launch is appended to it and not run."""
    launches, outputs = plan_bonus_row_inputs(*args, checked=checked, workspace=workspace)
    for launch in launches:
        if not recorded(config, launch):
            bonus_row_inputs_kernel[launch.grid](**launch.args, num_warps=launch.num_warps)
    return outputs


def chunk_outputs_triton(
    out: torch.Tensor,  # [R, >= width] int64 (rewritten in place when dtype is its own)
    ok: torch.Tensor,  # [R] bool
    width: int,  # S + 1
    config: LaunchConfig | None = None,
    dtype: torch.dtype = torch.int64,  # of the tokens returned
    counts: bool = True,  # also num_sampled
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(tokens [R, width] of ``dtype``, num_sampled [R] int32 or None):
    :func:`spec_samplers.bonus_rows.chunk_outputs_reference`'s values in one launch (none for an
    empty batch)."""
    R = out.shape[0]
    num_sampled = torch.empty(R, dtype=torch.int32, device=out.device) if counts else None
    dst = None if dtype == out.dtype else torch.empty((R, width), dtype=dtype, device=out.device)
    block = triton_next_pow2(max(1, width))
    args: dict[str, Any] = dict(out_ptr=out, stride_out=out.stride(0), stride_col=out.stride(1), dst_ptr=dst)
    args["ok_ptr"] = ok
    args.update(num_sampled_ptr=num_sampled, width=width, BLOCK=block)
    launch = KernelLaunch(chunk_outputs_kernel, (R,), args, 1, "chunk_outputs")
    if R > 0 and not recorded(config, launch):
        chunk_outputs_kernel[launch.grid](**launch.args, num_warps=launch.num_warps)
    if dst is not None:
        return dst, num_sampled
    return (out if out.shape[1] == width else out[:, :width]), num_sampled  # (a view costs a few us)


def step_inputs_triton(
    cu: torch.Tensor,  # [B] inclusive cumulative sum of k_r + 1
    draft_token_ids: torch.Tensor,  # [T]
    num_rows: int,  # L = T + B
    max_rows: int,  # K + 1
    draft_rows: bool,  # also the draft row of each row
    config: LaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(ids [L], draft rows [L] int64 or None, bonus [B] int64, ok [B] bool):
    :func:`spec_samplers.bonus_rows.step_inputs_reference`'s values in one launch (none for an
    empty batch)."""
    B, device = cu.shape[0], cu.device
    ids = torch.empty(num_rows, dtype=draft_token_ids.dtype, device=device)
    rows = torch.empty(num_rows, dtype=torch.int64, device=device) if draft_rows else None
    bonus = torch.empty(B, dtype=torch.int64, device=device)
    ok = torch.empty(B, dtype=torch.bool, device=device)
    args: dict[str, Any] = dict(cu_ptr=cu.contiguous(), draft_ptr=draft_token_ids.contiguous(), ids_out=ids)
    args["rows_out"] = rows
    args.update(bonus_out=bonus, ok_out=ok, L=num_rows, T=draft_token_ids.shape[0], max_rows=max_rows)
    args["BLOCK"] = max(16, triton_next_pow2(max(1, max_rows)))
    launch = KernelLaunch(step_inputs_kernel, (B,), args, 1, "step_inputs")
    if B > 0 and not recorded(config, launch):
        step_inputs_kernel[launch.grid](**launch.args, num_warps=launch.num_warps)
    return ids, rows, bonus, ok
