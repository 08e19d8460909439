"""The built-in ops: each calls one :mod:`spec_samplers.sampling` operation (FlashInfer's names),
so the PyTorch reference runs on CPU and the Triton kernels on CUDA.

Runtime parameters (``temperature``, ``top_k``, ``top_p``, ``min_p``) are a scalar for the batch
or a [B] tensor with one value per row; sampling ops also take ``indices``, ``generator``,
``seed`` and ``offset`` (scalars or [B] int64 tensors: the counter RNG of
:mod:`spec_samplers.sampling`). Every op takes ``backend`` ("auto", "torch", "triton").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from spec_samplers.constants import input_error
from spec_samplers.logits_processor.op import Op
from spec_samplers.logits_processor.types import TaggedTensor, TensorType


def _sampling() -> Any:
    # imported on first use; the operations module, not the package: the package also holds
    # chain_speculative_sampling, which sits above the samplers (tests/test_layers.py)
    from spec_samplers.sampling import api

    return api


def _backend(op: Op, kwargs: dict[str, Any]) -> str:
    return str(op.param("backend", kwargs, required=False) or "auto")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_temperature(value: object) -> torch.Tensor | float:
    """A scalar >= 0 and finite (0: greedy, the one-hot of the argmax) or a [B] float tensor."""
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            raise input_error("temperature", "a float or a float tensor", value.dtype)
        return value
    if not _is_number(value) or not math.isfinite(float(value)) or float(value) < 0:  # type: ignore[arg-type]
        raise input_error("temperature", "a finite number >= 0 (0 = greedy) or a [B] tensor", repr(value))
    return float(value)  # type: ignore[arg-type]


def check_top_k(value: object) -> torch.Tensor | int:
    """An int (0 or -1: off, as vLLM; >= 1: keep the k largest, ties kept) or a [B] int tensor."""
    if isinstance(value, torch.Tensor):
        return value
    if not isinstance(value, int) or isinstance(value, bool) or value < -1:
        raise input_error("top_k", "an int >= 1, or 0 / -1 (off), or a [B] int tensor", repr(value))
    return max(value, 0)


def check_top_p(value: object) -> torch.Tensor | float:
    if isinstance(value, torch.Tensor):
        return value
    if not _is_number(value) or not 0.0 < float(value) <= 1.0:  # type: ignore[arg-type]
        raise input_error("top_p", "a number in (0, 1] or a [B] tensor", repr(value))
    return float(value)  # type: ignore[arg-type]


def check_min_p(value: object) -> torch.Tensor | float:
    if isinstance(value, torch.Tensor):
        return value
    if not _is_number(value) or not 0.0 <= float(value) <= 1.0:  # type: ignore[arg-type]
        raise input_error("min_p", "a number in [0, 1] or a [B] tensor", repr(value))
    return float(value)  # type: ignore[arg-type]


def _row_param(value: torch.Tensor | float, rows: int, device: torch.device) -> torch.Tensor:
    """[rows] fp32 of a scalar or a [rows] tensor."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.shape[0] != rows:
            raise input_error("parameter tensor", f"shape ({rows},) (one per row)", f"shape {tuple(value.shape)}")
        return value.to(device=device, dtype=torch.float32)
    return torch.full((rows,), float(value), dtype=torch.float32, device=device)


def min_p_renorm_probs(
    probs: torch.Tensor,  # [B, V] fp32/fp16/bf16
    min_p: torch.Tensor | float,  # scalar or [B] in [0, 1]
) -> torch.Tensor:
    """[B, V] fp32: keep p(x) >= min_p * max p (the most probable tokens always stay), zero the
    rest, renormalise. The min-p step of vLLM's processing (FlashInfer has no renorm op for it).
    NaN, Inf and negative entries count as 0; a row without mass stays zero.

    Example::

        >>> min_p_renorm_probs(torch.tensor([[0.6, 0.3, 0.1]]), 0.2)
        tensor([[0.6667, 0.3333, 0.0000]])
    """
    p = probs.to(torch.float32)
    p = torch.where(torch.isfinite(p) & (p > 0), p, torch.zeros((), device=p.device))
    m = _row_param(check_min_p(min_p), p.shape[0], p.device)
    row_max = p.amax(dim=-1) if p.shape[-1] else torch.zeros(p.shape[0], device=p.device)
    threshold = torch.minimum(m * row_max, row_max)  # min_p > 1 (unchecked tensors) keeps the max
    kept = torch.where(p >= threshold[:, None], p, torch.zeros((), device=p.device))
    total = kept.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, kept / torch.where(total > 0, total, 1.0), 0.0)


