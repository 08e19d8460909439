"""The CPU path's seeded draws, compiled (numba kernels in ``_draw_kernels``):

* :func:`draw_from_logits`: softmax(logits / T) and the recovery race of one position, for the
  requests of an engine step that have no drafts (``integrations.vllm.fast_path.verify_plain_step``);
* :func:`sample_rows`: ``sampling_from_probs`` and ``sampling_from_logits`` without filters
  (``sampling.api._sample``);
* :func:`decode_rows`: the decoding loop's draw of draft, bonus and plain tokens
  (``decoding.strategy.draw``): its per-draw seed and that sample in one pass;
* :func:`sample_filtered_rows`, :func:`renorm_rows`, :func:`mask_logits_rows`: the filtered
  sampling operations (top-k, top-p, min-p), their renormalisation and top-k's logits mask
  (``_filter_kernels``: thresholds by a radix select, no sort)."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

import numpy as np
import torch

from spec_samplers.cpu import kernels
from spec_samplers.sampling import reference


def _kernels() -> ModuleType | None:
    """The draw kernel's module, or None while the compiled CPU path is not ready (``cpu.kernels``:
    numba missing, or its code still compiling in the background)."""
    return None if kernels() is None else _module()


@functools.cache
def _module() -> ModuleType:
    return importlib.import_module("spec_samplers.cpu._draw_kernels")


@functools.cache
def _filter_module() -> ModuleType:
    return importlib.import_module("spec_samplers.cpu._filter_kernels")


def _own_rows(x: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the rows of x the outputs read, copied in output order; their map: b, or -1 where rows[b]
    lies outside [0, R)): a logits call's copy, which the reference's cleaning then owns."""
    R = x.shape[0]
    own = x.index_select(0, rows.clamp(0, R - 1))
    return own, torch.where((rows >= 0) & (rows < R), torch.arange(rows.shape[0]), -1)


def _array(t: torch.Tensor) -> Any:
    """A numpy view of a CPU tensor, contiguous (one compiled specialisation per dtype)."""
    return (t if t.is_contiguous() and not t.requires_grad else t.detach().contiguous()).numpy()


def _u64(t: torch.Tensor) -> Any:
    """The kernels' seeds and offsets: an int64 tensor's numpy view as uint64 (two's complement)."""
    return _array(t.to(torch.int64)).view("uint64")


def available(logits: torch.Tensor) -> bool:
    """Whether :func:`draw_from_logits` (or :func:`sample_rows`) runs on these rows: fp32 [R, V]
    on the CPU with a vocabulary, and numba installed."""
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
    module = _module()  # (numba imports: available() said so)
    B = logits.shape[0]
    out = torch.empty(B, dtype=torch.int64)
    zeros = torch.zeros(B, dtype=torch.int64) if offsets is None else offsets
    module.draw_rows_kernel(
        _array(logits),
        _array(temperature.to(torch.float32)),
        _u64(seeds),
        _u64(zeros),
        position,
        out.numpy(),
    )
    return out


def softmax_rows(
    logits: torch.Tensor,  # [B, V] fp32 CPU (available)
    temperature: torch.Tensor,  # [B] float, 0 = greedy
) -> torch.Tensor:
    """[B, V] fp32 ``torch_ops.probs_from_logits(logits, temperature)``, compiled (one pass per row
    into the output, no temporary; the row's sum in fp64 and exp2 correctly rounded: the events of
    docs/cpu.md, "Tokens"). The CPU path of ``sampling.softmax``."""
    out = torch.empty(logits.shape, dtype=torch.float32)
    _module().softmax_rows_kernel(_array(logits), _array(temperature.to(torch.float32)), out.numpy())
    return out


