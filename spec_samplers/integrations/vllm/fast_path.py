"""The fast paths of both vLLM runners: the engine's logits verified in place, bonus rows included.

vLLM lays a step's logits out as each request's k_r draft rows followed by its bonus row. A
sampler that declares ``bonus_rows_in_place`` (:func:`bonus_row_verifiable`) verifies them
where the engine wrote them (:func:`verify_with_bonus_rows`): request r's k_r + 1 rows are one
ragged request whose last draft is the -1 placeholder, always rejected, so the token there is a
sample of the bonus row (its argmax for a greedy request) drawn by the recovery race of position
k_r in the sampler's kernels; no row is copied and no bonus is drawn eagerly.

- Model Runner V2's seam (``v2_runner.verify``) verifies every chunk so
  (:func:`verify_chunk_with_bonus_rows`, the drafter's cached logits read in place too).
- Plain steps skip vLLM's glue as well: when a batch needs nothing but each request's
  temperature, the model's raw logits are verified, divided by T in the kernels.
  V1: :func:`plain_step` / :func:`verify_plain_step` (called by ``v1_runner.forward``, the
  plugin's wrapper of ``RejectionSampler.forward``; the bonus token is drawn in our kernels
  instead of by vLLM's Sampler). Model Runner V2: :func:`plain_chunk`
  (called by ``v2_runner.verify_chunk``, the wrapper of ``RejectionSampler._verify``, from the
  per-request flag ``v2_runner.add_request`` records: :func:`needs_more_than_temperature`; a
  plain chunk is ``v2_runner.verify_plain_chunk``: the seam on the raw logits, which takes
  :func:`verify_chunk_with_bonus_rows`).

No vocabulary-sized eager tensor per step, with point-mass drafts or draft probabilities / the
drafter's logits (read in place by index). The runner modules install the seams and call these;
what a step's law is stays theirs: these paths give the same tokens as the runners' seams on
the same inputs (tests/test_vllm_v1_fast_path.py, tests/test_vllm_v2_fast_path.py).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import operator
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from spec_samplers.base import Prepared, SpecDecodeBaseSampler, SpecDecodeStochasticBaseSampler
from spec_samplers.bonus_rows import chunk_inputs_reference, chunk_outputs, chunk_outputs_reference, step_inputs
from spec_samplers.constants import MAX_SPEC_LEN
from spec_samplers.cpu import draw as cpu_draw
from spec_samplers.integrations.vllm.ragged import (
    RaggedVerifier,
    at_least_one_token,
    greedy_verify_ragged,
    well_formed_requests,
)
from spec_samplers.kernels.backend import _tracing_fake, launch_config, use_triton
from spec_samplers.layout import RowLayout, VerifyBatch
from spec_samplers.output import PLACEHOLDER_TOKEN_ID
from spec_samplers.rng import row_seeds
from spec_samplers.validation import ID_DTYPES, PROBS_DTYPES


def bonus_row_verifiable(sampler: torch.nn.Module) -> bool:
    """Whether the sampler's token at an out-of-range draft is a sample of the target row at that
    position, by the recovery race of that position, which is how :func:`verify_with_bonus_rows`
    draws a bonus token: the sampler class declares it (``bonus_rows_in_place = True``, a
    capability of :class:`~spec_samplers.base.SpecDecodeBaseSampler`: rejection sampling and block
    verification, or a third-party sampler that declares it; not typical acceptance, which
    recovers the argmax) and is not in strict mode (which refuses out-of-range ids)."""
    return bool(getattr(type(sampler), "bonus_rows_in_place", False)) and not getattr(sampler, "strict_mode", False)


def verify_with_bonus_rows(
    verifier: RaggedVerifier,
    logits: torch.Tensor,  # [L, V]: every row of the batch, bonus rows included
    draft_logits: torch.Tensor | None,  # [L, V], [N, V] with draft_rows, or None (point-mass drafts)
    draft_token_ids: torch.Tensor,  # [L] int32/int64: -1 at every bonus row
    cu_num_rows: torch.Tensor,  # [R] int32/int64 inclusive cumulative sum of k_r + 1
    max_spec_len: int,  # K >= every k_r
    *,
    temperature: torch.Tensor,  # [R] float: what the logits are divided by, 0 = greedy request
    seeds: torch.Tensor,  # [R] int64
    offsets: torch.Tensor | None = None,  # [R] int64
    bonus_token_ids: torch.Tensor | None = None,  # [R] int, never emitted (default: -1s, one op)
    **draft_rows: torch.Tensor,  # draft_rows [L] (-1 at bonus rows), draft_temperature [R]
) -> torch.Tensor:
    """[R, K+1] int64, -1 padded: the engine's logits verified in place by the sampler's logits
    entry (requires :attr:`RaggedVerifier.has_logits_entry` and :func:`bonus_row_verifiable`).
    Request r's rows [cu[r-1], cu[r]) are one ragged request of k_r + 1 rows whose last draft is
    the -1 placeholder: always rejected, its token is a sample of the bonus row (the argmax for a
    greedy request) by the recovery race of position k_r. So the kernels read the logits where
    the engine wrote them and no vocabulary-sized tensor is created."""
    if bonus_token_ids is None:
        bonus_token_ids = torch.full_like(seeds, PLACEHOLDER_TOKEN_ID)
    probs_rows = draft_rows.keys() == {"draft_probs", "draft_rows"}  # V1's q read in place by index
    if draft_logits is None and (not draft_rows or probs_rows):  # the seam builds the batch
        q = draft_rows["draft_probs"] if probs_rows else None
        rows = {"draft_rows": draft_rows["draft_rows"]} if probs_rows else {}
        args = (logits, bonus_token_ids, q, draft_token_ids, cu_num_rows, max_spec_len + 1)
        out = _verify_in_place(verifier, *args, temperature, seeds, offsets, rows, draft_is_probs=probs_rows)
        return out[:, : max_spec_len + 1]
    out = verifier.from_logits(
        logits,
        bonus_token_ids,  # never emitted: every last draft is rejected
        draft_logits,
        draft_token_ids,
        cu_num_rows,
        max_spec_len + 1,
        temperature=temperature,
        seeds=seeds,
        offsets=offsets,
        **draft_rows,
    )  # [R, K+2]: at most k_r + 1 <= K + 1 tokens per request
    return out[:, : max_spec_len + 1]


# --- V1: plain steps (RejectionSampler.forward without vLLM's glue) -------------------------------


def _builtin_and_inactive(processor: Any) -> bool:
    """Whether a V1 logits processor is one of vLLM's built-ins (exactly: not a subclass) with no
    request using it in this batch; any other processor may change the logits."""
    idle = {
        "MinPLogitsProcessor": lambda p: not p.min_p_count,
        "LogitBiasLogitsProcessor": lambda p: not p.biases,
        "MinTokensLogitsProcessor": lambda p: not p.min_toks,
    }.get(type(processor).__name__)
    builtin = type(processor).__module__ == "vllm.v1.sample.logits_processor.builtin"
    return builtin and idle is not None and bool(idle(processor))


def plain_step(
    rejection_sampler: Any,  # vLLM's RejectionSampler (its synthetic / FLy settings)
    verifier: RaggedVerifier,
    metadata: Any,  # SpecDecodeMetadata
    draft_probs: torch.Tensor | None,  # [T, V] or None
    logits: torch.Tensor,  # [T + B, V]
    sampling_metadata: Any,  # SamplingMetadata
) -> bool:
    """Whether the step needs nothing but each request's temperature, so that
    :func:`verify_plain_step` gives vLLM's law: no top-k / top-p, penalties, allowed-token mask,
    bad words, thinking budget, active logits processor (every one a built-in and idle), no
    logprobs, not vLLM's synthetic mode or FLy, shapes as vLLM lays them out, and a sampler that
    draws a bonus row in place. Host-side attributes only: no device work."""
    sm = sampling_metadata
    holder = getattr(sm, "thinking_budget_state_holder", None)
    processors = sm.logitsprocs
    step_is_plain = (
        not getattr(rejection_sampler, "synthetic_mode", True)
        and getattr(rejection_sampler, "fly_window_size", None) is None
        and sm.max_num_logprobs is None
        and not getattr(sm, "logprob_token_ids", None)
        and sm.top_k is None
        and sm.top_p is None
        and sm.no_penalties
        and sm.allowed_token_ids_mask is None
        and not sm.bad_words_token_ids
        and (holder is None or not holder.has_tracked_requests())
        and all(map(_builtin_and_inactive, [*processors.argmax_invariant, *processors.non_argmax_invariant]))
        and (sm.all_greedy or sm.temperature is not None)
    )
    if not step_is_plain or not bonus_row_verifiable(verifier.sampler):
        return False
    num_drafts = metadata.draft_token_ids.shape[0]
    if logits.dim() != 2 or logits.shape[0] != num_drafts + len(metadata.num_draft_tokens):
        return False
    if draft_probs is None or sm.all_greedy or num_drafts == 0:  # no draft's law to read
        return verifier.has_logits_entry
    same_shape = tuple(draft_probs.shape) == (num_drafts, logits.shape[1])
    # q goes to the logits entry too (draft_probs with draft_rows)
    return verifier.has_logits_entry and same_shape and draft_probs.is_floating_point()


def verify_plain_step(
    verifier: RaggedVerifier,
    metadata: Any,  # SpecDecodeMetadata
    draft_probs: torch.Tensor | None,  # [T, V] fp32 (the drafter's law) or None
    logits: torch.Tensor,  # [T + B, V]: request r's k_r draft rows, then its bonus row
    sampling_metadata: Any,  # SamplingMetadata of a plain step (plain_step)
) -> torch.Tensor:
    """[B, K+1] int32, -1 padded: a plain step (:func:`plain_step`) verified from the model's
    logits, bonus rows included, as Model Runner V2's seam does (request r's rows
    [cu[r-1] + r, cu[r] + r] are one ragged request of k_r + 1 rows whose last draft is the -1
    placeholder; the token there is the bonus sample, drawn in our kernels).

    The sampler's logits entry reads the logits in place, divided by each request's temperature
    in the kernels (0: greedy, the argmax), and draft probabilities, when the drafter hands them
    over, in place too (``draft_probs`` with ``draft_rows``: row i of request r reads q's row
    i - r): p is verified against exactly the given q, and no vocabulary-sized eager tensor is
    created with either drafting. A seeded request draws its seed from its generator every step:
    its bonus is ours now, and vLLM's Sampler draws a seeded bonus every step too."""
    sm = sampling_metadata
    num_reqs = len(metadata.num_draft_tokens)
    K = metadata.max_spec_len
    cu_rows = metadata.cu_num_sampled_tokens  # [B] inclusive cumulative sum of k_r + 1
    draft_ids = metadata.draft_token_ids  # [T]
    if sm.all_greedy:
        ids = draft_ids.new_full((logits.shape[0],), PLACEHOLDER_TOKEN_ID)  # [T + B]
        ids[metadata.target_logits_indices] = draft_ids  # the draft rows among the T + B (int32 or int64)
        placeholder = cu_rows.new_full((num_reqs,), PLACEHOLDER_TOKEN_ID)
        out = greedy_verify_ragged(logits.argmax(dim=-1), ids, placeholder, cu_rows, K + 1, logits.shape[1])
        out = out[:, : K + 1]
        return at_least_one_token(out, well_formed_requests(cu_rows, K + 1, logits.shape[0])).to(torch.int32)
    if draft_ids.shape[0] == 0 and _draws_without_drafts(verifier, logits, cu_rows):
        return _draw_plain_step(verifier, logits, sm, K)
    if draft_probs is None and _verifies_point_drafts(verifier, logits, cu_rows, draft_ids, K):
        return _verify_point_drafts(verifier, logits, cu_rows, draft_ids, sm, K)
    backend = getattr(verifier.sampler, "backend", "auto")
    with_q = draft_probs is not None and draft_probs.shape[0] > 0
    # one launch with the kernels: the id each row scores (-1 at bonus rows), with q the draft row
    # each row reads in place (q's row t for the logits row of draft t; -1 at a bonus row: skipped
    # by the kernels), the placeholder bonus ids and the well-formed requests
    ids, index, bonus, ok = step_inputs(cu_rows, draft_ids, logits.shape[0], K + 1, with_q, backend)
    drafts: dict[str, torch.Tensor] = {}
    if draft_probs is not None and index is not None:
        drafts = dict(draft_probs=draft_probs, draft_rows=index)
    temperature = sm.temperature.to(torch.float32)  # [B], 0 for greedy requests
    seeds = row_seeds(num_reqs, logits.device, sm.generators)  # [B] int64
    out = verify_with_bonus_rows(
        verifier, logits, None, ids, cu_rows, K, temperature=temperature, seeds=seeds, bonus_token_ids=bonus, **drafts
    )
    # one launch with the kernels: at least one token per well-formed request, int32
    return chunk_outputs(out, ok, K + 1, backend, torch.int32, counts=False)[0]


