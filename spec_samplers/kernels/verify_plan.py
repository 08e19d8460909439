"""The launch plans of the verification launchers (:mod:`~spec_samplers.kernels.rejection_launch`,
:mod:`~spec_samplers.kernels.block_launch`, :mod:`~spec_samplers.kernels.typical_launch`).

Rejection sampling and block verification share one plan (:func:`plan_verify`): the same
inputs, the same tuple arguments (:mod:`spec_samplers.kernels.verify_kernels`), one partials
kernel over the vocabulary whose last program per request finishes that request (an arrival
counter: no separate finalize launch); they differ in their kernels (:data:`REJECTION`,
:data:`BLOCK`) and in whether the vocabulary partials are per request or per (request,
position). Typical acceptance has its own (:func:`plan_typical`).

A plan is a pure function of the inputs' shapes, dtypes and which optional tensors are present:
``tests/kernel_compile_check.py`` compiles exactly the variants it can produce. It imports the
kernels (hence triton); the launchers import it when they run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from spec_samplers import rng
from spec_samplers.constants import fp32_value
from spec_samplers.errors import input_error
from spec_samplers.kernels import block_kernels as bk
from spec_samplers.kernels import launch_common as lc
from spec_samplers.kernels import rejection_kernels as rk
from spec_samplers.kernels import typical_kernels as tk
from spec_samplers.kernels.backend import LaunchConfig, VocabSplit, combine_blocks, triton_next_pow2, vocab_split
from spec_samplers.layout import VerifyBatch


@dataclass(frozen=True)
class VerifyKernels:
    """What one verification method launches."""

    method: str  # for messages
    #: triton JITFunction: (seqs, req, parts, out_ptr, arrivals, K, V, num_rows, chunk, NB, BLOCK_K,
    #: BLOCK_V, TAIL_K, TAIL_NB, PRECISE); its last program per request writes the output row
    partials: Any
    name: str  # launch name
    #: partials per (request, position), grid (B, K+1, NB), each program seeing positions 0..K;
    #: else per request, grid (B, NB), each program seeing the K draft positions
    per_position: bool
    options: dict[str, Any] = field(default_factory=dict)  # compile options of the launch


#: one residual pass per request (at its first rejection), partials [B, NB]
REJECTION = VerifyKernels("rejection sampling", rk.residual_partials_kernel, "residual_partials", False)

#: one pass per (request, position), partials [B, K+1, NB]; rho * q - p must round as in the
#: reference's separate multiply and subtract: no FMA contraction
BLOCK = VerifyKernels(
    "block verification",
    bk.block_partials_kernel,
    "block_partials",
    True,
    {"enable_fp_fusion": False},
)


def plan_verify(
    batch: VerifyBatch, kernels: VerifyKernels, split: VocabSplit | None, config: LaunchConfig | None = None
) -> tuple[list[lc.KernelLaunch], torch.Tensor]:
    """The launches of one call and the [B, K+1] int64 output they fill. ``split`` (tests)
    overrides the vocabulary split of every pass; ``config.num_sms`` the device's SM count."""
    layout = batch.layout
    B, K, V = layout.batch_size, layout.max_drafts, layout.vocab_size
    num_sms = None if config is None else config.num_sms
    start = lc.plan_start(batch, split, batch.draft, num_sms)
    out, launches, stats, amax = start.out, start.launches, start.stats, start.amax
    if start.split is None:
        return [], out
    if batch.seeds is None:
        raise input_error("seeds", f"per-request seeds ({kernels.method} draws random numbers)", None)
    device = out.device
    # The statistics pass (logits) keeps its split. This pass takes the widest vector step at
    # every B: its last program per request finishes that request, on the program's warps (4).
    pass_split = split if split is not None else vocab_split(V, B, device, wide_steps=True, num_sms=num_sms)
    NB, amax_nb = pass_split.num_blocks, start.split.num_blocks
    # logits entries: the kernels read T == 0 as greedy from the temperatures themselves
    # (verify_kernels.request_greedy), so no eager comparison op runs per call
    is_greedy = batch.temperature if batch.temperature is not None else batch.is_greedy
    if batch.temperature is None and is_greedy is not None:
        amax = lc.partials(device, (B, K + 1, NB), torch.float32, torch.int32)
        amax_nb = NB  # the argmax partials below take the pass's split
    seqs = (
        lc.rows(layout, start.target, stats["t_stats_ptr"]),
        # draft probabilities (draft_is_probs) have no statistics and no temperature: read as given
        lc.rows(
            layout,
            start.draft,
            stats["d_stats_ptr"],
            start.draft_index,
            None if batch.draft_is_probs else batch.draft_temperature,
        ),
        lc.rows(layout, batch.draft_token_ids)[:3],
    )
    bonus = batch.bonus_token_ids
    req = (layout.cu_num_draft_tokens, batch.seeds, batch.offsets, batch.temperature, is_greedy, bonus, bonus.stride(0))
    # the residual-mass partials (the partials kernel's grid is their shape), the fp64 race-group
    # sums of the residual and of q per (request[, position]), then the greedy argmax partials
    shape: tuple[int, ...] = (B, K + 1, NB) if kernels.per_position else (B, NB)
    groups = (*shape[:-1], rng.race_num_groups(V))
    parts = lc.partials(device, shape, torch.float32) + lc.partials(device, groups, torch.float64, torch.float64) + amax
    dims = dict(K=K, V=V, num_rows=layout.num_rows, NB=NB)
    if batch.temperature is None and is_greedy is not None:
        args = dict(target=seqs[0], req=req, parts=parts, **dims, chunk=pass_split.chunk, BLOCK_V=pass_split.block_v)
        launches.append(lc.KernelLaunch(rk.argmax_partials_kernel, (B, K + 1, NB), args, name="argmax_partials"))
    positions = K + 1 if kernels.per_position else max(K, 1)
    tail_k, tail_nb, _ = combine_blocks(K + 1, max(NB, amax_nb))
    args = dict(
        seqs=seqs,
        req=req,
        parts=parts,
        out_ptr=out,
        arrivals=lc.arrival_counters(device, B),
        **dims,
        NB_AMAX=amax_nb,
        chunk=pass_split.chunk,
        BLOCK_K=triton_next_pow2(positions),
        BLOCK_V=pass_split.block_v,
        TAIL_K=tail_k,
        TAIL_NB=tail_nb,
        PRECISE=lc.precise_math(),
    )
    # one warp per 256 entries of a vector step (as the statistics pass): each thread then loads
    # 8 consecutive entries, 128 bits of bf16, also at the narrow steps of small batches
    warps = max(1, pass_split.block_v // 256)
    launches.append(lc.KernelLaunch(kernels.partials, shape, args, warps, kernels.name, dict(kernels.options)))
    return launches, out


def plan_typical(
    batch: VerifyBatch,
    posterior_threshold: float,
    posterior_alpha: float,
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
) -> tuple[list[lc.KernelLaunch], torch.Tensor]:
    """The launches of one typical-acceptance call and the [B, K+1] int64 output they fill."""
    layout = batch.layout
    B, K = layout.batch_size, layout.max_drafts
    num_sms = None if config is None else config.num_sms
    start = lc.plan_start(batch, split, None, num_sms)  # drafts are point masses here: no draft rows
    out, split, launches = start.out, start.split, start.launches
    if split is None:
        return [], out
    NB = split.num_blocks
    target = lc.rows(layout, start.target, start.stats["t_stats_ptr"])
    seqs = (target, lc.rows(layout, None), lc.rows(layout, batch.draft_token_ids)[:3])
    bonus = batch.bonus_token_ids
    req = (layout.cu_num_draft_tokens, None, None, batch.temperature, None, bonus, bonus.stride(0))
    # (entropy, max, argmax) partials of q, then the logits (max, argmax) partials (greedy requests)
    parts = lc.partials(out.device, (B, K + 1, NB), torch.float64, torch.float32, torch.int32) + start.amax
    dims = dict(req=req, parts=parts, K=K, V=layout.vocab_size, num_rows=layout.num_rows, NB=NB)
    args = dict(dims, target=target, chunk=split.chunk, BLOCK_V=split.block_v, PRECISE=lc.precise_math())
    launches.append(lc.KernelLaunch(tk.typical_partials_kernel, (B, K + 1, NB), args, name="typical_partials"))
    block_k, block_nb, warps = combine_blocks(K + 1, NB)
    # fp32 values: a Triton float argument is fp32, and the reference rounds alike
    posterior = (fp32_value(posterior_threshold), fp32_value(posterior_alpha))
    args = dict(dims, seqs=seqs, out_ptr=out, posterior=posterior, BLOCK_K=block_k, BLOCK_NB=block_nb)
    args["PRECISE"] = lc.precise_math()
    launches.append(lc.KernelLaunch(tk.typical_finalize_kernel, (B,), args, warps, "typical_finalize"))
    return launches, out