def sample_rows(
    x: torch.Tensor,  # [R, V] fp32 CPU (available), R > 0: unnormalised probabilities, or logits
    rows: torch.Tensor,  # [B] int64: the input row of each output (outside [0, R): no row)
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
    logits: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B] int64, valid [B] bool): ``sampling.reference.sample_reference(x, rows, seeds,
    offsets, logits)`` without filters, the same tokens (the race's group sums in fp64 here too,
    summed in another order: docs/cpu.md, "Tokens"), the race compiled, one pass per output row.
    Logits become the reference's weights exp(x - max) in torch first (its vectorised exp: numba's
    scalar expf is 5x slower and differs from it in the last bit of about 1% of entries)."""
    module = _module()  # (numba imports: available() said so)
    if logits:
        x, rows = _own_rows(x, rows)
        # (a row without a finite or +inf logit weighs 0 everywhere: the kernel gives it -1)
        x = reference.logit_weights(reference.clean_logits(x, True), True)
    out = torch.empty(rows.shape[0], dtype=torch.int64)
    module.sample_rows_kernel(
        _array(x),
        _array(rows.to(torch.int64)),
        _u64(seeds),
        _u64(offsets),
        out.numpy(),
    )
    return out, out >= 0


def decode_rows(
    probs: torch.Tensor,  # [N, V] fp32 CPU (available), unnormalised rows
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
    position: int,
    stream: int,  # one of rng.STREAM_DECODE_*
) -> torch.Tensor:
    """[N] int64: ``sampling_from_probs(probs, seed=rng.derive_seeds(seeds, offsets, position,
    stream), offset=0)``, the same tokens, without the eager Philox of the seeds."""
    module = _module()  # (numba imports: available() said so)
    out = torch.empty(probs.shape[0], dtype=torch.int64)
    module.decode_rows_kernel(
        _array(probs),
        _u64(seeds),
        _u64(offsets),
        position,
        np.uint64(stream),
        out.numpy(),
    )
    return out


def _param(t: torch.Tensor | None, dtype: torch.dtype) -> Any:
    """A filter's [B] parameters as the kernels read them (an empty array when the filter is off)."""
    return _array((torch.zeros(0) if t is None else t).to(dtype))


def sample_filtered_rows(
    x: torch.Tensor,  # [R, V] fp32 CPU (available), R > 0: unnormalised probabilities, or logits
    rows: torch.Tensor,  # [B] int64: the input row of each output (outside [0, R): no row)
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
    logits: bool,
    top_k: torch.Tensor | None,  # [B] int64 (validation.canonical_top_k)
    top_p: torch.Tensor | None,  # [B] fp32 (validation.canonical_top_p)
    min_p: torch.Tensor | None,  # [B] fp32 (validation.canonical_min_p), finite
    joint: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B] int64, valid [B] bool): ``sampling.reference.sample_reference`` with filters,
    the same tokens (the race's group sums in fp64 in another order: docs/cpu.md, "Tokens"), one
    compiled pass per output row for its maximum, a radix select per threshold and the race.
    Logits become the reference's values and weights in torch first (as :func:`sample_rows`)."""
    module = _filter_module()  # (numba imports: available() said so)
    w = x
    if logits:
        x, rows = _own_rows(x, rows)
        x, w = reference.values_and_weights(x, True, owned=True)
    xa = _array(x)
    out = torch.empty(rows.shape[0], dtype=torch.int64)
    module.sample_filtered_kernel(
        xa,
        xa if w is x else _array(w),
        not logits,
        _array(rows.to(torch.int64)),
        _u64(seeds),
        _u64(offsets),
        _param(top_k, torch.int64),
        _param(top_p, torch.float32),
        _param(min_p, torch.float32),
        top_k is not None,
        top_p is not None,
        min_p is not None,
        joint,
        out.numpy(),
    )
    return out, out >= 0


def renorm_rows(
    probs: torch.Tensor,  # [B, V] fp32 CPU (available)
    top_k: torch.Tensor | None,  # [B] int64
    top_p: torch.Tensor | None,  # [B] fp32
) -> torch.Tensor:
    """[B, V] fp32: ``sampling.reference.renorm_reference(probs, top_k, top_p)``, bit for bit."""
    module = _filter_module()  # (numba imports: available() said so)
    out = torch.empty(probs.shape, dtype=torch.float32)
    module.renorm_kernel(
        _array(probs),
        _param(top_k, torch.int64),
        _param(top_p, torch.float32),
        top_k is not None,
        top_p is not None,
        out.numpy(),
    )
    return out


def mask_logits_rows(
    logits: torch.Tensor,  # [B, V] fp32 CPU (available)
    top_k: torch.Tensor,  # [B] int64
) -> torch.Tensor:
    """[B, V] fp32: ``sampling.reference.mask_logits_reference(logits, top_k)``, bit for bit."""
    module = _filter_module()  # (numba imports: available() said so)
    out = torch.empty(logits.shape, dtype=torch.float32)
    module.mask_logits_kernel(_array(logits), _param(top_k, torch.int64), out.numpy())
    return out