#: the references whose token at an out-of-range draft with no accepted draft before it is the
#: recovery race of position 0 over the target row itself (docs/cpu.md): a request without drafts
_RACE_AT_PLACEHOLDER = frozenset({"rejection_reference", "block_reference"})


def _draws_without_drafts(verifier: RaggedVerifier, logits: torch.Tensor, cu_rows: torch.Tensor) -> bool:
    """Whether a V1 plain step without drafts may be drawn by the compiled CPU draw
    (:func:`_draw_plain_step`): rejection sampling or block verification running the base
    class's pipeline with ``backend="auto"`` (not strict, not checking values), CPU fp32 logits
    with numba installed, and request r's only row at row r (cu = 1, 2, ..., B; read on the CPU:
    no synchronisation)."""
    ours = _compiled_cpu_step(verifier.sampler, _RACE_AT_PLACEHOLDER) and logits.shape[0] == cu_rows.shape[0]
    if not ours or cu_rows.device.type != "cpu" or not cpu_draw.available(logits):
        return False
    return bool(torch.equal(cu_rows, torch.arange(1, cu_rows.shape[0] + 1, dtype=cu_rows.dtype)))


def _compiled_cpu_step(sampler: Any, references: frozenset[str]) -> bool:
    """Whether the sampler's op is one of ``references`` (of spec_samplers.reference) run by the
    base class's pipeline with ``backend="auto"``, not strict, not checking values: what a
    compiled V1 step replaces (its tokens and counters are that pipeline's)."""
    op = getattr(type(sampler), "reference_op", None)
    return bool(
        getattr(op, "__name__", "") in references
        and getattr(op, "__module__", "") == "spec_samplers.reference"
        and _base_pipeline(type(sampler))
        and getattr(sampler, "backend", None) == "auto"
        and not (sampler.strict_mode or sampler.check_values)
    )


