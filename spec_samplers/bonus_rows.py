"""Inputs of the bonus-row verification for an engine batch whose rows include each request's
bonus row (vLLM Model Runner V2's layout; ``integrations.vllm.fast_path.verify_with_bonus_rows``).

Request r's rows are [cu[r], cu[r+1]), the last one its bonus row. Its temperature and seed live
at its request state ``state[r]``; its counter offset is the position of its first row; row i
scores the sampled id ``sampled[i + 1]`` and the bonus row the -1 placeholder; with a drafter
cache, row i reads cache row ``row_state[i] * num_steps + row_step[i]`` and the bonus row none
(-1). :func:`bonus_row_inputs_reference` gathers them with eager ops; on CUDA
:func:`bonus_row_inputs` runs their kernel twin (one launch:
:mod:`spec_samplers.kernels.bonus_row_kernels`), same values.
"""

from __future__ import annotations

from typing import NamedTuple

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
) -> BonusRowInputs:
    """The inputs with eager ops (about ten small ones)."""
    cu64 = cu.to(torch.int64)
    bonus_rows = cu64[1:] - 1  # [R]
    ids = torch.nn.functional.pad(sampled[1:num_rows], (0, 1), value=PLACEHOLDER_TOKEN_ID)
    ids = ids.index_fill(0, bonus_rows, PLACEHOLDER_TOKEN_ID)
    rows = None
    if row_state is not None and row_step is not None:
        rows = torch.add(row_step[:num_rows], row_state[:num_rows], alpha=num_steps).index_fill_(0, bonus_rows, -1)
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
) -> BonusRowInputs:
    """:func:`bonus_row_inputs_reference`'s values: one kernel launch on CUDA, the eager ops
    elsewhere."""
    args = (cu, state, temperature, seed, pos, sampled, row_state, row_step, num_rows, num_steps)
    config = launch_config()  # a tool planning our launches (kernels.backend.planned_for)
    if not use_triton("auto", cu.device, config):
        return bonus_row_inputs_reference(*args)
    from spec_samplers.kernels.bonus_row_kernels import bonus_row_inputs_triton

    return BonusRowInputs(*bonus_row_inputs_triton(*args, max_rows_per_request, config=config))
