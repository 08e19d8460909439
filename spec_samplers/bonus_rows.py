"""Inputs of the bonus-row verification for an engine batch whose rows include each request's
bonus row (vLLM Model Runner V2's layout; ``integrations.vllm.fast_path.verify_with_bonus_rows``).

Request r's rows are [cu[r], cu[r+1]), the last one its bonus row. Its temperature and seed live
at its request state ``state[r]``; its counter offset is the position of its first row; row i
scores the sampled id ``sampled[i + 1]`` and the bonus row the -1 placeholder; with a drafter
cache, row i reads cache row ``row_state[i] * num_steps + row_step[i]`` and the bonus row none
(-1). :func:`bonus_row_inputs_reference` gathers them with eager ops; on CUDA
:func:`bonus_row_inputs` runs their kernel twin (one launch:
:mod:`spec_samplers.kernels.bonus_row_kernels`), same values.

A seam (``integrations.vllm.v2_runner.verify``) takes them with its metadata checks,
:func:`chunk_inputs` (one launch with the kernels, else :func:`chunk_inputs_reference`), and
finishes the sampler's output with :func:`chunk_outputs` (one launch, else
:func:`chunk_outputs_reference`): no eager op around the sampler on the kernels' path. Which
path runs is the sampler's backend's (``kernels.backend.use_triton``).
"""

from __future__ import annotations

from typing import NamedTuple, cast

import torch

from spec_samplers.kernels.backend import launch_config, use_triton
from spec_samplers.output import PLACEHOLDER_TOKEN_ID


class BonusRowInputs(NamedTuple):
    temperature: torch.Tensor  # [R] fp32, 0 = greedy request
    seeds: torch.Tensor  # [R] int64
    offsets: torch.Tensor  # [R] int64
    bonus: torch.Tensor  # [R] int64, -1: never emitted (every request's last draft is rejected)
    ids: torch.Tensor  # [L] (dtype of sampled): -1 at bonus rows
    draft_rows: torch.Tensor | None  # [L] int: drafter cache rows, -1 at bonus rows; None without a cache


class ChunkInputs(NamedTuple):
    """The inputs of a checked chunk (:func:`chunk_inputs`)."""

    ok: torch.Tensor  # [R] bool: the request is well formed (:func:`well_formed_chunk`)
    #: [R] fp32: what the target logits are divided by: sign(T) for logits vLLM divided already
    #: (1, or 0 for a greedy request), else T
    target_temperature: torch.Tensor
    inputs: BonusRowInputs  # of the well-formed requests (a malformed one's are never emitted)


def well_formed_chunk(
    cu: torch.Tensor,  # [R+1] int
    state: torch.Tensor,  # [R] int
    num_states: int,
    num_rows: int,  # L
    max_rows: int,  # S + 1: a request has at most S drafts, then its bonus row
) -> torch.Tensor:
    """[R] bool: request r is well formed when 0 <= cu[r] < cu[r+1] <= L (cu[0] == 0: the rows
    count from row 0), it has at most ``max_rows`` rows (its bonus row last), no earlier request
    reaches past its first row and its state exists (eager ops, no host read)."""
    cu = cu.to(torch.int64)
    start, end = cu[:-1], cu[1:]
    first = torch.arange(state.shape[0], device=cu.device) == 0
    ok = (start >= 0) & (end > start) & (end <= num_rows) & (end - start <= max_rows)
    ok &= (state >= 0) & (state < num_states) & (~first | (start == 0))
    return ok & (torch.cummax(cu, 0).values[:-1] == start)


def chunk_inputs_reference(
    cu: torch.Tensor,  # [R+1] int32/int64
    state: torch.Tensor,  # [R] int32/int64
    temperature: torch.Tensor,  # [num_states] float
    seed: torch.Tensor,  # [num_states] int64
    pos: torch.Tensor,  # [L'] int, L' >= L
    sampled: torch.Tensor,  # [L'] int32/int64
    row_state: torch.Tensor | None,  # [L'] int, or None (no drafter cache)
    row_step: torch.Tensor | None,  # [L'] int, or None
    num_rows: int,  # L
    num_steps: int,  # S' of the drafter cache
    max_rows: int,  # S + 1
    logits_divided: bool,  # target_temperature is sign(T), else T
) -> ChunkInputs:
    """:func:`chunk_inputs` with eager ops: the checks, then :func:`bonus_row_inputs_reference`
    on the metadata made safe to index with (counts clamped into [0, L], a malformed request's
    state 0)."""
    ok = well_formed_chunk(cu, state, temperature.shape[0], num_rows, max_rows)
    cu, state = cu.to(torch.int64).clamp(0, num_rows), torch.where(ok, state, 0)
    inputs = bonus_row_inputs_reference(
        cu, state, temperature, seed, pos, sampled, row_state, row_step, num_rows, num_steps, ok
    )
    return ChunkInputs(ok, inputs.temperature.sign() if logits_divided else inputs.temperature, inputs)