def _draw_plain_step(verifier: RaggedVerifier, logits: torch.Tensor, sm: Any, K: int) -> torch.Tensor:
    """[B, K+1] int32 (K = 0 without drafts): the tokens and counters of the seam's path
    (:func:`verify_with_bonus_rows`) for a step whose requests have no drafts: each request's only
    draft is the -1 placeholder, so its token is the recovery race of position 0 over
    softmax(logits / T) (the argmax for T = 0), drawn by one compiled pass per request over its
    logits (``spec_samplers.cpu.draw``) instead of the logits' probabilities made with PyTorch
    first."""
    sampler = cast(SpecDecodeBaseSampler, verifier.sampler)
    B = logits.shape[0]
    seeds = row_seeds(B, logits.device, sm.generators)  # [B] int64 (the seam's seeds, in its order)
    tokens = cpu_draw.draw_from_logits(logits, sm.temperature, seeds, None, 0)  # [B] int64, -1: no mass
    out = torch.full((B, 2), PLACEHOLDER_TOKEN_ID, dtype=torch.int64)  # the sampler's [R, 1 + 1] output
    out[:, 0] = tokens
    sampler._update_counters(out, B)  # (as _verify_counted: one row per request)
    tokens = tokens.clamp_(min=0).to(torch.int32)  # at least one token per request (chunk_outputs)
    width = K + 1
    if width == 1:
        return tokens[:, None]
    return torch.nn.functional.pad(tokens[:, None], (0, width - 1), value=PLACEHOLDER_TOKEN_ID)