def greedy_logits(
    logits: torch.Tensor,  # [B, V] float
    temperature: torch.Tensor,  # [B] fp32, rows with 0 are greedy
) -> torch.Tensor:
    """[B, V] fp32 logits / T; a row with T == 0 becomes 0 at its argmax (lowest index on ties)
    and -inf elsewhere, so any later softmax is its one-hot. T that is not > 0 otherwise acts as 1."""
    x = logits.to(torch.float32)
    x = torch.where(torch.isnan(x), torch.full((), float("-inf"), device=x.device), x)
    t = torch.where(temperature > 0, temperature, torch.ones((), device=x.device))
    scaled = x / t[:, None]
    if x.shape[-1] == 0:
        return scaled
    top = torch.arange(x.shape[-1], device=x.device)[None, :] == x.argmax(dim=-1, keepdim=True)
    onehot = torch.where(top, 0.0, float("-inf"))
    return torch.where((temperature == 0)[:, None], onehot, scaled)


def temperature_logits(
    logits: torch.Tensor,  # [B, V] float
    temperature: torch.Tensor | float,  # scalar or [B]
) -> torch.Tensor:
    """[B, V] fp32: :func:`greedy_logits` with a scalar or per-row temperature."""
    return greedy_logits(logits, _row_param(temperature, logits.shape[0], logits.device))


#: the check of each runtime filter parameter (the value the op passes on)
PARAM_CHECKS: dict[str, Callable[[object], Any]] = {
    "temperature": check_temperature,
    "top_k": check_top_k,
    "top_p": check_top_p,
    "min_p": check_min_p,
}
LOGITS, PROBS, INDICES = TensorType.LOGITS, TensorType.PROBS, TensorType.INDICES


