"""Sampler base classes, compatible with vLLM V0's ``SpecDecodeBaseSampler`` family.

Subclasses implement ``forward`` and call :meth:`SpecDecodeBaseSampler._validate` first and
:meth:`SpecDecodeBaseSampler._update_counters` last; the counters are derived from the output
layout alone, so a third-party sampler gets them right by returning the standard layout.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from spec_samplers import validation
from spec_samplers.output import PLACEHOLDER_TOKEN_ID
from spec_samplers.validation import Shapes


def _as_device(device: int | str | torch.device, device_type: str) -> torch.device:
    if isinstance(device, int):
        return torch.device(f"{device_type}:{device}")
    if isinstance(device, (str, torch.device)):
        return torch.device(device)
    raise TypeError(f"device: expected int, str or torch.device, got {type(device).__name__}")


class SpecDecodeBaseSampler(torch.nn.Module):
    """Base of every verification sampler.

    Counters (0-dim int64 device tensors, updated without host synchronisation):
    ``num_accepted_tokens`` (accepted drafts), ``num_emitted_tokens`` (non -1 outputs) and
    ``num_accepted_per_position`` ([k]: how often the draft at each position was accepted);
    ``num_draft_tokens`` is a host int (B * k per call).
    """

    def __init__(self, strict_mode: bool = False):
        super().__init__()
        if not isinstance(strict_mode, bool):
            raise TypeError(f"strict_mode: expected bool, got {type(strict_mode).__name__}")
        self._strict_mode = strict_mode
        self.num_accepted_tokens: torch.Tensor | None = None
        self.num_emitted_tokens: torch.Tensor | None = None
        self.num_accepted_per_position: torch.Tensor | None = None
        self.num_draft_tokens: int = 0

    def init_gpu_tensors(self, device: int | str | torch.device) -> None:
        self.init_tensors(device, device_type="cuda")

    def init_tensors(self, device: int | str | torch.device, device_type: str = "cuda") -> None:
        """Allocate the counters on ``device`` (an int means ``{device_type}:{device}``)."""
        if self.num_accepted_tokens is not None:
            raise RuntimeError("init_tensors: the counters are already initialised")
        dev = _as_device(device, device_type)
        self.num_accepted_tokens = torch.zeros((), dtype=torch.long, device=dev)
        self.num_emitted_tokens = torch.zeros((), dtype=torch.long, device=dev)
        self.num_accepted_per_position = torch.zeros(0, dtype=torch.long, device=dev)

    @property
    def probs_dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def token_id_dtype(self) -> torch.dtype:
        return torch.int64

    @property
    def strict_mode(self) -> bool:
        return self._strict_mode

    def _validate(
        self,
        target_with_bonus_probs: torch.Tensor,  # [B, k+1, V]
        bonus_token_ids: torch.Tensor,  # [B, 1]
        draft_probs: torch.Tensor | None,  # [B, k, V] or None
        draft_token_ids: torch.Tensor,  # [B, k]
        logits: bool = False,  # the float tensors are target_logits / draft_logits
    ) -> Shapes:
        names = ("target_logits", "draft_logits") if logits else ("target_with_bonus_probs", "draft_probs")
        shapes = validation.check_metadata(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, *names)
        if self._strict_mode:
            validation.check_values(
                shapes.vocab_size, target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, *names, logits
            )
        return shapes

    def _validate_ragged(
        self,
        target_probs: torch.Tensor,  # [T, V]
        bonus_token_ids: torch.Tensor,  # [B] or [B, 1]
        draft_probs: torch.Tensor | None,  # [T, V] or None
        draft_token_ids: torch.Tensor,  # [T]
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,
        logits: bool = False,  # the float tensors are target_logits / draft_logits
    ) -> Shapes:
        names = ("target_logits", "draft_logits") if logits else ("target_probs", "draft_probs")
        shapes = validation.check_ragged_metadata(
            target_probs, bonus_token_ids, draft_probs, draft_token_ids, cu_num_draft_tokens, max_spec_len, *names
        )
        if self._strict_mode:
            validation.check_ragged_values(cu_num_draft_tokens, target_probs.shape[0], max_spec_len)
            validation.check_values(
                shapes.vocab_size, target_probs, bonus_token_ids, draft_probs, draft_token_ids, *names, logits
            )
        return shapes

    def _validate_temperature(self, temperature: torch.Tensor, shapes: Shapes, device: torch.device) -> None:
        validation.check_temperature(temperature, shapes.batch_size, device, self._strict_mode)

    def _update_counters(self, output_token_ids: torch.Tensor, num_draft_tokens: int | None = None) -> None:
        """output_token_ids: [B, k+1] in the standard layout; num_draft_tokens defaults to B * k
        (pass T for the ragged layout)."""
        if self.num_accepted_tokens is None:
            self.init_tensors(output_token_ids.device)
        B, kp1 = output_token_ids.shape
        k = kp1 - 1
        # Position i's draft was accepted iff slot i+1 holds a token.
        accepted = output_token_ids[:, 1:] != PLACEHOLDER_TOKEN_ID  # [B, k]
        if self.num_accepted_per_position.shape[0] < k:
            grown = torch.zeros(k, dtype=torch.long, device=self.num_accepted_per_position.device)
            grown[: self.num_accepted_per_position.shape[0]] = self.num_accepted_per_position
            self.num_accepted_per_position = grown
        per_position = accepted.sum(dim=0)
        self.num_accepted_per_position[:k] += per_position
        self.num_accepted_tokens += per_position.sum()
        self.num_emitted_tokens += (output_token_ids != PLACEHOLDER_TOKEN_ID).sum()
        self.num_draft_tokens += B * k if num_draft_tokens is None else num_draft_tokens


class SpecDecodeDeterministicBaseSampler(SpecDecodeBaseSampler):
    """Samplers whose output is a function of the inputs alone."""

    @abstractmethod
    def forward(
        self,
        target_with_bonus_probs: torch.Tensor,  # [B, k+1, V]
        bonus_token_ids: torch.Tensor,  # [B, 1]
        draft_probs: torch.Tensor | None,  # [B, k, V]
        draft_token_ids: torch.Tensor,  # [B, k]
    ) -> torch.Tensor:
        raise NotImplementedError


class SpecDecodeStochasticBaseSampler(SpecDecodeBaseSampler):
    """Samplers that draw random numbers; ``seeded_seqs`` maps row -> torch.Generator."""

    @abstractmethod
    def forward(
        self,
        target_with_bonus_probs: torch.Tensor,  # [B, k+1, V]
        bonus_token_ids: torch.Tensor,  # [B, 1]
        draft_probs: torch.Tensor | None,  # [B, k, V]
        draft_token_ids: torch.Tensor,  # [B, k]
        seeded_seqs: dict[int, torch.Generator] | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError
