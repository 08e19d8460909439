"""High-level processors (FlashInfer's ``LogitsProcessor`` family): what a pipeline is written
in. Each legalizes, for the tensor type it is given, into one or more :class:`Op`.

Construction keywords are stored in ``self.params`` and become the ops' defaults; runtime keyword
arguments of the pipe override them (``Temperature(temperature=0.7)`` or
``pipe(logits, temperature=0.7)``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from spec_samplers.logits_processor import operators as ops
from spec_samplers.logits_processor.op import Op
from spec_samplers.logits_processor.types import TensorType


class LogitsProcessor(ABC):
    """Base of every processor. Subclasses implement :meth:`legalize`.

    Example (a custom processor, as in FlashInfer's documentation)::

        >>> class Scale(LogitsProcessor):
        ...     def legalize(self, input_type):
        ...         return [ScaleOp(**self.params)]
        >>> class ScaleOp(Op):
        ...     IN = OUT = TensorType.LOGITS
        ...     def __call__(self, tensor, **kwargs):
        ...         return TaggedTensor.logits(tensor.data * self.param("factor", kwargs))
    """

    def __init__(self, **params: Any):
        self.params: dict[str, Any] = dict(params)

    @abstractmethod
    def legalize(self, input_type: TensorType) -> list[Op]:
        """The ops this processor runs as, given its input type; raise ValueError for a type it
        cannot take."""
        raise NotImplementedError

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({inner})"


def _only(processor: LogitsProcessor, input_type: TensorType, allowed: TensorType) -> None:
    if input_type != allowed:
        raise ValueError(f"{type(processor).__name__} can only be applied to {allowed}, got {input_type}")


class Temperature(LogitsProcessor):
    """LOGITS -> LOGITS: divide by ``temperature`` (runtime; scalar or [B]; 0 = greedy).
    Must come before :class:`Softmax`."""

    def legalize(self, input_type: TensorType) -> list[Op]:
        _only(self, input_type, TensorType.LOGITS)
        return [ops.TemperatureOp(**self.params)]


class Softmax(LogitsProcessor):
    """LOGITS -> PROBS. At most one per pipeline; fused with a preceding :class:`Temperature`."""

    def legalize(self, input_type: TensorType) -> list[Op]:
        _only(self, input_type, TensorType.LOGITS)
        return [ops.SoftmaxOp(**self.params)]


class TopK(LogitsProcessor):
    """Keep the ``top_k`` (runtime) largest entries, ties kept. LOGITS -> LOGITS (others set to
    -inf) or PROBS -> PROBS (others zeroed, renormalised). ``joint_topk_topp`` (construction):
    when followed by :class:`TopP` and :class:`Sample`, apply both filters to the full row."""

    def __init__(self, joint_topk_topp: bool = False, **params: Any):
        super().__init__(joint_topk_topp=joint_topk_topp, **params)

    def legalize(self, input_type: TensorType) -> list[Op]:
        if input_type == TensorType.LOGITS:
            return [ops.LogitsTopKOp(**self.params)]
        if input_type == TensorType.PROBS:
            return [ops.ProbsTopKOp(**self.params)]
        raise ValueError(f"TopK can only be applied to LOGITS or PROBS, got {input_type}")


class TopP(LogitsProcessor):
    """PROBS -> PROBS: keep the most probable tokens up to mass ``top_p`` (runtime, (0, 1]),
    renormalised."""

    def legalize(self, input_type: TensorType) -> list[Op]:
        _only(self, input_type, TensorType.PROBS)
        return [ops.TopPOp(**self.params)]


class MinP(LogitsProcessor):
    """PROBS -> PROBS: keep p >= ``min_p`` (runtime, [0, 1]) times the largest, renormalised."""

    def legalize(self, input_type: TensorType) -> list[Op]:
        _only(self, input_type, TensorType.PROBS)
        return [ops.MinPOp(**self.params)]


class Sample(LogitsProcessor):
    """LOGITS or PROBS -> INDICES: one token per row (runtime ``indices``, ``generator``,
    ``seed``, ``offset``). Terminal: nothing may follow it."""

    def __init__(self, deterministic: bool = True, **params: Any):
        super().__init__(deterministic=deterministic, **params)

    def legalize(self, input_type: TensorType) -> list[Op]:
        if input_type == TensorType.LOGITS:
            return [ops.LogitsSampleOp(**self.params)]
        if input_type == TensorType.PROBS:
            return [ops.ProbsSampleOp(**self.params)]
        raise ValueError(f"Sample can only be applied to LOGITS or PROBS, got {input_type}")