class CallOp(Op):
    """A built-in op: checks its runtime parameters (``params``, in order) and calls
    ``call(tensor, *params)``, where ``call`` names a :mod:`spec_samplers.sampling` operation
    (given the pipe's ``backend``, and when the op outputs INDICES the sampling arguments
    ``indices``, ``deterministic``, ``generator``, ``seed``, ``offset``) or is a function of this
    module. PROBS outputs are fp32. Declared by class keywords::

        class TopPOp(CallOp, io=(PROBS, PROBS), call="top_p_renorm_probs", params=("top_p",)): ...
    """

    CALL: ClassVar[str | Callable[..., torch.Tensor]]
    PARAMS: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(
        cls,
        io: tuple[TensorType, TensorType] | None = None,
        call: str | Callable[..., torch.Tensor] = "",
        params: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if io is not None:
            cls.IN, cls.OUT = io
            # a plain function stored on the class would bind as a method of the op
            cls.CALL = call if isinstance(call, str) else staticmethod(call)
            cls.PARAMS = params

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        values = [PARAM_CHECKS[name](self.param(name, kwargs)) for name in self.PARAMS]
        if not isinstance(self.CALL, str):
            return TaggedTensor(self.CALL(tensor.data, *values), out)
        extra: dict[str, Any] = {"backend": _backend(self, kwargs)}
        if out == INDICES:
            extra.update(self._sample_kwargs(kwargs))
        result = getattr(_sampling(), self.CALL)(tensor.data, *values, **extra)
        return TaggedTensor(result.to(torch.float32) if out == PROBS else result, out)

    def _sample_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        sample = {name: self.param(name, kwargs, required=False) for name in ("indices", "generator", "seed", "offset")}
        sample["deterministic"] = self.param("deterministic", kwargs, required=False) is not False
        if self.PARAMS == ("top_k", "top_p"):  # ``joint_topk_topp`` from TopK picks FlashInfer's order
            sample["filter_apply_order"] = "joint" if self.params.get("joint_topk_topp") else "top_k_first"
        return sample


# -- logits -> logits ---------------------------------------------------------------------------


class TemperatureOp(CallOp, io=(LOGITS, LOGITS), call=temperature_logits, params=("temperature",)):
    """LOGITS -> LOGITS: logits / temperature (T == 0: greedy, see :func:`greedy_logits`)."""


class LogitsTopKOp(CallOp, io=(LOGITS, LOGITS), call="top_k_mask_logits", params=("top_k",)):
    """LOGITS -> LOGITS: logits below the k-th largest set to -inf (ties kept);
    :func:`spec_samplers.sampling.top_k_mask_logits`."""


# -- logits -> probs ----------------------------------------------------------------------------


class SoftmaxOp(CallOp, io=(LOGITS, PROBS), call="softmax"):
    """LOGITS -> PROBS: :func:`spec_samplers.sampling.softmax` (fp32)."""


class FusedTemperatureSoftmaxOp(CallOp, io=(LOGITS, PROBS), call="softmax", params=("temperature",)):
    """LOGITS -> PROBS: softmax(logits / temperature) in one pass (T == 0: one-hot of the argmax);
    :func:`spec_samplers.sampling.softmax`."""


# -- probs -> probs -----------------------------------------------------------------------------


class ProbsTopKOp(CallOp, io=(PROBS, PROBS), call="top_k_renorm_probs", params=("top_k",)):
    """PROBS -> PROBS: the top-k survivors (ties kept) renormalised;
    :func:`spec_samplers.sampling.top_k_renorm_probs`."""


class TopPOp(CallOp, io=(PROBS, PROBS), call="top_p_renorm_probs", params=("top_p",)):
    """PROBS -> PROBS: the top-p survivors renormalised; :func:`spec_samplers.sampling.top_p_renorm_probs`."""


class MinPOp(CallOp, io=(PROBS, PROBS), call=min_p_renorm_probs, params=("min_p",)):
    """PROBS -> PROBS: keep p >= min_p * max p, renormalised (:func:`min_p_renorm_probs`)."""


# -- sampling (-> indices) ----------------------------------------------------------------------


class ProbsSampleOp(CallOp, io=(PROBS, INDICES), call="sampling_from_probs"):
    """PROBS -> INDICES: :func:`spec_samplers.sampling.sampling_from_probs`."""


class LogitsSampleOp(CallOp, io=(LOGITS, INDICES), call="sampling_from_logits"):
    """LOGITS -> INDICES: :func:`spec_samplers.sampling.sampling_from_logits` (no probabilities written)."""


class FusedProbsTopKSampleOp(CallOp, io=(PROBS, INDICES), call="top_k_sampling_from_probs", params=("top_k",)):
    """PROBS -> INDICES: top-k then sample in one pass; :func:`spec_samplers.sampling.top_k_sampling_from_probs`."""


class FusedProbsTopPSampleOp(CallOp, io=(PROBS, INDICES), call="top_p_sampling_from_probs", params=("top_p",)):
    """PROBS -> INDICES: top-p then sample in one pass; :func:`spec_samplers.sampling.top_p_sampling_from_probs`."""


class FusedProbsMinPSampleOp(CallOp, io=(PROBS, INDICES), call="min_p_sampling_from_probs", params=("min_p",)):
    """PROBS -> INDICES: min-p then sample in one pass; :func:`spec_samplers.sampling.min_p_sampling_from_probs`."""


class FusedProbsTopKTopPSampleOp(
    CallOp, io=(PROBS, INDICES), call="top_k_top_p_sampling_from_probs", params=("top_k", "top_p")
):
    """PROBS -> INDICES: top-k, top-p and sample in one pass;
    :func:`spec_samplers.sampling.top_k_top_p_sampling_from_probs`. ``joint_topk_topp`` (from
    :class:`TopK`) applies both filters to the full row; otherwise top-p runs on the top-k
    survivors, which is what the unfused TopK -> TopP -> Sample computes."""
