"""``torch.library`` custom ops (namespace ``spec_samplers``), for ``torch.compile`` and meta tensors.

=========================================  =================================================
op                                         what it runs
=========================================  =================================================
``spec_samplers::verify``                  a sampler's entry (``SpecDecodeBaseSampler._run``)
``spec_samplers::sample``                  the sampling draw of every ``*_sampling_from_*`` op
``spec_samplers::softmax``                 :func:`spec_samplers.sampling.softmax`
``spec_samplers::renorm``                  ``top_k_renorm_probs`` / ``top_p_renorm_probs``
``spec_samplers::mask_logits``             ``top_k_mask_logits``
=========================================  =================================================

Each op has a fake (meta) implementation that gives the output's shape and dtype without
running anything, so Dynamo traces a sampler call or a sampling operation into one graph node
(``torch.compile(fullgraph=True)`` works) and a call on meta tensors gives the output's shape.
Eager calls on real tensors do not go through the dispatcher: the operations call their
launchers or references directly (:func:`routed` decides), so the ops cost nothing outside
tracing. An op's body calls the same launcher or reference, by name.

What crosses an op is what ``torch.library`` can carry: tensors, ints, floats, bools, strings.
So the arguments are canonical first, outside the op: the sampling parameters as [B] tensors,
and the **seeds as [B] int64 tensors** (with [B] int64 offsets). A ``torch.Generator`` cannot
cross: the sampling operations draw the seeds from it before the op (``seed=None``), and the
samplers' ``seeded_seqs`` (vLLM V0's generators) and ``sampling_params=`` (Python objects) are
refused while tracing, naming the argument to pass instead (``seeds=``, ``temperature=``). A
sampler crosses as an integer handle (:func:`register_sampler`), so a compiled graph calls the
very instance it traced, counters included.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

from spec_samplers import validation
from spec_samplers.cpu import draw as cpu_draw
from spec_samplers.kernels import sampling_launch
from spec_samplers.kernels.backend import check_backend, use_triton
from spec_samplers.sampling import reference as sampling_reference

_SAMPLERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)


def routed(x: torch.Tensor) -> bool:
    """Whether a call on ``x`` goes through the custom op: while Dynamo traces, or on meta tensors."""
    return x.device.type == "meta" or torch.compiler.is_compiling()


def register_sampler(sampler: Any) -> int:
    """A new handle for ``sampler`` (held weakly): what ``spec_samplers::verify`` names it by."""
    handle = next(_HANDLES)
    _SAMPLERS[handle] = sampler
    return handle


# -- the sampling operations --------------------------------------------------------------------


@torch.library.custom_op("spec_samplers::sample", mutates_args=())
def sample(
    x: torch.Tensor,  # [R, V] probabilities or logits, fp32/fp16/bf16
    rows: torch.Tensor,  # [B] int64: the input row of each output
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
    logits: bool,
    joint: bool,
    top_k: torch.Tensor | None,  # [B] int64
    top_p: torch.Tensor | None,  # [B] fp32
    min_p: torch.Tensor | None,  # [B] fp32
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B] int64, -1 where the row has no mass; valid [B] bool)."""
    draw: dict[str, Any] = dict(x=x, rows=rows, seeds=seeds, offsets=offsets, logits=logits, joint=joint)
    draw.update(top_k=top_k, top_p=top_p, min_p=min_p)
    if use_triton(check_backend(backend), x.device):
        tokens, valid = sampling_launch.sample_triton(**draw)
    else:
        tokens, valid = sampling_reference.sample_reference(**draw)
    return tokens.to(torch.int64), valid.to(torch.bool)


@sample.register_fake
def _(x, rows, seeds, offsets, logits, joint, top_k, top_p, min_p, backend):
    B = rows.shape[0]
    return x.new_empty((B,), dtype=torch.int64), x.new_empty((B,), dtype=torch.bool)


@torch.library.custom_op("spec_samplers::softmax", mutates_args=())
def softmax(
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    temperature: torch.Tensor,  # [B] fp32
    backend: str,
) -> torch.Tensor:
    """[B, V] fp32 softmax(logits / temperature)."""
    if use_triton(check_backend(backend), logits.device):
        return sampling_launch.softmax_triton(logits=logits, temperature=temperature)
    if backend == "auto" and cpu_draw.available(logits):  # (the eager call's CPU path: the same floats)
        return cpu_draw.softmax_rows(logits, temperature)
    return sampling_reference.softmax_reference(logits, temperature)


@softmax.register_fake
def _(logits, temperature, backend):
    return logits.new_empty(logits.shape, dtype=torch.float32)


