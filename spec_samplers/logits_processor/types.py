"""Semantic tensor types of a logits pipeline (FlashInfer's ``TensorType`` / ``TaggedTensor``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

import torch


class TensorType(Enum):
    """What a tensor flowing through a :class:`~spec_samplers.logits_processor.LogitsPipe` holds."""

    LOGITS = auto()  #: real-valued scores, -inf for masked tokens
    PROBS = auto()  #: non-negative probabilities (normalised by every built-in op)
    INDICES = auto()  #: integer token ids: terminal, nothing may follow

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"TensorType.{self.name}"


@dataclass(frozen=True)
class TaggedTensor:
    """A tensor with its :class:`TensorType`, so each op can check what it is given.

    Users pass plain tensors to a pipe; it tags them with its input type. Example::

        >>> t = TaggedTensor.logits(torch.zeros(2, 8))
        >>> t.type, tuple(t.shape)
        (TensorType.LOGITS, (2, 8))
    """

    data: torch.Tensor  # [B, V] float (LOGITS, PROBS) or [B] int (INDICES)
    type: TensorType

    @staticmethod
    def logits(t: torch.Tensor) -> TaggedTensor:
        return TaggedTensor(t, TensorType.LOGITS)

    @staticmethod
    def probs(t: torch.Tensor) -> TaggedTensor:
        return TaggedTensor(t, TensorType.PROBS)

    @staticmethod
    def indices(t: torch.Tensor) -> TaggedTensor:
        return TaggedTensor(t, TensorType.INDICES)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.data.size() if dim is None else self.data.size(dim)

    def __repr__(self) -> str:
        return f"TaggedTensor(type={self.type}, shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"
