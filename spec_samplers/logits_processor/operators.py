"""The built-in ops: each calls one :mod:`spec_samplers.sampling` operation (FlashInfer's names),
so the PyTorch reference runs on CPU and the Triton kernels on CUDA.

Runtime parameters (``temperature``, ``top_k``, ``top_p``, ``min_p``) are a scalar for the batch
or a [B] tensor with one value per row; sampling ops also take ``indices``, ``generator``,
``seed`` and ``offset`` (scalars or [B] int64 tensors: the counter RNG of
:mod:`spec_samplers.sampling`). Every op takes ``backend`` ("auto", "torch", "triton").
"""

from __future__ import annotations

import math
from typing import Any

import torch

from spec_samplers.errors import input_error
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


# -- logits -> logits ---------------------------------------------------------------------------


class TemperatureOp(Op):
    """LOGITS -> LOGITS: logits / temperature (T == 0: greedy, see :func:`greedy_logits`)."""

    IN = TensorType.LOGITS
    OUT = TensorType.LOGITS

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        t = check_temperature(self.param("temperature", kwargs))
        x = tensor.data
        return TaggedTensor(greedy_logits(x, _row_param(t, x.shape[0], x.device)), out)


class LogitsTopKOp(Op):
    """LOGITS -> LOGITS: logits below the k-th largest set to -inf (ties kept);
    :func:`spec_samplers.sampling.top_k_mask_logits`."""

    IN = TensorType.LOGITS
    OUT = TensorType.LOGITS

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        k = check_top_k(self.param("top_k", kwargs))
        return TaggedTensor(_sampling().top_k_mask_logits(tensor.data, k, backend=_backend(self, kwargs)), out)


# -- logits -> probs ----------------------------------------------------------------------------


class SoftmaxOp(Op):
    """LOGITS -> PROBS: :func:`spec_samplers.sampling.softmax` (fp32)."""

    IN = TensorType.LOGITS
    OUT = TensorType.PROBS

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        return TaggedTensor(_sampling().softmax(tensor.data, backend=_backend(self, kwargs)), out)


class FusedTemperatureSoftmaxOp(Op):
    """LOGITS -> PROBS: softmax(logits / temperature) in one pass (T == 0: one-hot of the argmax);
    :func:`spec_samplers.sampling.softmax`."""

    IN = TensorType.LOGITS
    OUT = TensorType.PROBS

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        t = check_temperature(self.param("temperature", kwargs))
        return TaggedTensor(_sampling().softmax(tensor.data, temperature=t, backend=_backend(self, kwargs)), out)


# -- probs -> probs -----------------------------------------------------------------------------


class ProbsTopKOp(Op):
    """PROBS -> PROBS: the top-k survivors (ties kept) renormalised;
    :func:`spec_samplers.sampling.top_k_renorm_probs`."""

    IN = TensorType.PROBS
    OUT = TensorType.PROBS

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        k = check_top_k(self.param("top_k", kwargs))
        probs = _sampling().top_k_renorm_probs(tensor.data, k, backend=_backend(self, kwargs))
        return TaggedTensor(probs.to(torch.float32), out)


class TopPOp(Op):
    """PROBS -> PROBS: the top-p survivors renormalised; :func:`spec_samplers.sampling.top_p_renorm_probs`."""

    IN = TensorType.PROBS
    OUT = TensorType.PROBS

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        p = check_top_p(self.param("top_p", kwargs))
        return TaggedTensor(_sampling().top_p_renorm_probs(tensor.data, p, backend=_backend(self, kwargs)), out)


class MinPOp(Op):
    """PROBS -> PROBS: keep p >= min_p * max p, renormalised (:func:`min_p_renorm_probs`)."""

    IN = TensorType.PROBS
    OUT = TensorType.PROBS

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        return TaggedTensor(min_p_renorm_probs(tensor.data, self.param("min_p", kwargs)), out)


# -- sampling (-> indices) ----------------------------------------------------------------------


def _sample_kwargs(op: Op, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        "indices": op.param("indices", kwargs, required=False),
        "deterministic": bool(op.param("deterministic", kwargs, required=False) is not False),
        "generator": op.param("generator", kwargs, required=False),
        "seed": op.param("seed", kwargs, required=False),
        "offset": op.param("offset", kwargs, required=False),
        "backend": _backend(op, kwargs),
    }


class ProbsSampleOp(Op):
    """PROBS -> INDICES: :func:`spec_samplers.sampling.sampling_from_probs`."""

    IN = TensorType.PROBS
    OUT = TensorType.INDICES

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        return TaggedTensor(_sampling().sampling_from_probs(tensor.data, **_sample_kwargs(self, kwargs)), out)


class LogitsSampleOp(Op):
    """LOGITS -> INDICES: :func:`spec_samplers.sampling.sampling_from_logits` (no probabilities written)."""

    IN = TensorType.LOGITS
    OUT = TensorType.INDICES

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        return TaggedTensor(_sampling().sampling_from_logits(tensor.data, **_sample_kwargs(self, kwargs)), out)


class FusedProbsTopKSampleOp(Op):
    """PROBS -> INDICES: top-k then sample in one pass; :func:`spec_samplers.sampling.top_k_sampling_from_probs`."""

    IN = TensorType.PROBS
    OUT = TensorType.INDICES

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        k = check_top_k(self.param("top_k", kwargs))
        return TaggedTensor(_sampling().top_k_sampling_from_probs(tensor.data, k, **_sample_kwargs(self, kwargs)), out)


class FusedProbsTopPSampleOp(Op):
    """PROBS -> INDICES: top-p then sample in one pass; :func:`spec_samplers.sampling.top_p_sampling_from_probs`."""

    IN = TensorType.PROBS
    OUT = TensorType.INDICES

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        p = check_top_p(self.param("top_p", kwargs))
        return TaggedTensor(_sampling().top_p_sampling_from_probs(tensor.data, p, **_sample_kwargs(self, kwargs)), out)


class FusedProbsMinPSampleOp(Op):
    """PROBS -> INDICES: min-p then sample in one pass; :func:`spec_samplers.sampling.min_p_sampling_from_probs`."""

    IN = TensorType.PROBS
    OUT = TensorType.INDICES

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        m = check_min_p(self.param("min_p", kwargs))
        return TaggedTensor(_sampling().min_p_sampling_from_probs(tensor.data, m, **_sample_kwargs(self, kwargs)), out)


class FusedProbsTopKTopPSampleOp(Op):
    """PROBS -> INDICES: top-k, top-p and sample in one pass;
    :func:`spec_samplers.sampling.top_k_top_p_sampling_from_probs`. ``joint_topk_topp`` (from
    :class:`TopK`) applies both filters to the full row; otherwise top-p runs on the top-k
    survivors, which is what the unfused TopK -> TopP -> Sample computes."""

    IN = TensorType.PROBS
    OUT = TensorType.INDICES

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        out = self.check_input(tensor)
        k = check_top_k(self.param("top_k", kwargs))
        p = check_top_p(self.param("top_p", kwargs))
        order = "joint" if self.params.get("joint_topk_topp") else "top_k_first"
        tokens = _sampling().top_k_top_p_sampling_from_probs(
            tensor.data, k, p, filter_apply_order=order, **_sample_kwargs(self, kwargs)
        )
        return TaggedTensor(tokens, out)
