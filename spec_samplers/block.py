"""Lossless block verification (Sun et al. 2024, "Block Verification Accelerates Speculative
Decoding"): the draft block is verified jointly, not token by token."""

from __future__ import annotations

import importlib
from typing import Callable

import torch

from spec_samplers import block_reference
from spec_samplers.base import SpecDecodeStochasticBaseSampler
from spec_samplers.kernels.backend import check_backend, use_triton
from spec_samplers.seeding import row_seeds
from spec_samplers.validation import Shapes, check_row_mask, check_seed_tensor

#: entry -> (reference function, kernel launcher in spec_samplers.kernels.block_launch)
_IMPLEMENTATIONS = {
    "padded": ("block_verify_reference", "block_verify_triton"),
    "ragged": ("block_verify_ragged_reference", "block_verify_ragged_triton"),
    "padded_logits": ("block_verify_from_logits_reference", "block_verify_from_logits_triton"),
    "ragged_logits": ("block_verify_ragged_from_logits_reference", "block_verify_ragged_from_logits_triton"),
}


class BlockVerificationSampler(SpecDecodeStochasticBaseSampler):
    """Block verification: with the running ratio rho_m = min(rho_{m-1} q(x)/p(x), 1) of each
    draft prefix and the residual mass Z_m = sum (rho_m q_m - p_m)+, the accepted length is the
    last m with u_m < h_m = Z_m / (Z_m + 1 - rho_m) (h = rho at the block's end), so a later
    position can rescue an earlier failure; the next token is a sample of (rho_tau q - p)+, or
    the bonus token when all k drafts pass. Lossless for the whole block, and its expected
    accepted length is never below token-wise rejection's (:class:`RejectionSampler`) on the
    same distributions. Greedy rows follow the argmax rule. Formulas and conventions:
    :mod:`spec_samplers.block_reference`.

    Same interface, options, seeds and output layout as :class:`RejectionSampler`; the cost is a
    vocabulary pass at every draft position (token-wise rejection: one, only on rejection), none
    extra for point-mass drafts.

    Args:
        strict_mode: check token-id bounds and probability values too (synchronises with the host).
        backend: "auto", "torch" or "triton", as for :class:`RejectionSampler`.

    Example::

        >>> import torch
        >>> from spec_samplers import BlockVerificationSampler
        >>> B, k, V = 2, 3, 8
        >>> target = torch.softmax(torch.randn(B, k + 1, V), -1)   # [B, k+1, V]
        >>> draft = torch.softmax(torch.randn(B, k, V), -1)        # [B, k, V]
        >>> draft_ids = torch.multinomial(draft.view(-1, V), 1).view(B, k)
        >>> bonus = torch.multinomial(target[:, -1], 1)             # [B, 1]
        >>> out = BlockVerificationSampler()(target, bonus, draft, draft_ids)  # [B, k+1], -1 padded
    """

    lossless = True
    #: the bench's lossless theory for this sampler (spec_samplers.bench.quality.block_theory)
    acceptance_law = "block"

    def __init__(self, strict_mode: bool = False, backend: str = "auto"):
        super().__init__(strict_mode=strict_mode)
        self.backend = check_backend(backend)

    def _implementation(self, entry: str, device: torch.device) -> Callable[..., torch.Tensor]:
        reference_name, kernel_name = _IMPLEMENTATIONS[entry]
        if use_triton(self.backend, device):
            return getattr(importlib.import_module("spec_samplers.kernels.block_launch"), kernel_name)
        return getattr(block_reference, reference_name)

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
        """Returns [B, k+1] int64: accepted drafts, the resampled or bonus token, then -1."""
        shapes = self._validate(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)
        device = target_with_bonus_probs.device
        check_row_mask("is_greedy", is_greedy, shapes.batch_size, device)
        seeds, offsets = self._seeds_and_offsets(shapes, device, seeded_seqs, seeds, offsets)
        out = self._implementation("padded", device)(
            target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, seeds, offsets, is_greedy
        )
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
        """The ragged layout engines use. Returns [B, K+1] int64, -1 padded; same tokens as
        :meth:`forward` on the same data and seeds (an out-of-range bonus id becomes -1)."""
        shapes = self._validate_ragged(
            target_probs, bonus_token_ids, draft_probs, draft_token_ids, cu_num_draft_tokens, max_spec_len
        )
        device = target_probs.device
        check_row_mask("is_greedy", is_greedy, shapes.batch_size, device)
        seeds, offsets = self._seeds_and_offsets(shapes, device, seeded_seqs, seeds, offsets)
        out = self._implementation("ragged", device)(
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
        """:meth:`forward` on q = softmax(target_logits / T), p = softmax(draft_logits / T)
        (T == 0: greedy request). The Triton backend fuses the softmax. Returns [B, k+1] int64."""
        shapes = self._validate(target_logits, bonus_token_ids, draft_logits, draft_token_ids, logits=True)
        device = target_logits.device
        self._validate_temperature(temperature, shapes, device)
        seeds, offsets = self._seeds_and_offsets(shapes, device, seeded_seqs, seeds, offsets)
        out = self._implementation("padded_logits", device)(
            target_logits, bonus_token_ids, draft_logits, draft_token_ids, temperature, seeds, offsets
        )
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
        out = self._implementation("ragged_logits", device)(
            target_logits, bonus_token_ids, draft_logits, draft_token_ids, cu_num_draft_tokens, max_spec_len,
            temperature, seeds, offsets,
        )
        self._update_counters(out, num_draft_tokens=target_logits.shape[0])
        return out
