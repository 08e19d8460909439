"""Seam in vLLM's V1 model runner: ``vllm.v1.sample.rejection_sampler.rejection_sample``.

``RejectionSampler.forward`` samples the bonus tokens with vLLM's own sampler, applies penalties,
bad words, logits processors, temperature, top-k and top-p to the target logits, then calls this
function, then computes logprobs from its output; the runner parses the output and counts the
metrics. Replacing only this function keeps all of that vLLM's.

Semantics kept from vLLM: greedy requests (temperature 0) are verified against the argmax of the
target logits; requests with their own ``torch.Generator`` (a per-request seed) draw their
randomness from it, and only when they have drafts (vLLM's rule), so re-seeding reproduces them;
the others draw from torch's default generator. Output [B, K+1] int32, -1 padded; every request
gets at least one token in the vocabulary (``ragged.at_least_one_token``: a first row without
probability mass, all NaN logits, gives token 0, as vLLM's own verification does).

Plain steps skip vLLM's glue (:func:`forward`, a wrapper of ``RejectionSampler.forward`` that
the plugin installs): when the batch needs nothing but temperature, the model's [T + B, V]
logits are verified in place, bonus rows included, and the bonus token is drawn in our kernels
instead of by vLLM's Sampler: no vocabulary-sized eager tensor per step, with point-mass drafts
or draft probabilities (read in place by index).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from spec_samplers.engine_seam import replace_engine_function
from spec_samplers.errors import input_error
from spec_samplers.integrations.vllm.ragged import (
    VERIFIER_ATTRIBUTE,
    RaggedVerifier,
    at_least_one_token,
    bonus_row_verifiable,
    greedy_verify_ragged,
    seam_verifier,
    verify_with_bonus_rows,
    well_formed_requests,
)
from spec_samplers.output import PLACEHOLDER_TOKEN_ID
from spec_samplers.seeding import row_seeds


def make_rejection_sample(sampler: torch.nn.Module, vllm_rejection_sample: Callable[..., torch.Tensor]):
    """A drop-in for vLLM's ``rejection_sample`` (0.32 and 0.33 signatures: :func:`verify`'s
    after ``verifier``) that verifies with ``sampler``.

    vLLM's synthetic mode (a benchmarking mode that ignores the distributions) and, in 0.33, FLy
    (lossy deferred acceptance, ``fly_window_size``) stay vLLM's: such calls go to vLLM's function
    with the arguments as given. The engine config refuses both with our section, so these calls
    only come from code that bypasses it.
    """
    verifier = RaggedVerifier(sampler)
    replacement = replace_engine_function(sampler, verifier, verify, vllm_rejection_sample, _vllm_only)
    setattr(replacement, VERIFIER_ATTRIBUTE, verifier)
    return replacement


def _vllm_only(arguments: Mapping[str, Any]) -> bool:
    """vLLM's synthetic mode and FLy: calls that stay vLLM's."""
    return bool(arguments.get("synthetic_mode")) or arguments.get("fly_window_size") is not None


def verify(
    verifier: RaggedVerifier,
    draft_token_ids: torch.Tensor,  # [T]
    num_draft_tokens: list[int],  # [B]
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,  # [B]
    draft_probs: torch.Tensor | None,  # [T, V] or None
    target_logits: torch.Tensor,  # [T, V] fp32, temperature/top-k/top-p applied
    bonus_token_ids: torch.Tensor,  # [B, 1], sampled by vLLM
    sampling_metadata: Any,  # vllm.v1.sample.metadata.SamplingMetadata
    # vLLM's own modes, never set here (make_rejection_sample hands those calls to vLLM):
    synthetic_mode: bool = False,
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_fp64_gumbel: bool = False,
    fly_window_size: int | None = None,  # vLLM 0.33
    fly_entropy_threshold: float | None = None,  # vLLM 0.33
    fly_entropy_top_k: int = 3,  # vLLM 0.33
) -> torch.Tensor:
    """[B, K+1] int32: greedy rows by vLLM's rule, the others by the sampler.

    Our samplers get vLLM's processed logits as they are (``forward_ragged_from_logits`` at
    temperature 1, 0 for greedy requests: vLLM has already divided by each request's temperature
    and masked its top-k / top-p) and verify every request in one call, greedy ones by the argmax
    of the logits as vLLM does; no probability tensor is built. A sampler without that entry, or a
    step with draft probabilities (the drafts' law comes as probabilities), gets vLLM's fp32
    softmax, and vLLM's greedy verification replaces its greedy rows."""
    batch_size = len(num_draft_tokens)
    if cu_num_draft_tokens.dim() != 1 or cu_num_draft_tokens.shape[0] != batch_size:
        raise input_error(
            "cu_num_draft_tokens",
            f"shape ({batch_size},), one entry per num_draft_tokens entry",
            f"shape {tuple(cu_num_draft_tokens.shape)}",
        )
    device, vocab = target_logits.device, target_logits.shape[-1]
    bonus = bonus_token_ids.reshape(-1)  # [B]
    if sampling_metadata.all_greedy:
        greedy = greedy_verify_ragged(
            target_logits.argmax(dim=-1), draft_token_ids, bonus, cu_num_draft_tokens, max_spec_len, vocab
        )
        return greedy.to(torch.int32)
    is_greedy = None if sampling_metadata.all_random else sampling_metadata.temperature == 0  # [B]
    well_formed = well_formed_requests(cu_num_draft_tokens, max_spec_len, target_logits.shape[0])  # [B]
    # vLLM draws nothing from a request's generator in a step without drafts.
    generators = {i: g for i, g in sampling_metadata.generators.items() if num_draft_tokens[i] > 0}
    if draft_probs is None and verifier.has_logits_entry:
        ones = torch.ones(batch_size, dtype=torch.float32, device=device)
        temperature = ones if is_greedy is None else torch.where(is_greedy, 0.0, ones)
        out = verifier.from_logits(
            target_logits,
            bonus,
            None,
            draft_token_ids,
            cu_num_draft_tokens,
            max_spec_len,
            temperature=temperature,
            seeds=row_seeds(batch_size, device, generators),
        )
        return at_least_one_token(out, well_formed).to(torch.int32)
    seeds = row_seeds(batch_size, device, generators) if verifier.accepts("seeds") else None  # [B] int64
    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)  # [T, V]
    out = verifier(
        target_probs,
        bonus,
        draft_probs,
        draft_token_ids,
        cu_num_draft_tokens,
        max_spec_len,
        seeds=seeds,
        seeded_seqs=generators,
    )
    if is_greedy is not None:
        greedy = greedy_verify_ragged(
            target_logits.argmax(dim=-1), draft_token_ids, bonus, cu_num_draft_tokens, max_spec_len, vocab
        )
        out = torch.where(is_greedy[:, None], greedy, out)
    return at_least_one_token(out, well_formed).to(torch.int32)


