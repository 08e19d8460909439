"""Seam in vLLM's Model Runner V2 (the default in 0.32 and 0.33): the name ``rejection_sample`` in
``vllm.v1.worker.gpu.spec_decode.rejection_sampler`` (imported there from
``rejection_sampler_utils``).

``RejectionSampler._verify_in_chunks`` cuts the batch into chunks of whole requests (at most 1 GB
of fp32 logits each) and calls ``_verify`` per chunk, which applies the logits processors,
penalties, temperature, min-p, top-k and top-p (``Sampler.apply_sampling_params``) and calls this
function with the chunk's processed logits, chunk-relative ``cu_num_logits`` and the global
``draft_logits`` / ``temperature`` / ``seed`` (indexed by request state); the caller computes
logprobs from the processed logits, the accepted/rejected counts, the metrics and the async
output. Replacing only this function keeps all of that vLLM's, and every call is
self-contained, so chunking needs nothing here. In 0.33 drafts that structured output forbids
arrive as -1 (``invalid_drafts``), like the P/D placeholder.

Drafting (``speculative_config.draft_sample_method``): "greedy" drafts are the drafter's argmax,
a point mass, and vLLM passes ``draft_logits=None``, so the sampler gets point-mass drafts;
"probabilistic" drafts are samples of softmax(draft logits / T), whose pre-temperature logits
vLLM caches per request state and step and passes as ``draft_logits``: the sampler verifies
against p = softmax(draft_logits / T), as vLLM's own kernel does.

Layout (one request r = logits rows [cu[r], cu[r+1])): rows cu[r] .. cu[r+1]-2 score the n_r
drafts, the last row is the bonus position; the draft scored by row i is ``draft_sampled[i + 1]``;
``draft_logits`` [max_num_reqs, S, V'] holds the drafter's logits before temperature, indexed by
request state and step. In this runner the bonus token is drawn inside the verification step, so
we draw it too, from the same processed logits.

How the bonus is drawn. Rejection sampling and block verification (not in strict mode) verify the
chunk's logits in place, bonus rows included: request r is one ragged request of k_r + 1 rows
whose last draft is the -1 placeholder, always rejected, so the token there is a sample of the
bonus row (its argmax for a greedy request) by the recovery race of position k_r, drawn in the
sampler's kernels. No row is copied and no softmax or race runs eagerly, and the drafter's
cached logits are read in place (the entry's ``draft_rows`` = state * S + step into the cache
viewed as [max_num_reqs * S, V'] rows, ``draft_temperature`` = the requests' T): no
vocabulary-sized eager tensor per call, with either drafting (tests/test_profile.py). Other
samplers (typical acceptance recovers the argmax, not a sample; a third-party sampler may refuse
-1 ids) get the draft rows copied out and the bonus drawn eagerly by :func:`sample_rows`. Both
draw the bonus from the same stream, the recovery stream at (request seed, offset = position of
the request's first row, position k_r), so they give the same tokens
(tests/test_vllm_v2_runner.py compares them).

Semantics kept from vLLM: a -1 placeholder draft is rejected and replaced by a sample of the
target row; greedy requests (temperature 0) are verified against the target argmax
and their bonus token is the argmax; every draw is a function of the request's seed (vLLM's
per-request seed, user-given or random) and the sequence position, so a seeded request
reproduces; vocabularies of different size are cut to the smaller one, as vLLM does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
import torch

from spec_samplers import rng
from spec_samplers.bonus_rows import chunk_outputs_reference, well_formed_chunk
from spec_samplers.constants import input_error
from spec_samplers.engine_seam import replace_engine_function
from spec_samplers.integrations.vllm.fast_path import (
    NEEDS_MORE_ATTRIBUTE,
    answers_of,
    bonus_row_verifiable,
    chunk_plan,
    needs_more_than_temperature,
    plain_chunk,
    verify_chunk_with_bonus_rows,
)
from spec_samplers.integrations.vllm.ragged import (
    VERIFIER_ATTRIBUTE,
    RaggedVerifier,
    greedy_verify_ragged,
    seam_verifier,
)
from spec_samplers.output import PLACEHOLDER_TOKEN_ID

_SEAM_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"


def make_rejection_sample(
    sampler: torch.nn.Module, vllm_rejection_sample: Callable[..., tuple[torch.Tensor, torch.Tensor]]
):
    """A drop-in for Model Runner V2's ``rejection_sample`` (:func:`verify`'s signature after
    ``verifier``) that verifies with ``sampler``.

    vLLM's synthetic mode, block verification, FLy (0.33) and watermarking are vLLM's own
    verification schemes, so calls that use them go to vLLM's function with the arguments as given
    (the engine config refuses each of them together with our section, so such calls only come
    from code that bypasses it).
    """
    verifier = RaggedVerifier(sampler)
    replacement = replace_engine_function(sampler, verifier, verify, vllm_rejection_sample, _vllm_only)
    setattr(replacement, VERIFIER_ATTRIBUTE, verifier)  # what verify_chunk reads
    return replacement


def _vllm_only(arguments: Mapping[str, Any]) -> bool:
    """vLLM's own schemes (synthetic mode, block verification, contexts, FLy): calls that stay vLLM's."""
    a = arguments
    vllm_scheme = a.get("synthetic_conditional_rates") is not None or a.get("use_block_verification")
    return bool(vllm_scheme) or a.get("contexts") is not None or a.get("fly_window_size", 0) > 0


def sample_rows(
    probs: torch.Tensor,  # [R, V] fp32
    seeds: torch.Tensor,  # [R] int64
    offsets: torch.Tensor,  # [R] int64
    positions: torch.Tensor,  # [R] int64
) -> torch.Tensor:
    """[R] int64: one sample per row by an exponential race on the counter-based generator's
    recovery stream at ``positions`` (what the samplers draw for a bonus row, docs/design.md section 4)."""
    return rng.recovery_race(probs, seeds, offsets, positions)


def _drafter_rows(
    draft_logits: torch.Tensor,  # [max_num_reqs, S', V'] the drafter's cached logits, before temperature
    rows_state: torch.Tensor,  # [N] int64 request state of each row
    rows_step: torch.Tensor,  # [N] int64 step of each row, < S'
    temperature: torch.Tensor,  # [max_num_reqs]
    vocab: int,
) -> torch.Tensor:
    """[N, vocab] fp32 drafter logits of the rows divided by their request's temperature (1 for
    greedy requests): vLLM's target logits arrive divided by T, the drafter's do not. Two
    vocabulary-sized tensors (the gather, then the fp32 quotient in one op: no separate cast)."""
    row_temp = temperature[rows_state].to(torch.float32)  # [N]
    gathered = draft_logits[rows_state, rows_step, :vocab]  # [N, vocab], the cache's dtype
    return torch.div(gathered, torch.where(row_temp == 0, 1.0, row_temp)[:, None]).to(torch.float32)


def verify(
    verifier: RaggedVerifier,
    target_logits: torch.Tensor,  # [L, V]
    draft_logits: torch.Tensor | None,  # [max_num_reqs, S, V'] or None
    draft_sampled: torch.Tensor,  # [L]
    cu_num_logits: torch.Tensor,  # [R+1]
    pos: torch.Tensor,  # [L]
    idx_mapping: torch.Tensor,  # [R]
    expanded_idx_mapping: torch.Tensor,  # [L]
    expanded_local_pos: torch.Tensor,  # [L]
    temperature: torch.Tensor,  # [max_num_reqs]
    seed: torch.Tensor,  # [max_num_reqs] int64
    num_speculative_steps: int,
    # vLLM's own schemes, never set here (make_rejection_sample hands those calls to vLLM):
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_fp64: bool = False,
    use_block_verification: bool = False,
    contexts: torch.Tensor | None = None,
    watermarking: torch.Tensor | None = None,
    watermarking_skip_mask: torch.Tensor | None = None,
    watermark_key: int | None = None,
    fly_window_size: int = 0,  # vLLM 0.33
    fly_entropy_threshold: float = 0.3,  # vLLM 0.33
    fly_entropy_top_k: int = 3,  # vLLM 0.33
    *,
    logits_divided: bool = True,  # ours, never passed by vLLM (see below)
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sampled [R, S+1] int64, -1 padded; num_sampled [R] int32).

    ``logits_divided``: whether ``target_logits`` arrive divided by each request's temperature
    (vLLM's ``apply_sampling_params`` ran: what vLLM passes) or raw (the plain-chunk fast path,
    :func:`verify_chunk`): then the bonus-row path divides in the kernels, the eager paths once
    here."""
    chunk_rows = (pos, idx_mapping, expanded_idx_mapping, expanded_local_pos, temperature, seed)
    args = (draft_logits, draft_sampled, cu_num_logits, num_speculative_steps, logits_divided, chunk_rows)
    plan, key = chunk_plan(verifier, target_logits, *args)
    if plan is not None:  # a shape seen before: checked then, its decisions kept
        logits = target_logits if plan.vocab == target_logits.shape[1] else target_logits[:, : plan.vocab]
        return verify_chunk_with_bonus_rows(
            verifier, logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
            expanded_local_pos, temperature, seed, num_speculative_steps, logits_divided, plan,
        )  # fmt: skip
    num_logits = target_logits.shape[0]
    num_reqs = cu_num_logits.shape[0] - 1
    device = target_logits.device
    per_row = dict(pos=pos, draft_sampled=draft_sampled, expanded_idx_mapping=expanded_idx_mapping)
    check_chunk_shapes(
        cu_num_logits, idx_mapping, temperature, seed, num_logits, expanded_local_pos=expanded_local_pos, **per_row
    )
    if num_logits == 0 or num_reqs == 0:  # nothing to verify, no request well formed (shapes: no device read)
        none = torch.full((num_reqs, num_speculative_steps + 1), PLACEHOLDER_TOKEN_ID, device=device)
        return none, torch.zeros(num_reqs, dtype=torch.int32, device=device)
    vocab = target_logits.shape[1] if draft_logits is None else min(target_logits.shape[1], draft_logits.shape[-1])
    logits = target_logits if vocab == target_logits.shape[1] else target_logits[:, :vocab]  # a view: no copy
    if verifier.has_logits_entry and bonus_row_verifiable(verifier.sampler):
        # the checks, the bonus rows' inputs and the tail: one launch each with the kernels
        return verify_chunk_with_bonus_rows(
            verifier, logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
            expanded_local_pos, temperature, seed, num_speculative_steps, logits_divided, key=key,
        )  # fmt: skip
    ok, cu_num_logits, idx_mapping = chunk_metadata(
        cu_num_logits, idx_mapping, temperature, seed, num_logits, num_speculative_steps
    )
    cu = cu_num_logits.to(torch.int64)
    bonus_rows = cu[1:] - 1  # [R]
    req_state = idx_mapping  # [R] int32 or int64: either indexes
    temp = temperature[req_state].to(torch.float32)  # [R]
    seeds = seed[req_state].to(torch.int64)  # [R]
    offsets = pos[cu[:-1].clamp(max=num_logits - 1)].to(torch.int64)  # [R]: position of its first row
    # this path lays the draft rows out assuming every request well formed: one malformed request
    # and the chunk emits nothing (never a token read from another request's rows)
    ok = ok & ok.all()

    is_greedy = temp == 0  # [R]
    if not logits_divided:  # what vLLM's temperature kernel does: fp32 quotient, greedy rows by 1
        rows = torch.arange(num_logits, device=device)
        row_temp = temp.masked_fill(is_greedy, 1.0)[torch.searchsorted(cu[1:], rows, right=True)]  # [L]
        logits = torch.div(logits, row_temp[:, None])

    num_draft_rows = max(num_logits - num_reqs, 0)  # T, known from shapes: no host sync
    num_draft = cu[1:] - cu[:-1] - 1  # [R]
    cu_draft = torch.cumsum(num_draft, dim=0)  # [R], inclusive
    flat = torch.arange(num_draft_rows, device=device, dtype=torch.int64)  # [T]
    req_of_row = torch.searchsorted(cu_draft, flat, right=True)  # [T]
    # [T]: request r's rows are shifted by its r earlier bonus rows (clamped: malformed metadata
    # must not index past the rows; its output is masked)
    draft_rows = (flat + req_of_row).clamp(0, max(num_logits - 2, 0))
    draft_ids = draft_sampled[draft_rows + 1]  # [T]

    bonus_logits = logits[bonus_rows]  # [R, V]
    bonus_probs = bonus_logits.softmax(dim=-1, dtype=torch.float32)  # [R, V]
    bonus_argmax = bonus_logits.argmax(dim=-1)  # [R]
    bonus = torch.where(is_greedy, bonus_argmax, sample_rows(bonus_probs, seeds, offsets, num_draft))  # [R]

    target_rows = logits[draft_rows]  # [T, V]: the requests' rows back to back (the ragged layout)
    draft_rows_logits = None
    if draft_logits is not None:
        rows_state = expanded_idx_mapping[draft_rows].to(torch.int64)  # [T]
        rows_step = expanded_local_pos[draft_rows].to(torch.int64)  # [T]
        draft_rows_logits = _drafter_rows(draft_logits, rows_state, rows_step, temperature, vocab)
        # A -1 placeholder draft (P/D first step, invalid structured-output draft) was never drawn
        # from p: vLLM resamples it from q, and so do our samplers for any out-of-range draft id.
    if verifier.has_logits_entry:
        # One call verifies every request from the logits (greedy ones, T = 0, by the argmax, as
        # vLLM): no probability tensor, no second verification of the greedy rows.
        ones = torch.ones_like(temp)
        out = verifier.from_logits(
            target_rows,
            bonus,
            draft_rows_logits,
            draft_ids,
            cu_draft,
            num_speculative_steps,
            temperature=torch.where(is_greedy, 0.0, ones),
            seeds=seeds,
            offsets=offsets,
        )
    else:
        out = verifier(
            target_rows.softmax(dim=-1, dtype=torch.float32),
            bonus,
            None if draft_rows_logits is None else draft_rows_logits.softmax(dim=-1),
            draft_ids,
            cu_draft,
            num_speculative_steps,
            seeds=seeds,
            offsets=offsets,
        )
        greedy = greedy_verify_ragged(
            target_rows.argmax(dim=-1), draft_ids, bonus, cu_draft, num_speculative_steps, vocab
        )
        out = torch.where(is_greedy[:, None], greedy, out)  # [R, S+1] int64
    return _with_counts(out, ok)


