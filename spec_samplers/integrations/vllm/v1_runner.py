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
