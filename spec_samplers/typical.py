"""Typical acceptance (Medusa, Cai et al. 2024, section 3.3.1): lossy and deterministic."""

from __future__ import annotations

import math

import torch

from spec_samplers.base import SpecDecodeDeterministicBaseSampler
from spec_samplers.reference import typical_accept_ragged_reference, typical_accept_reference


def _check_option(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return value


class TypicalAcceptanceSampler(SpecDecodeDeterministicBaseSampler):
    """Accept x_i iff q_i(x_i) > min(posterior_threshold, posterior_alpha * exp(-H(q_i))); at the
    first rejection emit argmax q_j. ``draft_probs`` is ignored (it may be None).

    Args:
        posterior_threshold: upper bound of the acceptance threshold (vLLM V0 default 0.09).
        posterior_alpha: scale of the entropy-dependent threshold (vLLM V0 default 0.3).
        strict_mode: check token-id bounds and probability values too (synchronises with the host).

    Example::

        >>> import torch
        >>> from spec_samplers import TypicalAcceptanceSampler
        >>> target = torch.softmax(torch.randn(2, 4, 8), -1)       # [B, k+1, V]
        >>> draft_ids = torch.randint(0, 8, (2, 3))                # [B, k]
        >>> bonus = torch.randint(0, 8, (2, 1))                    # [B, 1]
        >>> out = TypicalAcceptanceSampler()(target, bonus, None, draft_ids)  # [B, k+1] int64
    """

    def __init__(self, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3, strict_mode: bool = False):
        super().__init__(strict_mode=strict_mode)
        self.posterior_threshold = _check_option("posterior_threshold", posterior_threshold)
        self.posterior_alpha = _check_option("posterior_alpha", posterior_alpha)

    def forward(
        self,
        target_with_bonus_probs: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
        bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
        draft_probs: torch.Tensor | None,  # [B, k, V] or None: ignored beyond its shape check
        draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    ) -> torch.Tensor:
        """Returns [B, k+1] int64: accepted drafts, argmax or bonus token, then -1."""
        self._validate(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)
        out = typical_accept_reference(
            target_with_bonus_probs, bonus_token_ids, draft_token_ids, self.posterior_threshold, self.posterior_alpha
        )
        self._update_counters(out)
        return out

    def forward_ragged(
        self,
        target_probs: torch.Tensor,  # [T, V] fp32/fp16/bf16
        bonus_token_ids: torch.Tensor,  # [B] or [B, 1] int32/int64
        draft_probs: torch.Tensor | None,  # [T, V] or None: ignored beyond its shape check
        draft_token_ids: torch.Tensor,  # [T] int32/int64
        cu_num_draft_tokens: torch.Tensor,  # [B] inclusive cumsum of k_b
        max_spec_len: int,  # K
    ) -> torch.Tensor:
        """The ragged layout (vLLM V1). Returns [B, K+1] int64, -1 padded."""
        self._validate_ragged(target_probs, bonus_token_ids, draft_probs, draft_token_ids, cu_num_draft_tokens, max_spec_len)
        out = typical_accept_ragged_reference(
            target_probs, bonus_token_ids, draft_token_ids, cu_num_draft_tokens, max_spec_len,
            self.posterior_threshold, self.posterior_alpha,
        )
        self._update_counters(out, num_draft_tokens=target_probs.shape[0])
        return out
