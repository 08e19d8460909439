"""Low-level operators of a logits pipeline (FlashInfer's ``Op``): one typed step each.

A :class:`~spec_samplers.logits_processor.LogitsProcessor` legalizes into ops; the compiler
type-checks the op list, runs the validity checks and fuses windows of ops. An op declares the
:class:`TensorType` it takes (``IN``) and gives (``OUT``) and is called on a
:class:`TaggedTensor` with the pipe's runtime keyword arguments.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from spec_samplers.logits_processor.types import TaggedTensor, TensorType


class CompileError(ValueError):
    """An invalid pipeline: empty, a type mismatch, a failed validity check."""


class Op(ABC):
    """One step of a compiled pipeline.

    Subclasses set ``IN`` and ``OUT`` and implement ``__call__(tensor, **kwargs) -> TaggedTensor``.
    ``params`` (given at construction) are defaults that runtime keyword arguments of the same
    name override. ``processor`` is the :class:`LogitsProcessor` class the op was legalized from
    (set by the pipe; fusion patterns may name it), ``fused_from`` the ops a fusion replaced.

    Example::

        >>> class Negate(Op):
        ...     IN = OUT = TensorType.LOGITS
        ...     def __call__(self, tensor, **kwargs):
        ...         return TaggedTensor.logits(-tensor.data)
    """

    IN: ClassVar[TensorType | None] = None
    OUT: ClassVar[TensorType | None] = None

    def __init__(self, **params: Any):
        if self.IN is None or self.OUT is None:
            raise TypeError(f"operator {type(self).__name__} must define the IN and OUT tensor types")
        self.params: dict[str, Any] = dict(params)
        self.processor: type | None = None
        self.fused_from: tuple[Op, ...] = ()

    @property
    def default_params(self) -> dict[str, Any]:
        """FlashInfer's name for :attr:`params`."""
        return self.params

    @abstractmethod
    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        raise NotImplementedError

    def param(self, name: str, kwargs: dict[str, Any], required: bool = True) -> Any:
        """The runtime value of ``name``: from ``kwargs``, else the construction default."""
        if name in kwargs:
            return kwargs[name]
        if name in self.params:
            return self.params[name]
        if required:
            raise ValueError(
                f"{type(self).__name__}: runtime parameter {name!r} is required (pass {name}=... to the pipe)"
            )
        return None

    def check_input(self, tensor: TaggedTensor) -> TensorType:
        """Raise unless ``tensor`` has this op's input type; returns the output type."""
        if not isinstance(tensor, TaggedTensor) or tensor.type != self.IN:
            got = tensor.type if isinstance(tensor, TaggedTensor) else type(tensor).__name__
            raise ValueError(f"{type(self).__name__}: expected a {self.IN} tensor, got {got}")
        assert self.OUT is not None
        return self.OUT

    def __repr__(self) -> str:
        return type(self).__name__


#: FlashInfer spells an op with construction-time defaults ``ParameterizedOp``; every op here has them
ParameterizedOp = Op