def _verifies_point_drafts(
    verifier: RaggedVerifier, logits: torch.Tensor, cu_rows: torch.Tensor, draft_ids: torch.Tensor, K: int
) -> bool:
    """Whether a V1 plain step with point-mass drafts (no draft probabilities: n-gram, EAGLE) may
    be verified by the compiled step (:func:`_verify_point_drafts`): a sampler whose reference has
    a compiled step (:data:`_POINT_STEP_KERNELS`: rejection sampling, block verification) running
    the base class's pipeline with ``backend="auto"`` (not strict, not checking values), CPU fp32
    logits with numba installed, and well-formed rows (read on the CPU, no synchronisation):
    every request 1 to K + 1 rows, L rows in all, one draft per row but the B bonus rows."""
    if not _compiled_cpu_step(verifier.sampler, _POINT_STEP_REFERENCES) or not cpu_draw.available(logits):
        return False
    if cu_rows.device.type != "cpu" or draft_ids.device.type != "cpu" or cu_rows.dim() != 1:
        return False
    B, L = cu_rows.shape[0], logits.shape[0]
    if B == 0 or draft_ids.dim() != 1 or draft_ids.shape[0] != L - B or _point_kernels() is None:
        return False
    cu = cu_rows.numpy()
    rows = np.diff(cu, prepend=0)  # k_r + 1
    return bool(cu[-1] == L and rows.min() >= 1 and rows.max() <= K + 1)


#: the references the compiled step with drafts computes (_verifies_point_drafts), each with its
#: kernel in ``cpu._logits_kernels`` (_verify_point_drafts)
_POINT_STEP_KERNELS = {"rejection_reference": "step_rejection_kernel", "block_reference": "step_block_kernel"}
_POINT_STEP_REFERENCES = frozenset(_POINT_STEP_KERNELS)


@functools.cache
def _point_kernels() -> ModuleType | None:
    """``spec_samplers.cpu._logits_kernels`` (numba: imported when the plain step's draw is
    available, ``cpu_draw.available``), or None when it does not import."""
    try:
        return importlib.import_module("spec_samplers.cpu._logits_kernels")
    except (ImportError, OSError):
        return None


def _verify_point_drafts(
    verifier: RaggedVerifier,
    logits: torch.Tensor,  # [L, V] fp32 CPU: request r's k_r draft rows, then its bonus row
    cu_rows: torch.Tensor,  # [B] inclusive cumulative sum of k_r + 1 (well formed)
    draft_ids: torch.Tensor,  # [L - B]
    sm: Any,  # SamplingMetadata of a plain step, not all greedy
    K: int,
) -> torch.Tensor:
    """[B, K+1] int32: the tokens and counters of the seam's path (:func:`verify_with_bonus_rows`
    on the sampler's reference) for a step with point-mass drafts, by one compiled pass per
    request (the reference's kernel in ``cpu._logits_kernels``, :data:`_POINT_STEP_KERNELS`:
    ``step_rejection_kernel``, ``step_block_kernel``): each row's softmax is made from its logits
    only when the verification reads it (rejection sampling: its rows up to the first rejection;
    block verification: its draft rows while a later threshold can pass, and the emitted token's
    row), instead of every row's probabilities made with PyTorch first."""
    sampler = cast(SpecDecodeBaseSampler, verifier.sampler)
    kernel = getattr(_point_kernels(), _POINT_STEP_KERNELS[getattr(type(sampler).reference_op, "__name__", "")])
    B = cu_rows.shape[0]
    seeds = row_seeds(B, logits.device, sm.generators)  # [B] int64 (the seam's seeds, in its order)
    out = torch.empty((B, K + 2), dtype=torch.int64)  # the sampler's [R, (K + 1) + 1] output
    kernel(
        logits.detach().contiguous().numpy(),
        cu_rows.to(torch.int64).numpy(),
        draft_ids.to(torch.int64).numpy(),
        sm.temperature.to(torch.float32).contiguous().numpy(),
        seeds.numpy().view(np.uint64),  # (the kernels' seeds: uint64, two's complement)
        np.zeros(B, dtype=np.uint64),
        out.numpy(),
    )
    sampler._update_counters(out, logits.shape[0])  # (as _verify_counted: the seam's L rows)
    tokens = out[:, : K + 1]
    tokens[:, 0].clamp_(min=0)  # at least one token per request (chunk_outputs)
    return tokens.to(torch.int32)


# --- Model Runner V2: chunks verified in place, plain chunks (RejectionSampler._verify without vLLM's glue)


class ChunkPlan(NamedTuple):
    """What every Model Runner V2 chunk of one shape decides (:func:`chunk_plan`), made on its
    first call: the checks passed (``v2_runner.check_chunk_shapes`` and the in-place batch's), the
    backend of the seam's launches, the sampler's op and whether its kernels count. A warm chunk
    then binds its tensors and launches (:func:`verify_planned_chunk`). It holds no tensor: the
    launches' workspaces stay per stream (``kernels.backend.plan_cache``)."""

    kernels: bool  # chunk_inputs / chunk_outputs launch the bonus-row kernels (else eager ops)
    op: Prepared  # the sampler's op and counting (SpecDecodeBaseSampler._seam_op)
    vocab: int  # the vocabulary verified: the smaller of the target's and the drafter's
    #: (bonus_row_inputs_triton, chunk_outputs_triton) with kernels, imported once here (an
    #: import statement per call costs about a microsecond), else None
    launchers: tuple[Callable[..., Any], Callable[..., Any]] | None