def check_chunk_shapes(
    cu_num_logits: torch.Tensor,  # [R+1]
    idx_mapping: torch.Tensor,  # [R]
    temperature: torch.Tensor,  # [max_num_reqs]
    seed: torch.Tensor,  # [max_num_reqs]
    num_logits: int,  # L
    **rows: torch.Tensor,  # pos, draft_sampled, expanded_*: [L'] with L' >= L
) -> None:
    """The chunk's shapes, checked on the host (a clear error naming the argument); its values
    are checked on the device (:func:`spec_samplers.bonus_rows.well_formed_chunk`)."""
    if cu_num_logits.dim() != 1 or cu_num_logits.shape[0] < 1:
        raise input_error("cu_num_logits", "a [R+1] int tensor", f"shape {tuple(cu_num_logits.shape)}")
    num_reqs = cu_num_logits.shape[0] - 1
    if tuple(idx_mapping.shape) != (num_reqs,):
        shape = tuple(idx_mapping.shape)
        raise input_error("idx_mapping", f"shape ({num_reqs},) (one state per request)", f"shape {shape}")
    if temperature.dim() != 1 or tuple(seed.shape) != tuple(temperature.shape):
        raise input_error("seed", f"shape {tuple(temperature.shape)} (as temperature)", f"shape {tuple(seed.shape)}")
    for name, t in rows.items():
        if t.dim() != 1 or t.shape[0] < num_logits:
            expected = f"a 1-d tensor of at least {num_logits} entries (one per logits row)"
            raise input_error(name, expected, f"shape {tuple(t.shape)}")


