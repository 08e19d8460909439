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

from collections.abc import Callable
from typing import Any

import torch

from spec_samplers.integrations.vllm.ragged import RaggedVerifier, greedy_verify_ragged
from spec_samplers.seeding import row_seeds


def make_rejection_sample(sampler: torch.nn.Module, vllm_rejection_sample: Callable[..., torch.Tensor]):
    """A drop-in for vLLM's ``rejection_sample`` (0.32 and 0.33 signatures) that verifies with
    ``sampler``.

    vLLM's synthetic mode (a benchmarking mode that ignores the distributions) and, in 0.33, FLy
    (lossy deferred acceptance, ``fly_window_size``) stay vLLM's; the engine config refuses both
    with our section, so these calls only come from code that bypasses it.
    """
    verifier = RaggedVerifier(sampler)

    def rejection_sample(
        draft_token_ids: torch.Tensor,  # [T] int32
        num_draft_tokens: list[int],  # [B] host list
        max_spec_len: int,
        cu_num_draft_tokens: torch.Tensor,  # [B] int32, inclusive cumulative sum
        draft_probs: torch.Tensor | None,  # [T, V] or None (n-gram and other point-mass drafts)
        target_logits: torch.Tensor,  # [T, V] fp32, temperature/top-k/top-p applied
        bonus_token_ids: torch.Tensor,  # [B, 1], sampled by vLLM
        sampling_metadata: Any,  # vllm.v1.sample.metadata.SamplingMetadata
        synthetic_mode: bool = False,
        synthetic_conditional_rates: torch.Tensor | None = None,
        use_fp64_gumbel: bool = False,
        fly_window_size: int | None = None,  # vLLM 0.33
        fly_entropy_threshold: float | None = None,  # vLLM 0.33
        fly_entropy_top_k: int = 3,  # vLLM 0.33
    ) -> torch.Tensor:
        """Returns [B, max_spec_len + 1] int32, -1 padded (vLLM's PLACEHOLDER_TOKEN_ID)."""
        if synthetic_mode or fly_window_size is not None:
            # (0.32's function has no fly_* parameters: pass them only when FLy is on)
            fly = (
                {}
                if fly_window_size is None
                else dict(
                    fly_window_size=fly_window_size,
                    fly_entropy_threshold=fly_entropy_threshold,
                    fly_entropy_top_k=fly_entropy_top_k,
                )
            )
            return vllm_rejection_sample(
                draft_token_ids,
                num_draft_tokens,
                max_spec_len,
                cu_num_draft_tokens,
                draft_probs,
                target_logits,
                bonus_token_ids,
                sampling_metadata,
                synthetic_mode=synthetic_mode,
                synthetic_conditional_rates=synthetic_conditional_rates,
                use_fp64_gumbel=use_fp64_gumbel,
                **fly,
            )
        return verify(
            verifier,
            draft_token_ids,
            num_draft_tokens,
            max_spec_len,
            cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            sampling_metadata,
        )

    rejection_sample.__spec_samplers_sampler__ = sampler  # type: ignore[attr-defined]
    return rejection_sample


def verify(
    verifier: RaggedVerifier,
    draft_token_ids: torch.Tensor,  # [T]
    num_draft_tokens: list[int],  # [B]
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,  # [B]
    draft_probs: torch.Tensor | None,  # [T, V] or None
    target_logits: torch.Tensor,  # [T, V]
    bonus_token_ids: torch.Tensor,  # [B, 1]
    sampling_metadata: Any,
) -> torch.Tensor:
    """[B, K+1] int32: greedy rows by vLLM's rule, the others by the sampler."""
    batch_size = len(num_draft_tokens)
    device = target_logits.device
    bonus = bonus_token_ids.reshape(-1)  # [B]
    greedy = None
    if not sampling_metadata.all_random:
        greedy = greedy_verify_ragged(
            target_logits.argmax(dim=-1), draft_token_ids, bonus, cu_num_draft_tokens, max_spec_len
        )
        if sampling_metadata.all_greedy:
            return greedy.to(torch.int32)
    is_greedy = None if greedy is None else sampling_metadata.temperature == 0  # [B]
    # vLLM draws nothing from a request's generator in a step without drafts.
    generators = {i: g for i, g in sampling_metadata.generators.items() if num_draft_tokens[i] > 0}
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
        is_greedy=is_greedy,
        seeded_seqs=generators,
    )
    if greedy is not None:
        assert is_greedy is not None
        out = torch.where(is_greedy[:, None], greedy, out)
    return out.to(torch.int32)