#: a tensor's shape, in C (no Python frame per tensor of a key)
_SHAPE = operator.attrgetter("shape")


def chunk_plan(
    verifier: RaggedVerifier,
    logits: torch.Tensor,  # [L, V]
    draft_logits: torch.Tensor | None,
    draft_sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    num_speculative_steps: int,
    logits_divided: bool,
    rows: tuple[torch.Tensor, ...],  # pos, idx_mapping, expanded_idx_mapping, expanded_local_pos, temperature, seed
) -> tuple[ChunkPlan | None, tuple[Any, ...] | None]:
    """(the chunk's plan or None, its key or None: not kept). The key holds what the checks and
    decisions read: every shape, the dtypes and devices the batch's checks read, the sampler's
    backend and modes; a plan made under another launch config is made again."""
    sampler = verifier.sampler
    if torch.compiler.is_compiling() or not isinstance(sampler, SpecDecodeBaseSampler):
        return None, None
    key = (
        num_speculative_steps, logits_divided, sampler.backend, sampler._strict_mode, sampler._check_values,
        logits.shape, logits.dtype, logits.device, cu_num_logits.shape, cu_num_logits.dtype,
        cu_num_logits.device, draft_sampled.shape, draft_sampled.dtype,
        None if draft_logits is None else (draft_logits.shape, draft_logits.dtype, draft_logits.device),
        *map(_SHAPE, rows),
    )  # fmt: skip
    plan = verifier.chunk_plans.get(key)
    if plan is not None and plan.op.config is not launch_config():
        plan = None  # planned under another launch config (a tool planning for another device)
    return plan, key