def chunk_metadata(
    cu_num_logits: torch.Tensor,  # [R+1]
    idx_mapping: torch.Tensor,  # [R]
    temperature: torch.Tensor,  # [max_num_reqs]
    seed: torch.Tensor,  # [max_num_reqs]
    num_logits: int,  # L
    num_speculative_steps: int,  # S: a request has at most S + 1 rows
    **rows: torch.Tensor,  # pos, draft_sampled, expanded_*: [L'] with L' >= L
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ok [R] bool, cu [R+1] int64 in [0, L], idx_mapping [R] in [0, max_num_reqs)): the chunk's
    metadata made safe to index with, once, at the seam's edge, for the eager paths (the
    bonus-row path checks in its kernel: :func:`spec_samplers.bonus_rows.chunk_inputs`). Shapes
    are checked on the host (:func:`check_chunk_shapes`); values on the device, without a host
    read (:func:`spec_samplers.bonus_rows.well_formed_chunk`). A malformed request
    (non-monotone or out-of-range ``cu_num_logits``, a missing bonus row, an unknown state) emits
    no token; the others are verified as usual (docs/contract.md, "Robustness")."""
    check_chunk_shapes(cu_num_logits, idx_mapping, temperature, seed, num_logits, **rows)
    ok = well_formed_chunk(cu_num_logits, idx_mapping, temperature.shape[0], num_logits, num_speculative_steps + 1)
    return ok, cu_num_logits.to(torch.int64).clamp(0, num_logits), torch.where(ok, idx_mapping, 0)


def _with_counts(out: torch.Tensor, ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [R, S+1] int64, num_sampled [R] int32: its tokens that are not -1); a well-formed
    (``ok``) request whose first row has no mass gets token 0 there (vLLM's contract); a
    malformed one emits nothing (:func:`spec_samplers.bonus_rows.chunk_outputs_reference`)."""
    tokens, num_sampled = chunk_outputs_reference(out, ok, out.shape[1])
    return tokens, cast(torch.Tensor, num_sampled)  # (counted: counts=True)