def chunk_inputs(
    cu: torch.Tensor,  # [R+1] int32/int64
    state: torch.Tensor,  # [R] int32/int64
    temperature: torch.Tensor,  # [num_states] float
    seed: torch.Tensor,  # [num_states] int64
    pos: torch.Tensor,  # [L'] int
    sampled: torch.Tensor,  # [L'] int32/int64
    row_state: torch.Tensor | None,  # [L'] int, or None
    row_step: torch.Tensor | None,  # [L'] int, or None
    num_rows: int,  # L
    num_steps: int,  # S' of the drafter cache
    max_rows: int,  # S + 1
    logits_divided: bool,
    backend: str = "auto",  # the sampler's: kernels or PyTorch (kernels.backend.use_triton)
) -> ChunkInputs:
    """The checked inputs of a chunk: one kernel launch with the kernels (the rows of a
    well-formed request hold its values; a malformed request's are never emitted), else
    :func:`chunk_inputs_reference`. The well-formed requests' values are the same. The kernels'
    outputs are the seam's workspaces, kept per shape and stream: the next chunk of the same shape
    on the stream rewrites them, after this chunk's launches that read them."""
    config = launch_config()  # a tool planning our launches (kernels.backend.planned_for)
    if not use_triton(backend, cu.device, config):
        args = (cu, state, temperature, seed, pos, sampled, row_state, row_step, num_rows, num_steps, max_rows)
        return chunk_inputs_reference(*args, logits_divided)
    from spec_samplers.kernels.bonus_row_kernels import bonus_row_inputs_triton

    args = (cu, state, temperature, seed, pos, sampled, row_state, row_step, num_rows, num_steps, max_rows)
    # workspace: the seam's sampler and tail read them in its own call (their launches follow on the stream)
    made = bonus_row_inputs_triton(*args, config=config, checked=True, workspace=True)
    temp, *inputs, ok, sign = cast("list[torch.Tensor]", made)
    return ChunkInputs(ok, sign if logits_divided else temp, BonusRowInputs(temp, *inputs))


