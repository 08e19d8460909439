"""Seam in vLLM's V1 model runner: ``vllm.v1.sample.rejection_sampler.rejection_sample``.

``RejectionSampler.forward`` samples the bonus tokens with vLLM's own sampler, applies penalties,
bad words, logits processors, temperature, top-k and top-p to the target logits, then calls this
function, then computes logprobs from its output; the runner parses the output and counts the
metrics. Replacing only this function keeps all of that vLLM's.

Semantics kept from vLLM: greedy requests (temperature 0) are verified against the argmax of the
target logits; requests with their own ``torch.Generator`` (a per-request seed) draw their
randomness from it, and only when they have drafts (vLLM's rule), so re-seeding reproduces them;
the others draw from torch's default generator. Output [B, K+1] int32, -1 padded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from spec_samplers.engine_seam import replace_engine_function
from spec_samplers.integrations.vllm.ragged import RaggedVerifier, greedy_verify_ragged
from spec_samplers.seeding import row_seeds


def make_rejection_sample(sampler: torch.nn.Module, vllm_rejection_sample: Callable[..., torch.Tensor]):
    """A drop-in for vLLM's ``rejection_sample`` (0.32 and 0.33 signatures: :func:`verify`'s
    after ``verifier``) that verifies with ``sampler``.

    vLLM's synthetic mode (a benchmarking mode that ignores the distributions) and, in 0.33, FLy
    (lossy deferred acceptance, ``fly_window_size``) stay vLLM's: such calls go to vLLM's function
    with the arguments as given. The engine config refuses both with our section, so these calls
    only come from code that bypasses it.
    """
    return replace_engine_function(sampler, RaggedVerifier(sampler), verify, vllm_rejection_sample, _vllm_only)


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
    device = target_logits.device
    bonus = bonus_token_ids.reshape(-1)  # [B]
    if sampling_metadata.all_greedy:
        greedy = greedy_verify_ragged(
            target_logits.argmax(dim=-1), draft_token_ids, bonus, cu_num_draft_tokens, max_spec_len
        )
        return greedy.to(torch.int32)
    is_greedy = None if sampling_metadata.all_random else sampling_metadata.temperature == 0  # [B]
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
        return out.to(torch.int32)
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
            target_logits.argmax(dim=-1), draft_token_ids, bonus, cu_num_draft_tokens, max_spec_len
        )
        out = torch.where(is_greedy[:, None], greedy, out)
    return out.to(torch.int32)


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