# --- plain steps: RejectionSampler.forward without vLLM's glue (issue 19) ------------------------


def forward(vllm_forward: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps V1's ``RejectionSampler.forward(metadata, draft_probs, logits, sampling_metadata)``.

    With our sampler installed at the seam (its ``rejection_sample`` carries the verifier) and a
    plain step (:func:`plain_step`), the step is :func:`verify_plain_step`: vLLM's glue (the
    gather of the target rows, their fp32 copy and clone, the division by temperature) and its
    bonus draw by its Sampler are skipped. Anything else is vLLM's forward, which calls our
    ``rejection_sample`` as before; without our section it is vLLM's forward, unchanged."""
    module_name = vllm_forward.__module__  # vllm.v1.sample.rejection_sampler: the seam's module

    @functools.wraps(vllm_forward)
    def _forward(self: Any, metadata: Any, draft_probs: Any, logits: torch.Tensor, sampling_metadata: Any) -> Any:
        verifier = seam_verifier(module_name)
        if verifier is None or not plain_step(self, verifier, metadata, draft_probs, logits, sampling_metadata):
            return vllm_forward(self, metadata, draft_probs, logits, sampling_metadata)
        from vllm.v1.outputs import SamplerOutput

        tokens = verify_plain_step(verifier, metadata, draft_probs, logits, sampling_metadata)
        return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=None)

    return _forward


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
    ids = draft_ids.new_full((logits.shape[0],), PLACEHOLDER_TOKEN_ID)  # [T + B]
    ids[metadata.target_logits_indices] = draft_ids  # the draft rows among the T + B (int32 or int64)
    if sm.all_greedy:
        placeholder = cu_rows.new_full((num_reqs,), PLACEHOLDER_TOKEN_ID)
        out = greedy_verify_ragged(logits.argmax(dim=-1), ids, placeholder, cu_rows, K + 1, logits.shape[1])
        out = out[:, : K + 1]
        return at_least_one_token(out, well_formed_requests(cu_rows, K + 1, logits.shape[0])).to(torch.int32)
    temperature = sm.temperature.to(torch.float32)  # [B], 0 for greedy requests
    seeds = row_seeds(num_reqs, logits.device, sm.generators)  # [B] int64
    drafts: dict[str, torch.Tensor] = {}
    if draft_probs is not None and draft_probs.shape[0] > 0:
        # q read in place: the logits row of draft t reads q's row t (laid out as the ids above);
        # a bonus row's placeholder draft reads no draft row (-1, skipped by the kernels)
        index = torch.full((logits.shape[0],), -1, dtype=torch.int64, device=logits.device)  # [T + B]
        index[metadata.target_logits_indices] = torch.arange(draft_ids.shape[0], device=logits.device)
        drafts = dict(draft_probs=draft_probs, draft_rows=index)
    out = verify_with_bonus_rows(
        verifier, logits, None, ids, cu_rows, K, temperature=temperature, seeds=seeds, **drafts
    )
    return at_least_one_token(out, well_formed_requests(cu_rows, K + 1, logits.shape[0])).to(torch.int32)