def chunk_outputs_reference(
    out: torch.Tensor,  # [R, >= width] int64, the sampler's tokens
    ok: torch.Tensor,  # [R] bool
    width: int,  # S + 1
    dtype: torch.dtype = torch.int64,  # of the tokens returned
    counts: bool = True,  # also num_sampled
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(tokens [R, width] of ``dtype``, num_sampled [R] int32 or None): a malformed request
    emits nothing; a well-formed one whose first row has no mass gets token 0 there (vLLM's
    contract: ``integrations.vllm.ragged.at_least_one_token``)."""
    out = torch.where(ok[:, None], out[:, :width], PLACEHOLDER_TOKEN_ID)
    out[:, :1] = torch.where(ok[:, None], out[:, :1].clamp(min=0), out[:, :1])
    num_sampled = (out != PLACEHOLDER_TOKEN_ID).sum(dim=1, dtype=torch.int32) if counts else None
    return out.to(dtype), num_sampled


def chunk_outputs(
    out: torch.Tensor,  # [R, >= width] int64
    ok: torch.Tensor,  # [R] bool
    width: int,  # S + 1
    backend: str = "auto",
    dtype: torch.dtype = torch.int64,
    counts: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`chunk_outputs_reference`'s values: one launch with the kernels (``out`` rewritten
    in place when ``dtype`` is its own), else the eager ops."""
    config = launch_config()
    if not use_triton(backend, out.device, config):
        return chunk_outputs_reference(out, ok, width, dtype, counts)
    from spec_samplers.kernels.bonus_row_kernels import chunk_outputs_triton

    return chunk_outputs_triton(out, ok, width, config, dtype, counts)


def step_inputs_reference(
    cu: torch.Tensor,  # [B] int32/int64: inclusive cumulative sum of each request's k_r + 1 rows
    draft_token_ids: torch.Tensor,  # [T]
    num_rows: int,  # L = T + B
    max_rows: int,  # K + 1
    draft_rows: bool,  # also the draft row of each row
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(ids [L], draft rows [L] int64 or None, bonus [B] int64, ok [B] bool) of a vLLM V1 step
    whose rows are each request's k_r draft rows, then its bonus row: row i of request r scores
    draft i - r (vLLM's ``target_logits_indices``), -1 at bonus rows; the bonus ids are the -1
    placeholder (never emitted); ``ok``: the request's rows are well formed
    (``integrations.vllm.ragged.well_formed_requests``)."""
    from spec_samplers.layout import ragged_layout

    B, device = cu.shape[0], cu.device
    rows, _, num = ragged_layout(cu, max_rows, num_rows)  # [B, K+2]: each request's rows, -1 past them
    last = (num - 1).clamp(min=0)[:, None]
    draft = rows - torch.arange(B, device=device)[:, None]  # [B, K+2]
    is_draft = (rows >= 0) & (torch.arange(rows.shape[1], device=device)[None, :] < last)
    is_draft &= (draft >= 0) & (draft < draft_token_ids.shape[0])
    where = torch.where(rows >= 0, rows, num_rows).reshape(-1)  # a row past L for the padding (cut below)
    index = torch.full((num_rows + 1,), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    index = index.scatter(0, where, torch.where(is_draft, draft, PLACEHOLDER_TOKEN_ID).reshape(-1))[:num_rows]
    ids = torch.nn.functional.pad(draft_token_ids, (0, 1), value=PLACEHOLDER_TOKEN_ID)[index]  # -1 -> the pad
    bonus = torch.full((B,), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    return ids, index if draft_rows else None, bonus, num >= 0


def step_inputs(
    cu: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_rows: int,
    max_rows: int,
    draft_rows: bool,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """:func:`step_inputs_reference`'s values: one launch with the kernels, else the eager ops."""
    config = launch_config()
    if not use_triton(backend, cu.device, config):
        return step_inputs_reference(cu, draft_token_ids, num_rows, max_rows, draft_rows)
    from spec_samplers.kernels.bonus_row_kernels import step_inputs_triton

    return step_inputs_triton(cu, draft_token_ids, num_rows, max_rows, draft_rows, config)


def bonus_row_inputs_reference(
    cu: torch.Tensor,  # [R+1] int32/int64
    state: torch.Tensor,  # [R] int32/int64
    temperature: torch.Tensor,  # [num_states] float
    seed: torch.Tensor,  # [num_states] int64
    pos: torch.Tensor,  # [L'] int, L' >= L
    sampled: torch.Tensor,  # [L'] int32/int64
    row_state: torch.Tensor | None,  # [L'] int, or None (no drafter cache)
    row_step: torch.Tensor | None,  # [L'] int, or None
    num_rows: int,  # L
    num_steps: int,  # S' of the drafter cache
    ok: torch.Tensor | None = None,  # [R] bool: only these requests mark their bonus row (None: all)
) -> BonusRowInputs:
    """The inputs with eager ops (about ten small ones)."""
    cu64 = cu.to(torch.int64)
    bonus_rows = cu64[1:] - 1  # [R]
    if ok is not None:  # a malformed request's bonus row is row L, past the rows (cut below)
        bonus_rows = torch.where(ok, bonus_rows, num_rows)
    ids = torch.nn.functional.pad(sampled[1:num_rows], (0, 2), value=PLACEHOLDER_TOKEN_ID)
    ids = ids.index_fill(0, bonus_rows, PLACEHOLDER_TOKEN_ID)[:num_rows]
    rows = None
    if row_state is not None and row_step is not None:
        rows = torch.add(row_step[:num_rows], row_state[:num_rows], alpha=num_steps)
        rows = torch.nn.functional.pad(rows, (0, 1), value=-1).index_fill_(0, bonus_rows, -1)[:num_rows]
    return BonusRowInputs(
        temperature[state].to(torch.float32),
        seed[state].to(torch.int64),
        pos[cu64[:-1].clamp(0, max(num_rows - 1, 0))].to(torch.int64),  # (the kernel masks to [0, L))
        torch.full_like(bonus_rows, PLACEHOLDER_TOKEN_ID),
        ids,
        rows,
    )


def bonus_row_inputs(
    cu: torch.Tensor,  # [R+1] int32/int64
    state: torch.Tensor,  # [R] int32/int64
    temperature: torch.Tensor,  # [num_states] float
    seed: torch.Tensor,  # [num_states] int64
    pos: torch.Tensor,  # [L'] int
    sampled: torch.Tensor,  # [L'] int32/int64
    row_state: torch.Tensor | None,  # [L'] int, or None
    row_step: torch.Tensor | None,  # [L'] int, or None
    num_rows: int,  # L
    num_steps: int,  # S' of the drafter cache
    max_rows_per_request: int,  # a bound on a request's rows (k + 1): the kernel's vector step
    backend: str = "auto",  # the sampler's: kernels or PyTorch (kernels.backend.use_triton)
) -> BonusRowInputs:
    """:func:`bonus_row_inputs_reference`'s values: one kernel launch with the kernels, the eager
    ops elsewhere."""
    args = (cu, state, temperature, seed, pos, sampled, row_state, row_step, num_rows, num_steps)
    config = launch_config()  # a tool planning our launches (kernels.backend.planned_for)
    if not use_triton(backend, cu.device, config):
        return bonus_row_inputs_reference(*args)
    from spec_samplers.kernels.bonus_row_kernels import bonus_row_inputs_triton

    return BonusRowInputs(
        *cast("list[torch.Tensor]", bonus_row_inputs_triton(*args, max_rows_per_request, config=config))
    )