@torch.library.custom_op("spec_samplers::renorm", mutates_args=())
def renorm(
    probs: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor | None,  # [B] int64
    top_p: torch.Tensor | None,  # [B] fp32
    out_dtype: torch.dtype,
    backend: str,
) -> torch.Tensor:
    """[B, V] ``out_dtype``: the filter's survivors renormalised, 0 elsewhere."""
    if use_triton(check_backend(backend), probs.device):
        return sampling_launch.renorm_triton(probs=probs, top_k=top_k, top_p=top_p, out_dtype=out_dtype)
    return sampling_reference.renorm_reference(probs, top_k=top_k, top_p=top_p, out_dtype=out_dtype)


@renorm.register_fake
def _(probs, top_k, top_p, out_dtype, backend):
    return probs.new_empty(probs.shape, dtype=out_dtype)


@torch.library.custom_op("spec_samplers::mask_logits", mutates_args=())
def mask_logits(
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor,  # [B] int64, <= 0 keeps every logit
    backend: str,  # "auto", "torch" or "triton"
) -> torch.Tensor:
    """[B, V] (dtype of ``logits``): logits below the k-th largest set to -inf, the others
    as they are."""
    if use_triton(check_backend(backend), logits.device):
        return sampling_launch.mask_logits_triton(logits=logits, top_k=top_k)
    return sampling_reference.mask_logits_reference(logits, top_k)


@mask_logits.register_fake
def _(logits, top_k, backend):
    return torch.empty_like(logits)


# -- verification --------------------------------------------------------------------------------


@torch.library.custom_op("spec_samplers::verify", mutates_args=())
def verify(
    sampler: int,  # a handle from register_sampler
    entry: str,  # "forward", "forward_ragged", "forward_from_logits" or "forward_ragged_from_logits"
    target: torch.Tensor,  # [B, k+1, V] padded or [T, V] ragged: probabilities or logits
    bonus_token_ids: torch.Tensor,  # [B, 1] or [B]
    draft: torch.Tensor | None,  # [B, k, V] / [T, V] or None
    draft_token_ids: torch.Tensor,  # [B, k] / [T]
    cu_num_draft_tokens: torch.Tensor | None,  # [B]: ragged
    max_spec_len: int | None,  # ragged
    temperature: torch.Tensor | None,  # [B]: logits entries
    seeds: torch.Tensor | None,  # [B] int64
    offsets: torch.Tensor | None,  # [B] int64
    is_greedy: torch.Tensor | None,  # [B] bool
    stochastic: bool,
    draft_rows: torch.Tensor | None = None,  # [T] int32/int64: ragged logits, rows of an [N, V] draft
    draft_temperature: torch.Tensor | None = None,  # [B] float: ragged logits
    draft_is_probs: bool = False,  # ragged logits: the draft holds probabilities
) -> torch.Tensor:
    """[B, K+1] int64, -1 padded: the sampler's entry on these arguments (counters updated)."""
    rows = (target, bonus_token_ids, draft, draft_token_ids)
    ragged = None if cu_num_draft_tokens is None else (cu_num_draft_tokens, max_spec_len)
    randomness = (None, seeds, offsets, is_greedy) if stochastic else None
    drafts = (draft_rows, draft_temperature, draft_is_probs)
    out: torch.Tensor = _SAMPLERS[sampler]._run_from_op(entry, rows, ragged, temperature, randomness, drafts)
    return out


@verify.register_fake
def _(
    sampler,
    entry,
    target,
    bonus_token_ids,
    draft,
    draft_token_ids,
    cu_num_draft_tokens,
    max_spec_len,
    temperature,
    seeds,
    offsets,
    is_greedy,
    stochastic,
    draft_rows=None,
    draft_temperature=None,
    draft_is_probs=False,
):
    # the metadata checks run here too (shapes, dtypes, devices: no data), naming the argument
    logits = entry.endswith("_from_logits")
    if cu_num_draft_tokens is not None:
        draft_name = "draft_logits" if logits and not draft_is_probs else "draft_probs"
        names = ("target_logits" if logits else "target_probs", draft_name)
        ragged = (cu_num_draft_tokens, max_spec_len)
        shapes = validation.check_ragged_metadata(
            target, bonus_token_ids, draft, draft_token_ids, *ragged, *names, draft_rows
        )
        num_slots = max_spec_len
    else:
        names = ("target_logits", "draft_logits") if logits else ("target_with_bonus_probs", "draft_probs")
        shapes = validation.check_metadata(target, bonus_token_ids, draft, draft_token_ids, *names)
        num_slots = shapes.num_draft_tokens
    return target.new_empty((shapes.batch_size, num_slots + 1), dtype=torch.int64)
