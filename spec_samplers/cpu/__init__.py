"""The compiled CPU path: the samplers' verification as numba kernels on CPU tensors.

On CPU tensors with ``backend="auto"`` a sampler whose reference has a compiled twin here runs the
twin (:func:`compiled_op`, called by the one backend decision, ``base._choose_op``); ``"torch"``
keeps the PyTorch reference. The references stay the specification: the twins compute the same
operations in the same precision, and tests/test_cpu_path.py compares their tokens (docs/cpu.md).

numba is an optional extra (``pip install spec-samplers[cpu]``): without it the references run,
after a one-line warning (once per process).

Why numba (docs/cpu.md): the verification is a loop over a request's vocabulary with Philox in the
loop over the raced group and fp64 group sums; written as explicit loops, every float is the
reference's operation in the reference's precision, compiled once per machine (``cache=True``).
torch.compile re-traces per shape family and its first call costs seconds; a C++ operator needs a
compiler at install time.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from spec_samplers.layout import VerifyBatch

#: vocabulary entries of target rows per chunk of a logits batch on the compiled path: its only
#: temporaries are the chunk's probabilities (target and draft rows, fp32), so the extra peak
#: memory is about twice a chunk (8 MiB of fp32 each), and at V = 128256, K = 4 a chunk holds 3
#: requests. Probabilities inputs are read in place: no chunks.
COMPILED_CHUNK_ELEMENTS = 2**21


@functools.cache
def kernels() -> ModuleType | None:
    """The numba kernels module, or None (with a one-line warning, once) without numba."""
    try:
        module = importlib.import_module("spec_samplers.cpu._numba_kernels")
    # numba missing or broken (llvmlite's library fails to load under a small address-space cap,
    # an OSError): the references run
    except (ImportError, OSError) as exc:
        warnings.warn(
            f"spec_samplers: the compiled CPU path needs numba ({exc}); running the PyTorch references "
            "(pip install 'spec-samplers[cpu]')",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return module


def _np(t: torch.Tensor) -> Any:
    """A numpy view of a CPU tensor (contiguous: one compiled specialisation per dtype)."""
    return t.detach().contiguous().numpy()


def _verify_cpu(
    batch: VerifyBatch, kernel_name: str, reference: Callable[[VerifyBatch], torch.Tensor], sampler: str
) -> torch.Tensor:
    """Run the kernel ``kernel_name`` (rejection_kernel, block_kernel: one signature) on the
    batch's flat fp32 rows; the reference where numba is missing or there are no rows to read."""
    from spec_samplers.reference import _seeds_offsets, flat_inputs

    k = kernels()
    f = flat_inputs(batch)
    if k is None or f.target.shape[0] == 0 or (f.draft is not None and f.draft.shape[0] == 0):
        return reference(batch)  # (no rows to read: the reference's degenerate cases)
    seeds, offsets = _seeds_offsets(batch, sampler)
    B, K = f.draft_ids.shape
    out = torch.empty(B, K + 1, dtype=torch.int64)
    target = f.target.to(torch.float32)
    draft = target[:1] if f.draft is None else f.draft.to(torch.float32)
    greedy = f.is_greedy
    getattr(k, kernel_name)(
        _np(target),
        _np(f.target_rows),
        _np(draft),
        _np(f.draft_rows),
        f.draft is not None,
        _np(f.draft_ids.to(torch.int64)),
        _np(f.num_draft),
        _np(f.bonus.reshape(B).to(torch.int64)),
        _np(torch.zeros(B, dtype=torch.bool) if greedy is None else greedy.to(torch.bool)),
        greedy is not None,
        _np(seeds.to(torch.int64)).view("uint64"),
        _np(offsets.to(torch.int64)).view("uint64"),
        out.numpy(),
    )
    return out


def rejection_cpu(batch: VerifyBatch) -> torch.Tensor:
    """:func:`spec_samplers.reference.rejection_reference`, compiled. Returns [B, K+1] int64."""
    from spec_samplers.reference import rejection_reference

    return _verify_cpu(batch, "rejection_kernel", rejection_reference, "rejection sampling")


def block_cpu(batch: VerifyBatch) -> torch.Tensor:
    """:func:`spec_samplers.reference.block_reference`, compiled. Returns [B, K+1] int64."""
    from spec_samplers.reference import block_reference

    return _verify_cpu(batch, "block_kernel", block_reference, "block verification")


def run_compiled(op: Callable[..., torch.Tensor], batch: VerifyBatch, **options: object) -> torch.Tensor:
    """``op(batch, **options)``: whole when it reads its rows in place (fp32 probabilities), else
    (logits, or fp16 / bf16 rows: fp32 rows made first) :data:`COMPILED_CHUNK_ELEMENTS` entries of
    target rows at a time, which bounds those temporaries."""
    from spec_samplers.chunking import run_chunked

    if batch.temperature is None and batch.target.dtype == torch.float32:
        if batch.draft is None or batch.draft.dtype == torch.float32:
            return op(batch, **options)
    return run_chunked(op, batch, budget=COMPILED_CHUNK_ELEMENTS, **options)


def typical_cpu(batch: VerifyBatch, posterior_threshold: float, posterior_alpha: float) -> torch.Tensor:
    """:func:`spec_samplers.reference.typical_reference`, compiled. Returns [B, K+1] int64."""
    from spec_samplers.constants import ENTROPY_EPS_FP32, fp32_value
    from spec_samplers.reference import flat_inputs, typical_reference

    k = kernels()
    f = flat_inputs(batch)
    if k is None or f.target.shape[0] == 0:
        return typical_reference(batch, posterior_threshold, posterior_alpha)
    B, K = f.draft_ids.shape
    out = torch.empty(B, K + 1, dtype=torch.int64)
    k.typical_kernel(
        _np(f.target.to(torch.float32)),
        _np(f.target_rows),
        _np(f.draft_ids.to(torch.int64)),
        _np(f.num_draft),
        _np(f.bonus.reshape(B).to(torch.int64)),
        float(ENTROPY_EPS_FP32),
        fp32_value(posterior_threshold),
        fp32_value(posterior_alpha),
        out.numpy(),
    )
    return out


#: reference -> compiled twin (by name, so that importing this module imports no sampler)
_TWINS: dict[str, Callable[..., torch.Tensor]] = {
    "rejection_reference": rejection_cpu,
    "block_reference": block_cpu,
    "typical_reference": typical_cpu,
}


def compiled_op(reference: Callable[..., torch.Tensor], device: torch.device) -> Callable[..., torch.Tensor] | None:
    """The compiled twin of ``reference`` for tensors on ``device``, or None (not CPU, no twin, or
    numba missing: the caller runs the reference)."""
    if device.type != "cpu":
        return None
    twin = _TWINS.get(getattr(reference, "__name__", ""))
    if twin is None or getattr(reference, "__module__", "") != "spec_samplers.reference" or kernels() is None:
        return None
    return twin
