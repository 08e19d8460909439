"""Typical acceptance (Medusa, Cai et al. 2024, section 3.3.1): lossy and deterministic."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from spec_samplers.base import SpecDecodeDeterministicBaseSampler
from spec_samplers.reference import typical_reference


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

    lossless: ClassVar[bool] = False
    reference_op = staticmethod(typical_reference)
    kernel_op = "spec_samplers.kernels.typical_launch:typical_triton"

    def __init__(
        self,
        posterior_threshold: float = 0.09,
        posterior_alpha: float = 0.3,
        strict_mode: bool = False,
        backend: str = "auto",
    ):
        super().__init__(strict_mode=strict_mode, backend=backend)
        self.posterior_threshold = _check_option("posterior_threshold", posterior_threshold)
        self.posterior_alpha = _check_option("posterior_alpha", posterior_alpha)

    def op_options(self) -> dict[str, Any]:
        return {"posterior_threshold": self.posterior_threshold, "posterior_alpha": self.posterior_alpha}
