"""Lossless rejection sampling (Leviathan et al. 2023; Chen et al. 2023)."""

from __future__ import annotations

import torch

from spec_samplers.base import SpecDecodeStochasticBaseSampler
from spec_samplers.kernels.backend import check_backend, use_triton
from spec_samplers.reference import (
    rejection_sample_from_logits_reference,
    rejection_sample_ragged_from_logits_reference,
    rejection_sample_ragged_reference,
    rejection_sample_reference,
)
from spec_samplers.seeding import row_seeds
from spec_samplers.validation import Shapes, check_row_mask, check_seed_tensor


class RejectionSampler(SpecDecodeStochasticBaseSampler):
    """Accept draft x_i with probability min(1, q_i(x_i) / p_i(x_i)); at the first rejection emit
    a sample of (q - p)+; after k accepted drafts emit the bonus token. The emitted tokens have
    exactly the target distribution.

    Args:
        strict_mode: check token-id bounds and probability values too (synchronises with the host).
        backend: "auto" (Triton kernels for CUDA tensors when triton imports, else PyTorch),
            "torch" (always the PyTorch path) or "triton" (always the kernels; CPU tensors only
            under TRITON_INTERPRET=1). Both give the same tokens on the same inputs and seeds.

    Example::

        >>> import torch
        >>> from spec_samplers import RejectionSampler
        >>> B, k, V = 2, 3, 8
        >>> target = torch.softmax(torch.randn(B, k + 1, V), -1)   # [B, k+1, V]
        >>> draft = torch.softmax(torch.randn(B, k, V), -1)        # [B, k, V]
        >>> draft_ids = torch.multinomial(draft.view(-1, V), 1).view(B, k)
        >>> bonus = torch.multinomial(target[:, -1], 1)             # [B, 1]
        >>> out = RejectionSampler()(target, bonus, draft, draft_ids)  # [B, k+1] int64, -1 padded
    """

    def __init__(self, strict_mode: bool = False, backend: str = "auto"):
        super().__init__(strict_mode=strict_mode)
        self.backend = check_backend(backend)

    @staticmethod
    def _seeds_and_offsets(
        shapes: Shapes,
        device: torch.device,
        seeded_seqs: dict[int, torch.Generator] | None,
        seeds: torch.Tensor | None,  # [B] int64
        offsets: torch.Tensor | None,  # [B] int64
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        check_seed_tensor("offsets", offsets, shapes.batch_size, device)
        seeds = row_seeds(shapes.batch_size, device, seeded_seqs, seeds)
        return seeds, None if offsets is None else offsets.to(torch.int64)

    def forward(
        self,
        target_with_bonus_probs: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
        bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
        draft_probs: torch.Tensor | None,  # [B, k, V] fp32/fp16/bf16, or None for point-mass drafts
        draft_token_ids: torch.Tensor,  # [B, k] int32/int64
        seeded_seqs: dict[int, torch.Generator] | None = None,
        *,
        seeds: torch.Tensor | None = None,  # [B] int64, per-row seeds kept on device
        offsets: torch.Tensor | None = None,  # [B] int64, per-row counter offsets (default 0)
        is_greedy: torch.Tensor | None = None,  # [B] bool, rows sampled at temperature 0
    ) -> torch.Tensor:
        """Returns [B, k+1] int64: accepted drafts, the recovered or bonus token, then -1."""
        shapes = self._validate(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)
        device = target_with_bonus_probs.device
        check_row_mask("is_greedy", is_greedy, shapes.batch_size, device)
        seeds, offsets = self._seeds_and_offsets(shapes, device, seeded_seqs, seeds, offsets)
        if use_triton(self.backend, device):
            from spec_samplers.kernels.rejection_launch import rejection_sample_triton as sample
        else:
            sample = rejection_sample_reference
        out = sample(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, seeds, offsets, is_greedy)
        self._update_counters(out)
        return out

    def forward_ragged(
        self,
        target_probs: torch.Tensor,  # [T, V] fp32/fp16/bf16: row t scores draft token t
        bonus_token_ids: torch.Tensor,  # [B] or [B, 1] int32/int64
        draft_probs: torch.Tensor | None,  # [T, V] or None for point-mass drafts
        draft_token_ids: torch.Tensor,  # [T] int32/int64
        cu_num_draft_tokens: torch.Tensor,  # [B] int32/int64, inclusive cumsum of k_b (k_b may be 0)
        max_spec_len: int,  # K >= every k_b: fixes the output width
        seeded_seqs: dict[int, torch.Generator] | None = None,
        *,
        seeds: torch.Tensor | None = None,  # [B] int64
        offsets: torch.Tensor | None = None,  # [B] int64
        is_greedy: torch.Tensor | None = None,  # [B] bool
    ) -> torch.Tensor:
        """The ragged layout engines use (vLLM V1). Returns [B, K+1] int64, -1 padded.

        Same tokens as :meth:`forward` on the same data and seeds. There are no bonus rows, so a
        bonus id outside [0, V) becomes -1 rather than a resample.
        """
        shapes = self._validate_ragged(target_probs, bonus_token_ids, draft_probs, draft_token_ids, cu_num_draft_tokens, max_spec_len)
        device = target_probs.device
        check_row_mask("is_greedy", is_greedy, shapes.batch_size, device)
        seeds, offsets = self._seeds_and_offsets(shapes, device, seeded_seqs, seeds, offsets)
        if use_triton(self.backend, device):
            from spec_samplers.kernels.rejection_launch import rejection_sample_ragged_triton as sample
        else:
            sample = rejection_sample_ragged_reference
        out = sample(
            target_probs, bonus_token_ids, draft_probs, draft_token_ids, cu_num_draft_tokens, max_spec_len,
            seeds, offsets, is_greedy,
        )
        self._update_counters(out, num_draft_tokens=target_probs.shape[0])
        return out

    def forward_from_logits(
        self,
        target_logits: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
        bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
        draft_logits: torch.Tensor | None,  # [B, k, V] or None for point-mass drafts
        draft_token_ids: torch.Tensor,  # [B, k] int32/int64
        temperature: torch.Tensor,  # [B] float, 0 = greedy request
        seeded_seqs: dict[int, torch.Generator] | None = None,
        *,
        seeds: torch.Tensor | None = None,  # [B] int64
        offsets: torch.Tensor | None = None,  # [B] int64
    ) -> torch.Tensor:
        """:meth:`forward` on q = softmax(target_logits / T) and p = softmax(draft_logits / T)
        (each request's T for both; T == 0 makes the request greedy on the target logits'
        argmax). The Triton backend fuses the softmax and never writes a probability tensor.
        Returns [B, k+1] int64. Without strict mode a NaN logit counts as -inf and a negative or
        non-finite T as 1; strict mode raises for both."""
        shapes = self._validate(target_logits, bonus_token_ids, draft_logits, draft_token_ids, logits=True)
        device = target_logits.device
        self._validate_temperature(temperature, shapes, device)
        seeds, offsets = self._seeds_and_offsets(shapes, device, seeded_seqs, seeds, offsets)
        if use_triton(self.backend, device):
            from spec_samplers.kernels.rejection_launch import rejection_sample_from_logits_triton as sample
        else:
            sample = rejection_sample_from_logits_reference
        out = sample(target_logits, bonus_token_ids, draft_logits, draft_token_ids, temperature, seeds, offsets)
        self._update_counters(out)
        return out

    def forward_ragged_from_logits(
        self,
        target_logits: torch.Tensor,  # [T, V] fp32/fp16/bf16
        bonus_token_ids: torch.Tensor,  # [B] or [B, 1] int32/int64
        draft_logits: torch.Tensor | None,  # [T, V] or None
        draft_token_ids: torch.Tensor,  # [T] int32/int64
        cu_num_draft_tokens: torch.Tensor,  # [B] inclusive cumsum of k_b
        max_spec_len: int,  # K
        temperature: torch.Tensor,  # [B] float, 0 = greedy request
        seeded_seqs: dict[int, torch.Generator] | None = None,
        *,
        seeds: torch.Tensor | None = None,  # [B] int64
        offsets: torch.Tensor | None = None,  # [B] int64
    ) -> torch.Tensor:
        """Ragged twin of :meth:`forward_from_logits`. Returns [B, K+1] int64, -1 padded."""
        shapes = self._validate_ragged(
            target_logits, bonus_token_ids, draft_logits, draft_token_ids, cu_num_draft_tokens, max_spec_len, logits=True
        )
        device = target_logits.device
        self._validate_temperature(temperature, shapes, device)
        seeds, offsets = self._seeds_and_offsets(shapes, device, seeded_seqs, seeds, offsets)
        if use_triton(self.backend, device):
            from spec_samplers.kernels.rejection_launch import rejection_sample_ragged_from_logits_triton as sample
        else:
            sample = rejection_sample_ragged_from_logits_reference
        out = sample(
            target_logits, bonus_token_ids, draft_logits, draft_token_ids, cu_num_draft_tokens, max_spec_len,
            temperature, seeds, offsets,
        )
        self._update_counters(out, num_draft_tokens=target_logits.shape[0])
        return out
