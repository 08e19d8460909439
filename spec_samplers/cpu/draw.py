"""The CPU path's seeded draw from logits: softmax(logits / T) and the recovery race of one
position, compiled (numba kernel: ``_draw_kernels.draw_rows_kernel``), for the requests of an
engine step that have no drafts (``integrations.vllm.fast_path.verify_plain_step``)."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

import torch

from spec_samplers.cpu import kernels


@functools.cache
def _kernels() -> ModuleType | None:
    """The draw kernel's module, or None without numba (``cpu.kernels`` warned once)."""
    return None if kernels() is None else importlib.import_module("spec_samplers.cpu._draw_kernels")


def _array(t: torch.Tensor) -> Any:
    """A numpy view of a CPU tensor, contiguous (one compiled specialisation per dtype)."""
    return (t if t.is_contiguous() and not t.requires_grad else t.detach().contiguous()).numpy()


def available(logits: torch.Tensor) -> bool:
    """Whether :func:`draw_from_logits` runs on these logits: contiguous fp32 rows on the CPU with
    a vocabulary, and numba installed."""
    ok = logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2
    return ok and logits.shape[1] > 0 and _kernels() is not None


def draw_from_logits(
    logits: torch.Tensor,  # [B, V] fp32 CPU (available)
    temperature: torch.Tensor,  # [B] fp32, 0 = greedy
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None,  # [B] int64, None = 0
    position: int,  # the race's position j (counter base j << 32)
) -> torch.Tensor:
    """[B] int64: request b's token of the samplers' recovery race at ``position`` over
    ``torch_ops.probs_from_logits(logits, temperature)[b]`` (its argmax where T = 0; -1 where
    the row has no mass): what rejection sampling and block verification draw at a rejected
    position whose draft is out of range (docs/cpu.md)."""
    module = _kernels()
    assert module is not None, "draw_from_logits needs numba (check available())"
    B = logits.shape[0]
    out = torch.empty(B, dtype=torch.int64)
    zeros = torch.zeros(B, dtype=torch.int64) if offsets is None else offsets
    module.draw_rows_kernel(
        _array(logits),
        _array(temperature.to(torch.float32)),
        _array(seeds.to(torch.int64)).view("uint64"),  # (the kernels' seeds: uint64, two's complement)
        _array(zeros.to(torch.int64)).view("uint64"),
        position,
        out.numpy(),
    )
    return out