# --- logit bias and min-p on the draft rows (issue 21: min_p / logit_bias with speculative decoding) ---


def apply_logits_processors(vllm_apply_logits_processors: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wraps V1's ``RejectionSampler.apply_logits_processors`` so that the draft rows get the logit
    bias and min-p processors that vLLM's Sampler applies to the bonus rows, in the Sampler's order:
    the bias before the penalties, min-p after them and before temperature, top-k and top-p.

    vLLM's method applies penalties, allowed-token and bad-words masks and min-tokens to the draft
    rows, but not the batch's ``LogitBiasLogitsProcessor`` / ``MinPLogitsProcessor``; vLLM builds
    those with speculative decoding only when our section is set
    (:func:`spec_samplers.integrations.vllm.spec_decode_params.build_logitsprocs`), so without it
    this wrapper finds neither and changes nothing. The masks commute with the bias (-inf stays
    -inf), so adding it first is the Sampler's order. Min-p is applied before temperature as
    ``x < max(x) + T log(min_p)``, which is vLLM's ``p < min_p max(p)`` on ``softmax(x / T)``."""

    @functools.wraps(vllm_apply_logits_processors)
    def _apply_logits_processors(
        self: Any, logits: torch.Tensor, sampling_metadata: Any, metadata: Any
    ) -> torch.Tensor:
        logitsprocs = sampling_metadata.logitsprocs
        logits = add_logit_bias_to_draft_rows(
            logits, logitsprocs.non_argmax_invariant, metadata.cu_num_draft_tokens, metadata.max_spec_len
        )
        logits = vllm_apply_logits_processors(self, logits, sampling_metadata, metadata)
        return apply_min_p_to_draft_rows(
            logits, logitsprocs.argmax_invariant, metadata.cu_num_draft_tokens, sampling_metadata.temperature
        )

    return _apply_logits_processors


def _first_of(processors: list[Any], class_name: str) -> Any:
    return next((p for p in processors if type(p).__name__ == class_name), None)


def add_logit_bias_to_draft_rows(
    logits: torch.Tensor,  # [T, V] fp32, updated in place
    processors: list[Any],  # the batch's non-argmax-invariant V1 logits processors
    cu_num_draft_tokens: torch.Tensor,  # [B] inclusive
    max_spec_len: int,  # K: no request has more drafts (a host int in vLLM's metadata)
) -> torch.Tensor:
    """Adds each request's ``logit_bias`` to every one of its draft rows, from the batch's
    ``LogitBiasLogitsProcessor`` (its ``(request, token)`` pairs and biases, already on the device).
    [T, V]: the same tensor."""
    bias = _first_of(processors, "LogitBiasLogitsProcessor")
    if bias is None or not bias.biases or logits.shape[0] == 0:  # biases: a host dict
        return logits
    reqs, tokens = (t.to(torch.int64) for t in bias.logits_slice)  # [P], [P]
    cu = cu_num_draft_tokens.to(torch.int64)  # [B]
    num_draft = torch.diff(cu, prepend=cu.new_zeros(1))  # [B]
    step = torch.arange(max_spec_len, device=logits.device)  # [K]
    valid = step[None, :] < num_draft[reqs][:, None]  # [P, K]
    rows = torch.where(valid, (cu - num_draft)[reqs][:, None] + step[None, :], 0)  # [P, K]
    values = torch.where(valid, bias.bias_tensor.to(logits.dtype)[:, None], 0.0)  # [P, K]: 0 added off the rows
    columns = tokens[:, None].expand_as(rows)  # [P, K]
    logits.index_put_((rows.reshape(-1), columns.reshape(-1)), values.reshape(-1), accumulate=True)
    return logits


def apply_min_p_to_draft_rows(
    logits: torch.Tensor,  # [T, V] fp32 before temperature, updated in place
    processors: list[Any],  # the batch's argmax-invariant V1 logits processors
    cu_num_draft_tokens: torch.Tensor,  # [B] inclusive
    temperature: torch.Tensor | None,  # [B] fp32, 0 for greedy requests; None when all are greedy
) -> torch.Tensor:
    """Masks to -inf the tokens that min-p drops from each draft row, from the batch's
    ``MinPLogitsProcessor`` (``min_p`` [B, 1] on the device). [T, V]: the same tensor."""
    min_p = _first_of(processors, "MinPLogitsProcessor")
    if min_p is None or not min_p.min_p_count or temperature is None or logits.shape[0] == 0:
        return logits
    rows = torch.arange(logits.shape[0], device=logits.device)
    req_of_row = torch.searchsorted(cu_num_draft_tokens.to(torch.int64), rows, right=True)  # [T]
    row_min_p = min_p.min_p.reshape(-1)[req_of_row]  # [T]; 0 where unset (greedy requests have 0)
    row_temp = temperature.to(torch.float32)[req_of_row]  # [T]
    row_temp = torch.where(row_temp > 0, row_temp, 1.0)  # vLLM divides greedy rows by 1
    threshold = logits.amax(dim=-1) + row_temp * torch.log(row_min_p)  # [T]; -inf where min_p = 0
    return logits.masked_fill_(logits < threshold[:, None], float("-inf"))


# --- vLLM issue #55005: expand_batch_to_tokens on CPU ------------------------------------------


def expand_batch_to_tokens(vllm_expand: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wraps V1's ``expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from, replace_to)``,
    which ``RejectionSampler.forward`` (``apply_sampling_constraints``) uses to lay each request's
    temperature, top-k and top-p out per draft row before dividing the target logits.

    vLLM's CPU build returns uninitialised memory for float tensors there (vLLM issue #55005, fix
    PR #55006, both open for 0.32 and 0.33), so a batch that is not all greedy gets draft rows
    divided by garbage temperatures: wrong tokens with vLLM's own verification and, on steps that
    are not plain (top-k / top-p / min-p, penalties...), with ours. With our sampler installed at
    the seam this is :func:`expand_to_tokens` (torch ops, every device, no host sync); without it,
    vLLM's function, unchanged."""
    module_name = vllm_expand.__module__  # vllm.v1.sample.rejection_sampler: the seam's module

    @functools.wraps(vllm_expand)
    def _expand_batch_to_tokens(
        x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: Any = 0, replace_to: Any = 0
    ) -> torch.Tensor:
        if seam_verifier(module_name) is None:
            return vllm_expand(x, cu_num_tokens, num_tokens, replace_from, replace_to)
        return expand_to_tokens(x, cu_num_tokens, num_tokens, replace_from, replace_to)

    return _expand_batch_to_tokens


def expand_to_tokens(
    x: torch.Tensor,  # [B]
    cu_num_tokens: torch.Tensor,  # [B] inclusive cumulative sum of each request's rows
    num_tokens: int,
    replace_from: Any = 0,
    replace_to: Any = 0,
) -> torch.Tensor:
    """[num_tokens]: row t holds x of the request it belongs to, ``replace_to`` where that is
    ``replace_from`` (vLLM's ``expand_batch_to_tokens``; rows past the last request repeat it)."""
    if num_tokens == 0 or x.shape[0] == 0:
        return x.new_empty(num_tokens)
    rows = torch.arange(num_tokens, device=x.device)
    request = torch.searchsorted(cu_num_tokens.to(torch.int64), rows, right=True).clamp_(max=x.shape[0] - 1)
    out = x[request]
    return out.masked_fill_(out == replace_from, replace_to)