def verify_chunk_with_bonus_rows(
    verifier: RaggedVerifier,
    logits: torch.Tensor,  # [L, V]: every row of the chunk, bonus rows included
    draft_logits: torch.Tensor | None,  # [max_num_reqs, S, V'] or None
    draft_sampled: torch.Tensor,  # [L]
    cu_num_logits: torch.Tensor,  # [R+1], as vLLM passes it (checked here)
    pos: torch.Tensor,  # [L]
    idx_mapping: torch.Tensor,  # [R]: request state of each request
    expanded_idx_mapping: torch.Tensor,  # [L]: request state of each row
    expanded_local_pos: torch.Tensor,  # [L]: step of each row within its request
    temperature: torch.Tensor,  # [max_num_reqs]: T per request state (0 = greedy)
    seed: torch.Tensor,  # [max_num_reqs] int64
    num_speculative_steps: int,
    logits_divided: bool,  # the logits arrive divided by T (vLLM's glue ran), or raw
    plan: ChunkPlan | None = None,  # the chunk's shape seen before (chunk_plan)
    key: tuple[Any, ...] | None = None,  # the key to keep this chunk's plan under (chunk_plan)
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sampled [R, S+1] int64, -1 padded; num_sampled [R] int32): the chunk's logits verified in
    place, bonus rows included (:func:`verify_with_bonus_rows`: request r's rows
    [cu[r], cu[r+1]) are one ragged request whose last draft is the -1 placeholder), so the
    tokens follow the same law and the same random stream as ``v2_runner.sample_rows``. The drafter's
    cached logits are read in place too (``draft_rows`` into the cache, ``draft_temperature`` the
    requests' T): no vocabulary-sized tensor is created.

    Around the sampler, one launch each with the kernels and no eager op: before it
    :func:`spec_samplers.bonus_rows.chunk_inputs` (the metadata checks of
    ``v2_runner.chunk_metadata`` and the per-request and per-row inputs: T, seed and counter
    offset by request state, the ids each row scores, the drafter rows), after it
    :func:`spec_samplers.bonus_rows.chunk_outputs` (a malformed request emits nothing, a
    well-formed one at least one token, ``num_sampled``).

    With ``plan`` (a chunk of a shape seen before) the decisions are the plan's: the backend is
    not resolved again, the batch is not checked again, the op is not chosen again."""
    num_logits, vocab = logits.shape
    S = num_speculative_steps
    sampler = verifier.sampler
    backend = getattr(sampler, "backend", "auto")
    # (a plan is made under the current launch config: chunk_plan checked it)
    config = plan.op.config if plan is not None else launch_config()
    kernels = plan.kernels if plan is not None else use_triton(backend, logits.device, config)
    if plan is not None and plan.launchers is not None:
        inputs_triton, outputs_triton = plan.launchers
    elif kernels:
        from spec_samplers.kernels.bonus_row_kernels import bonus_row_inputs_triton as inputs_triton
        from spec_samplers.kernels.bonus_row_kernels import chunk_outputs_triton as outputs_triton
    cache = None
    num_steps = 0
    if draft_logits is not None:
        # The drafter's cache read in place: [max_num_reqs * S', vocab] rows (a view, no copy),
        # row (state, step) at state * S' + step, divided by the request's temperature in the
        # kernels (the target rows arrive divided by vLLM; the drafter's do not). A bonus row's
        # placeholder never reads a drafter row (its step k_r may be past the cached ones): -1
        # there, out of range, so the kernels skip that row.
        num_steps = draft_logits.shape[1]
        cache = draft_logits.reshape(-1, draft_logits.shape[-1])  # [max_num_reqs * S', vocab]
        cache = cache if cache.shape[1] == vocab else cache[:, :vocab]  # (each view costs a few us)
    args = (
        cu_num_logits,
        idx_mapping,
        temperature,
        seed,
        pos,
        draft_sampled,  # the draft scored by row i is draft_sampled[i + 1] (vLLM's int32 or int64)
        expanded_idx_mapping if cache is not None else None,
        expanded_local_pos if cache is not None else None,
        num_logits,
        num_steps,
        S + 1,
    )
    if kernels:
        # the checks and inputs in one launch; its outputs are the seam's workspaces (the
        # sampler's and the tail's launches read them in this call, in stream order)
        made = inputs_triton(*args, config=config, checked=True, workspace=True)
        temp, seeds, offsets, bonus, ids, draft_rows, ok, sign = cast("list[Any]", made)
    else:
        ok, sign, inputs = chunk_inputs_reference(*args, logits_divided=True)
        temp, seeds, offsets, bonus, ids, draft_rows = inputs
    # Logits divided by vLLM: T is 1, or 0 for greedy requests: sign(T) gives both (a negative
    # T gives -1, which the sampler reads as 1). Raw logits (the plain-chunk fast path): each
    # request's own T, divided in the kernels. Greedy requests' T = 0 counts as 1 for draft
    # rows, which they never read anyway.
    target_temperature = sign if logits_divided else temp
    drafts: dict[str, torch.Tensor] = {}
    if cache is not None and draft_rows is not None:
        drafts = dict(draft_rows=draft_rows, draft_temperature=temp)
    cu = cu_num_logits[1:]  # a malformed request's tokens are dropped by chunk_outputs
    batch_args = (logits, bonus, cache, ids, cu, S + 1, target_temperature, seeds, offsets, drafts)
    if plan is None and _in_place_direct(verifier, *batch_args):
        prepared = cast(SpecDecodeBaseSampler, sampler)._seam_op(logits.device, config)
        launchers = (inputs_triton, outputs_triton) if kernels else None
        plan = None if prepared is None else ChunkPlan(kernels, prepared, vocab, launchers)
        if plan is not None and key is not None and not (plan.op.meta or _tracing_fake()):
            if len(verifier.chunk_plans) >= 64:  # (an engine's batch size changes every step: keep it small)
                verifier.chunk_plans.clear()
            verifier.chunk_plans[key] = plan
    if plan is None:  # another sampler, or a check failed: the entry (its checks name the argument)
        out = _verify_in_place(verifier, *batch_args)
    else:  # the sampler's op and counters on the seam's own batch (the end of SpecDecodeBaseSampler._run)
        base_sampler = cast(SpecDecodeBaseSampler, sampler)
        counters = None
        if plan.op.kernel_counts:  # the kernels add to the counters (a scratch buffer on meta tensors)
            scratch = plan.op.meta
            counters = torch.empty(S + 3, dtype=torch.long, device=logits.device) if scratch else None
            counters = base_sampler._counter_slots(S + 1, logits.device) if counters is None else counters
        out = base_sampler._run_prepared(plan.op, _seam_batch(*batch_args, counters=counters))
    # [R, S+2]: at most k_r + 1 <= S + 1 tokens per request
    if kernels:
        tokens, num_sampled = outputs_triton(out, ok, S + 1, config)
    else:
        tokens, num_sampled = chunk_outputs_reference(out, ok, S + 1)
    return tokens, cast(torch.Tensor, num_sampled)  # (counted: counts=True)


def _verify_in_place(
    verifier: RaggedVerifier,
    logits: torch.Tensor,  # [L, V]
    bonus: torch.Tensor,  # [R] int64 (the seam's placeholders)
    cache: torch.Tensor | None,  # [N, V] drafter rows, or None
    ids: torch.Tensor,  # [L] (chunk_inputs' / step_inputs')
    cu: torch.Tensor,  # [R] inclusive cumulative row counts
    max_spec_len: int,
    temperature: torch.Tensor,  # [R] float
    seeds: torch.Tensor,  # [R] int64
    offsets: torch.Tensor | None,  # [R] int64 (chunk_inputs'), or None
    drafts: Mapping[str, torch.Tensor],  # draft_rows [L], draft_temperature [R] (chunk_inputs'), or none
    draft_is_probs: bool = False,  # ``cache`` holds the drafter's probabilities (V1's draft_probs)
) -> torch.Tensor:
    """The tokens of ``verifier.from_logits`` on a seam's rows. For one of our samplers whose
    ragged logits entry is the base class's pipeline, the batch is built here: the seam made the
    ids, placeholders, offsets and drafter rows (chunk_inputs / step_inputs: the kernels' shapes
    and dtypes), so only the shapes and dtypes the entry would check are checked
    (:func:`_in_place_direct`), then the sampler's op and counters run as the entry ends
    (``SpecDecodeBaseSampler._verify_counted``): the entry's argument packing is skipped, not its
    work. Any other sampler, or a check that fails, takes the entry (whose checks then name the
    argument)."""
    args = (logits, bonus, cache, ids, cu, max_spec_len, temperature, seeds, offsets, drafts)
    if not _in_place_direct(verifier, *args, draft_is_probs=draft_is_probs):
        if draft_is_probs:
            drafts = dict(drafts, draft_probs=cast(torch.Tensor, cache))
            cache = None
        return verifier.from_logits(
            logits, bonus, cache, ids, cu, max_spec_len, temperature=temperature, seeds=seeds, offsets=offsets, **drafts
        )
    sampler = cast(SpecDecodeBaseSampler, verifier.sampler)
    counters = sampler._kernel_counters(max_spec_len, logits.device)
    return sampler._verify_counted(_seam_batch(*args, draft_is_probs=draft_is_probs, counters=counters))


def _in_place_direct(
    verifier: RaggedVerifier,
    logits: torch.Tensor,
    bonus: torch.Tensor,
    cache: torch.Tensor | None,
    ids: torch.Tensor,
    cu: torch.Tensor,
    max_spec_len: int,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor | None,
    drafts: Mapping[str, torch.Tensor],
    draft_is_probs: bool = False,
) -> bool:
    """Whether :func:`_verify_in_place`'s arguments (same order) may skip the entry: one of our
    samplers running the base class's pipeline, not checking values, and the shapes, dtypes and
    devices the entry would check in order."""
    sampler = verifier.sampler
    own_pipeline = (
        _base_pipeline(type(sampler))
        and not (sampler.strict_mode or sampler.check_values)
        and (sampler.takes_draft_rows or not drafts)
    )
    device = logits.device
    R = cu.shape[0]
    engine_tensors_ok = (
        logits.dim() == 2
        and logits.dtype in PROBS_DTYPES
        and ids.dtype in ID_DTYPES
        and ids.shape == logits.shape[:1]
        and cu.dim() == 1
        and cu.dtype in ID_DTYPES
        and _per_request_ok(R, device, ids, cu, bonus, temperature, seeds, offsets)
        and temperature.dtype in PROBS_DTYPES
        and seeds.dtype in ID_DTYPES
        and bonus.dtype in ID_DTYPES
        and (offsets is None or offsets.dtype in ID_DTYPES)
        and 0 <= max_spec_len <= MAX_SPEC_LEN
        and (cache is None or (cache.dim() == 2 and cache.dtype in PROBS_DTYPES and cache.device == device))
        and (cache is None or cache.shape[1] == logits.shape[1])
        and device.type != "meta"
        and not torch.compiler.is_compiling()
    )
    return bool(own_pipeline and engine_tensors_ok and isinstance(sampler, SpecDecodeBaseSampler))


def _seam_batch(
    logits: torch.Tensor,
    bonus: torch.Tensor,
    cache: torch.Tensor | None,
    ids: torch.Tensor,
    cu: torch.Tensor,
    max_spec_len: int,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor | None,
    drafts: Mapping[str, torch.Tensor],
    draft_is_probs: bool = False,
    counters: torch.Tensor | None = None,
) -> VerifyBatch:
    """The sampler's :class:`VerifyBatch` of a seam's checked rows (:func:`_in_place_direct`)."""
    return VerifyBatch(
        RowLayout.ragged_from(cu, logits.shape[0], max_spec_len, logits.shape[1]),
        logits,
        cache,
        ids,
        bonus,
        seeds=seeds if seeds.dtype == torch.int64 else seeds.to(torch.int64),  # (as the entry's row_seeds)
        offsets=offsets if offsets is None or offsets.dtype == torch.int64 else offsets.to(torch.int64),
        temperature=temperature,
        draft_rows=drafts.get("draft_rows"),
        draft_temperature=drafts.get("draft_temperature"),
        draft_is_probs=draft_is_probs,
        counters=counters,
    )


#: sampler class -> whether its ragged logits entry is the base class's pipeline (_base_pipeline)
_BASE_PIPELINE: dict[type, bool] = {}


def _base_pipeline(cls: type) -> bool:
    """Whether ``cls`` runs :class:`SpecDecodeBaseSampler`'s pipeline for the ragged logits entry
    (its entry, ``_run`` and ``_prepare`` are the base class's): decided once per class."""
    found = _BASE_PIPELINE.get(cls)
    if found is None:
        base = SpecDecodeBaseSampler
        found = _BASE_PIPELINE[cls] = (
            issubclass(cls, base)
            and getattr(cls, "forward_ragged_from_logits", None)
            is SpecDecodeStochasticBaseSampler.forward_ragged_from_logits
            and getattr(cls, "_run", None) is base._run
            and getattr(cls, "_prepare", None) is base._prepare
        )
    return found


def _per_request_ok(
    R: int,
    device: torch.device,
    ids: torch.Tensor,
    cu: torch.Tensor,
    bonus: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor | None,
) -> bool:
    """Every [R] tensor 1-d of R entries, every tensor on ``device``."""
    per_request = (bonus, temperature, seeds) if offsets is None else (bonus, temperature, seeds, offsets)
    for t in per_request:
        if t.dim() != 1 or t.shape[0] != R or t.device != device:
            return False
    return ids.device == device and cu.device == device


#: the attribute of Model Runner V2's Sampler holding, per request slot, whether the request needs
#: more than its temperature ([max_num_reqs] bool, numpy; True for a slot ``add_request`` has
#: not seen), written by the plugin's wrapper of ``Sampler.add_request`` (``v2_runner.add_request``)
NEEDS_MORE_ATTRIBUTE = "_spec_samplers_needs_more_than_temperature"
#: vLLM's built-in logits processors of Model Runner V2 (module, class): their ``add_request``
#: answers whether they change the request's logits; any other processor may change any row
BUILTIN_PROCESSORS = frozenset(
    {
        ("vllm.v1.worker.gpu.sample.logit_bias", "LogitBiasState"),  # logit bias, allowed tokens, min tokens
        ("vllm.v1.worker.gpu.sample.penalties", "PenaltiesState"),
        ("vllm.v1.worker.gpu.sample.bad_words", "BadWordsState"),
    }
)
_SAMPLER_MODULE = "vllm.v1.worker.gpu.sample.sampler"


@contextlib.contextmanager
def answers_of(components: Sequence[Any]) -> Iterator[dict[int, Any]]:
    """Records what each component's ``add_request`` returns while the block runs ({id: answer});
    a component whose method cannot be shadowed (no instance dict) gives no answer."""
    answers: dict[int, Any] = {}
    shadowed = []
    for component in components:
        method = component.add_request

        def recorded(req_idx: int, sampling_params: Any, _method: Any = method, _key: int = id(component)) -> Any:
            answers[_key] = answer = _method(req_idx, sampling_params)
            return answer

        own = vars(component).get("add_request") if hasattr(component, "__dict__") else None
        try:
            component.add_request = recorded
        except (AttributeError, TypeError):
            continue
        shadowed.append((component, own))
    try:
        yield answers
    finally:
        for component, own in shadowed:
            if own is None:
                del component.add_request
            else:
                component.add_request = own


def needs_more_than_temperature(
    sampler: Any, req_idx: int, components: Sequence[Any], answers: Mapping[int, Any]
) -> bool:
    """Whether the request in slot ``req_idx`` needs more than its temperature (conservative:
    anything unknown counts)."""
    thinking, *processors = components
    if thinking is None or answers.get(id(thinking), True):
        return True
    for processor in processors:
        builtin = (type(processor).__module__, type(processor).__name__) in BUILTIN_PROCESSORS
        if not builtin or answers.get(id(processor), True):
            return True
    states = sampler.sampling_states  # vLLM's rule (SamplingStates.add_request) without temperature
    if states.temperature.np[req_idx] == 0.0:
        return False
    filters = (states.min_p.np[req_idx] != 0.0, states.top_k.np[req_idx] != states.vocab_size)
    return bool(any(filters) or states.top_p.np[req_idx] != 1.0)


def plain_chunk(
    rejection_sampler: Any,  # Model Runner V2's RejectionSampler
    verifier: RaggedVerifier,
    logits: torch.Tensor,  # [L, V] the chunk's logits, raw
    idx_mapping_np: np.ndarray,  # [R] request slots of the chunk (host)
) -> bool:
    """Whether the chunk needs nothing but each request's temperature, so that
    ``v2_runner.verify_plain_chunk`` gives what vLLM's glue and our seam give: every request's
    :data:`NEEDS_MORE_ATTRIBUTE` flag down (no min-p, top-k, top-p, logit bias, allowed tokens,
    min tokens, penalties, bad words, thinking budget, other logits processor); no sampling mask;
    no processed logprobs for a request of the chunk; none of vLLM's own schemes (synthetic,
    block verification, FLy, watermarking); vLLM's own ``apply_sampling_params`` (a subclass's
    may do more); a sampler that verifies bonus rows in place. Host state only: no device work."""
    sampler: Any = getattr(rejection_sampler, "sampler", None)
    flags = getattr(sampler, NEEDS_MORE_ATTRIBUTE, None)
    vllm_sampler = getattr(sys.modules.get(_SAMPLER_MODULE), "Sampler", None)
    if flags is None or vllm_sampler is None or logits.dim() != 2:
        return False
    if vllm_scheme(rejection_sampler):
        return False
    glue_is_vllms = getattr(type(sampler), "apply_sampling_params", None) is vllm_sampler.apply_sampling_params
    if not glue_is_vllms or getattr(sampler, "return_sampling_mask", False):
        return False
    if bool(flags[idx_mapping_np].any()):
        return False
    if _processed_logprobs(sampler) and sampler.sampling_states.max_num_logprobs(idx_mapping_np) >= 0:
        return False  # vLLM computes logprobs from the processed logits (NO_LOGPROBS is -1)
    return verifier.has_logits_entry and bonus_row_verifiable(verifier.sampler)


def vllm_scheme(rejection_sampler: Any) -> bool:
    """Whether Model Runner V2's RejectionSampler uses one of vLLM's own verification schemes
    (synthetic mode, block verification, FLy, watermarking): the attributes from which vLLM
    passes the seam the arguments that ``v2_runner._vllm_only`` hands back to vLLM (an attribute
    missing in this vLLM version: the scheme is absent)."""
    rs = rejection_sampler
    return (
        getattr(rs, "synthetic_conditional_rates", None) is not None
        or bool(getattr(rs, "use_block_verification", False))
        or getattr(rs, "fly_window_size", 0) > 0
        or getattr(rs, "watermark_key", None) is not None  # a watermark key: vLLM passes contexts
    )


def _processed_logprobs(sampler: Any) -> bool:
    from vllm.config.model import PROCESSED_LOGPROBS_MODES

    return sampler.logprobs_mode in PROCESSED_LOGPROBS_MODES
