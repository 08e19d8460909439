"""Typical acceptance (Medusa, Cai et al. 2024, section 3.3.1): lossy and deterministic."""

from __future__ import annotations

import math

import torch

from spec_samplers.base import SpecDecodeDeterministicBaseSampler
from spec_samplers.kernels.backend import check_backend, use_triton
from spec_samplers.reference import (
    typical_accept_from_logits_reference,
    typical_accept_ragged_from_logits_reference,
    typical_accept_ragged_reference,
    typical_accept_reference,
)


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
        backend: "auto" (Triton kernels for CUDA tensors when triton imports, else PyTorch),
            "torch" (always the PyTorch path) or "triton" (always the kernels; CPU tensors only
            under TRITON_INTERPRET=1).

    Example::

        >>> import torch
        >>> from spec_samplers import TypicalAcceptanceSampler
        >>> target = torch.softmax(torch.randn(2, 4, 8), -1)       # [B, k+1, V]
        >>> draft_ids = torch.randint(0, 8, (2, 3))                # [B, k]
        >>> bonus = torch.randint(0, 8, (2, 1))                    # [B, 1]
        >>> out = TypicalAcceptanceSampler()(target, bonus, None, draft_ids)  # [B, k+1] int64
    """

    def __init__(
        self, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3, strict_mode: bool = False, backend: str = "auto"
    ):
        super().__init__(strict_mode=strict_mode)
        self.backend = check_backend(backend)
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
        if use_triton(self.backend, target_with_bonus_probs.device):
            from spec_samplers.kernels.typical_launch import typical_accept_triton as accept
        else:
            accept = typical_accept_reference
        out = accept(
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
        if use_triton(self.backend, target_probs.device):
            from spec_samplers.kernels.typical_launch import typical_accept_ragged_triton as accept
        else:
            accept = typical_accept_ragged_reference
        out = accept(
            target_probs, bonus_token_ids, draft_token_ids, cu_num_draft_tokens, max_spec_len,
            self.posterior_threshold, self.posterior_alpha,
        )
        self._update_counters(out, num_draft_tokens=target_probs.shape[0])
        return out

    def forward_from_logits(
        self,
        target_logits: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
        bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
        draft_logits: torch.Tensor | None,  # [B, k, V] or None: ignored beyond its shape check
        draft_token_ids: torch.Tensor,  # [B, k] int32/int64
        temperature: torch.Tensor,  # [B] float, 0 = greedy request (q one-hot at the argmax)
    ) -> torch.Tensor:
        """:meth:`forward` on q = softmax(target_logits / T), fused on the Triton backend.
        Returns [B, k+1] int64."""
        shapes = self._validate(target_logits, bonus_token_ids, draft_logits, draft_token_ids, logits=True)
        self._validate_temperature(temperature, shapes, target_logits.device)
        if use_triton(self.backend, target_logits.device):
            from spec_samplers.kernels.typical_launch import typical_accept_from_logits_triton as accept
        else:
            accept = typical_accept_from_logits_reference
        out = accept(
            target_logits, bonus_token_ids, draft_token_ids, temperature, self.posterior_threshold, self.posterior_alpha
        )
        self._update_counters(out)
        return out

    def forward_ragged_from_logits(
        self,
        target_logits: torch.Tensor,  # [T, V] fp32/fp16/bf16
        bonus_token_ids: torch.Tensor,  # [B] or [B, 1] int32/int64
        draft_logits: torch.Tensor | None,  # [T, V] or None: ignored beyond its shape check
        draft_token_ids: torch.Tensor,  # [T] int32/int64
        cu_num_draft_tokens: torch.Tensor,  # [B] inclusive cumsum of k_b
        max_spec_len: int,  # K
        temperature: torch.Tensor,  # [B] float, 0 = greedy request
    ) -> torch.Tensor:
        """Ragged twin of :meth:`forward_from_logits`. Returns [B, K+1] int64, -1 padded."""
        shapes = self._validate_ragged(
            target_logits, bonus_token_ids, draft_logits, draft_token_ids, cu_num_draft_tokens, max_spec_len, logits=True
        )
        self._validate_temperature(temperature, shapes, target_logits.device)
        if use_triton(self.backend, target_logits.device):
            from spec_samplers.kernels.typical_launch import typical_accept_ragged_from_logits_triton as accept
        else:
            accept = typical_accept_ragged_from_logits_reference
        out = accept(
            target_logits, bonus_token_ids, draft_token_ids, cu_num_draft_tokens, max_spec_len, temperature,
            self.posterior_threshold, self.posterior_alpha,
        )
        self._update_counters(out, num_draft_tokens=target_logits.shape[0])
        return out
