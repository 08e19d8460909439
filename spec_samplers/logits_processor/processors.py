"""High-level processors (FlashInfer's ``LogitsProcessor`` family): what a pipeline is written
in. Each legalizes, for the tensor type it is given, into one or more :class:`Op`.

Construction keywords are stored in ``self.params`` and become the ops' defaults; runtime keyword
arguments of the pipe override them (``Temperature(temperature=0.7)`` or
``pipe(logits, temperature=0.7)``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

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


class BuiltinProcessor(LogitsProcessor):
    """A built-in processor: one op for each input type it takes, declared by the class keyword
    ``ops_by_input`` (input type -> op class): ``class TopP(BuiltinProcessor, ops_by_input={PROBS: ops.TopPOp})``."""

    OPS: ClassVar[dict[TensorType, type[Op]]] = {}

    def __init_subclass__(cls, ops_by_input: dict[TensorType, type[Op]] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if ops_by_input is not None:
            cls.OPS = ops_by_input

    def legalize(self, input_type: TensorType) -> list[Op]:
        if input_type not in self.OPS:
            allowed = " or ".join(map(str, self.OPS))
            raise ValueError(f"{type(self).__name__} can only be applied to {allowed}, got {input_type}")
        return [self.OPS[input_type](**self.params)]


LOGITS, PROBS = TensorType.LOGITS, TensorType.PROBS


class Temperature(BuiltinProcessor, ops_by_input={LOGITS: ops.TemperatureOp}):
    """LOGITS -> LOGITS: divide by ``temperature`` (runtime; scalar or [B]; 0 = greedy).
    Must come before :class:`Softmax`."""


class Softmax(BuiltinProcessor, ops_by_input={LOGITS: ops.SoftmaxOp}):
    """LOGITS -> PROBS. At most one per pipeline; fused with a preceding :class:`Temperature`."""


class TopK(BuiltinProcessor, ops_by_input={LOGITS: ops.LogitsTopKOp, PROBS: ops.ProbsTopKOp}):
    """Keep the ``top_k`` (runtime) largest entries, ties kept. LOGITS -> LOGITS (others set to
    -inf) or PROBS -> PROBS (others zeroed, renormalised). ``joint_topk_topp`` (construction):
    when followed by :class:`TopP` and :class:`Sample`, apply both filters to the full row."""

    def __init__(self, joint_topk_topp: bool = False, **params: Any):
        super().__init__(joint_topk_topp=joint_topk_topp, **params)


class TopP(BuiltinProcessor, ops_by_input={PROBS: ops.TopPOp}):
    """PROBS -> PROBS: keep the most probable tokens up to mass ``top_p`` (runtime, (0, 1]),
    renormalised."""


class MinP(BuiltinProcessor, ops_by_input={PROBS: ops.MinPOp}):
    """PROBS -> PROBS: keep p >= ``min_p`` (runtime, [0, 1]) times the largest, renormalised."""


class Sample(BuiltinProcessor, ops_by_input={LOGITS: ops.LogitsSampleOp, PROBS: ops.ProbsSampleOp}):
    """LOGITS or PROBS -> INDICES: one token per row (runtime ``indices``, ``generator``,
    ``seed``, ``offset``). Terminal: nothing may follow it."""

    def __init__(self, deterministic: bool = True, **params: Any):
        super().__init__(deterministic=deterministic, **params)