# --- the fast path's wraps: plain chunks (fast_path.py) -----------------------------------------


def add_request(vllm_add_request: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps Model Runner V2's ``Sampler.add_request(req_idx, sampling_params)``: vLLM's method,
    then our flag for the slot (``fast_path.NEEDS_MORE_ATTRIBUTE``): whether the request needs anything
    but its temperature. vLLM's own flag (``needs_logits_processing``) counts a temperature other
    than 0 and 1 too, so ours is read from the same sources: the answers of the thinking budget's
    and each logits processor's ``add_request`` during vLLM's call (recorded, not asked again:
    they have side effects), and min-p / top-k / top-p from the sampling states as vLLM's rule
    reads them (none of them matters to a greedy request). Host work once per request, none per
    step; nothing without our sampler at the seam (vLLM builds the RejectionSampler, where the
    plugin installs it, before it adds any request)."""

    @functools.wraps(vllm_add_request)
    def _add_request(self: Any, req_idx: int, sampling_params: Any) -> Any:
        flags = getattr(self, NEEDS_MORE_ATTRIBUTE, None)
        if flags is not None:  # the slot's new occupant needs more until shown otherwise
            flags[req_idx] = True
        if seam_verifier(_SEAM_MODULE) is None:  # our sampler is not installed: vLLM's method only
            return vllm_add_request(self, req_idx, sampling_params)
        components = [getattr(self, "thinking_budget_state", None), *getattr(self, "logits_processors", ())]
        with answers_of([c for c in components if c is not None]) as answers:
            result = vllm_add_request(self, req_idx, sampling_params)
        if flags is None:
            num_slots = getattr(getattr(self, "sampling_states", None), "max_num_reqs", None)
            if num_slots is None:  # a Sampler laid out otherwise: no flags, no fast path
                return result
            flags = np.ones(num_slots, dtype=bool)
            setattr(self, NEEDS_MORE_ATTRIBUTE, flags)
        try:
            flags[req_idx] = needs_more_than_temperature(self, req_idx, components, answers)
        except AttributeError:  # sampling states laid out otherwise: the request stays vLLM's
            flags[req_idx] = True
        return result

    return _add_request


#: the tensors of ``_verify``'s arguments after ``logits`` that :func:`verify_plain_chunk` reads
CHUNK_ARGUMENTS = (
    "draft_logits",
    "draft_sampled",
    "pos",
    "cu_num_logits",
    "idx_mapping",
    "expanded_idx_mapping",
    "expanded_local_pos",
)


def verify_chunk(vllm_verify: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps Model Runner V2's ``RejectionSampler._verify`` (one chunk of whole requests, called by
    ``_verify_in_chunks``). With our sampler installed at the seam and a plain chunk
    (:func:`~spec_samplers.integrations.vllm.fast_path.plain_chunk`), the chunk is
    :func:`verify_plain_chunk`: vLLM's glue
    (``Sampler.apply_sampling_params``: the chunk's logits copied to fp32, divided by the
    temperatures) is skipped and the raw logits are verified in place. Anything else is vLLM's
    ``_verify``, which calls our ``rejection_sample`` (or vLLM's, without our section)."""
    module_name = vllm_verify.__module__  # the seam's module
    signature = inspect.signature(vllm_verify)

    @functools.wraps(vllm_verify)
    def _verify(self: Any, *args: Any, **kwargs: Any) -> Any:
        verifier = seam_verifier(module_name)
        if verifier is not None:
            call = signature.bind(self, *args, **kwargs).arguments
            known = all(name in call for name in ("logits", "idx_mapping_np", *CHUNK_ARGUMENTS))
            if known and plain_chunk(self, verifier, call["logits"], call["idx_mapping_np"]):
                return verify_plain_chunk(self, verifier, **{k: v for k, v in call.items() if k != "self"})
        return vllm_verify(self, *args, **kwargs)

    return _verify


def verify_plain_chunk(
    rejection_sampler: Any,  # Model Runner V2's RejectionSampler
    verifier: RaggedVerifier,
    logits: torch.Tensor,  # [L, V] the chunk's raw logits (the model's dtype)
    draft_logits: torch.Tensor | None,  # [max_num_reqs, S, V'] or None
    draft_sampled: torch.Tensor,  # [L]
    pos: torch.Tensor,  # [L]
    cu_num_logits: torch.Tensor,  # [R+1] chunk-relative
    idx_mapping: torch.Tensor,  # [R]
    expanded_idx_mapping: torch.Tensor,  # [L]
    expanded_local_pos: torch.Tensor,  # [L]
    verify_draft_sampled: torch.Tensor | None = None,  # [L] (vLLM 0.33: invalid drafts -1)
    **unused: Any,  # idx_mapping_np, seq_lens_upper_bound_np: read by vLLM's glue only
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_verify``'s triple (processed_logits, sampled [R, S+1] int64, num_sampled [R] int32) for a
    plain chunk (``fast_path.plain_chunk``): the raw logits verified in place, bonus rows included, each
    request at its own temperature in the kernels (0: greedy, the argmax); the drafter's cached
    logits read in place too. No vocabulary-sized tensor is created.

    The raw logits are returned as ``processed_logits``, which is what vLLM's own
    ``apply_sampling_params`` returns for a chunk that needs no processing. ``_verify_in_chunks``
    reads it for two things only: logprobs, from it when ``logprobs_mode`` is a processed mode
    (otherwise from the raw logits anyway), and the sampling mask (``return_sampling_mask``);
    ``fast_path.plain_chunk`` sends both cases to vLLM (processed logprobs: when a request of the chunk
    asks for logprobs; rows of requests that do not ask are never returned to them)."""
    states = rejection_sampler.sampler.sampling_states
    sampled, num_sampled = verify(
        verifier,
        logits,
        draft_logits,
        draft_sampled if verify_draft_sampled is None else verify_draft_sampled,
        cu_num_logits,
        pos,
        idx_mapping,
        expanded_idx_mapping,
        expanded_local_pos,
        states.temperature.gpu,
        states.seeds.gpu,
        rejection_sampler.num_speculative_steps,
        logits_divided=False,
    )
    return logits, sampled, num_sampled
