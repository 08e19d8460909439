"""Typical acceptance (Medusa, Cai et al. 2024, section 3.3.1): lossy and deterministic."""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from spec_samplers.base import SpecDecodeDeterministicBaseSampler
from spec_samplers.constants import PLACEHOLDER_TOKEN_ID
from spec_samplers.kernels.tree_launch import typical_tree_triton
from spec_samplers.kernels.verify_launch import typical_triton
from spec_samplers.reference import typical_accepts, typical_reference
from spec_samplers.torch_ops import clean_probs, valid_ids
from spec_samplers.tree.entries import TreeEntries
from spec_samplers.tree.reference import typical_tree_reference


def _check_option(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return value


class TypicalAcceptanceSampler(TreeEntries, SpecDecodeDeterministicBaseSampler):
    """Accept x_i iff q_i(x_i) > min(posterior_threshold, posterior_alpha * exp(-H(q_i))); at the
    first rejection emit argmax q_j. ``draft_probs`` is ignored (it may be None). ``forward_tree``
    and its twins apply Medusa's tree rule (the longest candidate path whose every node passes).

    Args:
        posterior_threshold: upper bound of the acceptance threshold (vLLM V0 default 0.09).
        posterior_alpha: scale of the entropy-dependent threshold (vLLM V0 default 0.3).
        strict_mode: check token-id bounds and the [B] arguments too, as vLLM V0's strict mode
            (synchronises with the host).
        backend: "auto" (Triton kernels for CUDA tensors when triton imports, else PyTorch),
            "torch" (always the PyTorch path) or "triton" (always the kernels; CPU tensors only
            under TRITON_INTERPRET=1).
        check_values: also check the probabilities / logits (finite, non-negative, rows summing
            to one; synchronises with the host). V0 callers pass unnormalised targets in strict
            mode, so this is a separate opt-in.
        use_flashinfer: vLLM V0's option, accepted and recorded; ``backend`` picks the kernels.

    Example::

        >>> import torch
        >>> from spec_samplers import TypicalAcceptanceSampler
        >>> target = torch.softmax(torch.randn(2, 4, 8), -1)       # [B, k+1, V]
        >>> draft_ids = torch.randint(0, 8, (2, 3))                # [B, k]
        >>> bonus = torch.randint(0, 8, (2, 1))                    # [B, 1]
        >>> out = TypicalAcceptanceSampler()(target, bonus, None, draft_ids)  # [B, k+1] int64
    """

    lossless: ClassVar[bool] = False
    applies_filters: ClassVar[bool] = True
    takes_draft_rows: ClassVar[bool] = True
    reference_op = staticmethod(typical_reference)
    requests_independent = True
    kernel_op = staticmethod(typical_triton)
    kernel_counts = True  # the launcher adds batch.counters
    tree_reference = staticmethod(typical_tree_reference)
    tree_kernel = staticmethod(typical_tree_triton)
    tree_kernel_takes_call = True
    tree_random = False

    def __init__(
        self,
        posterior_threshold: float = 0.09,
        posterior_alpha: float = 0.3,
        strict_mode: bool = False,
        backend: str = "auto",
        *,
        check_values: bool = False,
        use_flashinfer: bool | None = None,
    ):
        super().__init__(
            strict_mode=strict_mode, backend=backend, check_values=check_values, use_flashinfer=use_flashinfer
        )
        self.posterior_threshold = posterior_threshold
        self.posterior_alpha = posterior_alpha

    # The two options are the op's (op_options): set through the base, so a call reads them as set.

    @property
    def posterior_threshold(self) -> float:
        value: float = self._options["posterior_threshold"]
        return value

    @posterior_threshold.setter
    def posterior_threshold(self, value: float) -> None:
        self._set_options(posterior_threshold=_check_option("posterior_threshold", value))

    @property
    def posterior_alpha(self) -> float:
        value: float = self._options["posterior_alpha"]
        return value

    @posterior_alpha.setter
    def posterior_alpha(self, value: float) -> None:
        self._set_options(posterior_alpha=_check_option("posterior_alpha", value))

    # -- vLLM V0's helpers, with V0's signatures -----------------------------------------------------

    def _evaluate_accepted_tokens(
        self,
        target_probs: torch.Tensor,  # [B, k, V] fp32/fp16/bf16
        draft_token_ids: torch.Tensor,  # [B, k] int
    ) -> torch.Tensor:
        """vLLM V0's acceptance mask, [B, k] bool: q_i(x_i) > min(posterior_threshold,
        posterior_alpha * exp(-H(q_i))) at every position (not only the accepted prefix).

        The same test as the sampler's op (:func:`spec_samplers.reference.typical_accepts`, in
        float64): NaN, Inf and negative probabilities count as 0, ids outside [0, V) are never
        accepted (V0 would index out of bounds)."""
        B, k, V = target_probs.shape
        q = clean_probs(target_probs.reshape(B * k, V))
        valid, ids = valid_ids(draft_token_ids.reshape(B * k), V)
        candidate = q.gather(1, ids[:, None]).squeeze(1) if B * k else q.new_zeros(0)
        accepted = typical_accepts(q, candidate, self.posterior_threshold, self.posterior_alpha)
        return (valid & accepted).view(B, k)

    def _get_recovered_token_ids(self, target_probs: torch.Tensor) -> torch.Tensor:  # [B, k, V] -> [B, k]
        """vLLM V0's substitute tokens, [B, k] int64: argmax q_i at every position (-1 where q_i
        has no probability mass, which V0 would answer with token 0)."""
        q = clean_probs(target_probs)
        return torch.where(q.amax(dim=-1) > 0, torch.argmax(q, dim=-1), PLACEHOLDER_TOKEN_ID)
