"""Argument checks and canonical forms of the FlashInfer-compatible sampling operations.

Metadata (types, ranks, shapes, dtypes, devices) and Python scalars are checked on every call at
no device cost. Values inside tensors (NaN in the inputs, per-request parameters out of range,
``indices`` out of range) need a host synchronisation, so they are checked only when the caller
asks with ``check_nan=True``; without it, out-of-range values have a defined, safe meaning (see
:func:`canonical_top_p` and friends) and never address memory out of bounds.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from spec_samplers.constants import SAMPLING_MAX_VOCAB_SIZE as MAX_VOCAB_SIZE
from spec_samplers.errors import input_error
from spec_samplers.rng import SEED_HIGH  # seeds drawn for seed=None lie in [0, SEED_HIGH)
from spec_samplers.validation import ID_DTYPES, PROBS_DTYPES, require_tensor, type_name

#: the input dtypes (the verification samplers' probability dtypes) and the index dtypes, defined
#: once in validation; the per-request parameter tensors may also be fp64
FLOAT_DTYPES = PROBS_DTYPES
PARAM_FLOAT_DTYPES = (*PROBS_DTYPES, torch.float64)
INT_DTYPES = ID_DTYPES
FILTER_ORDERS = ("top_k_first", "joint")


def _shape(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}"


def check_matrix(name: str, t: object, dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> torch.Tensor:
    """A [N, V] tensor of one of ``dtypes`` with 1 <= V < MAX_VOCAB_SIZE."""
    t = require_tensor(name, t)
    if t.dim() != 2:
        raise input_error(name, "a 2-d tensor (batch_size, vocab_size)", _shape(t))
    if t.dtype not in dtypes:
        raise input_error(name, "dtype in " + ", ".join(str(d) for d in dtypes), t.dtype)
    if not 1 <= t.shape[1] < MAX_VOCAB_SIZE:
        raise input_error(name, f"a vocabulary size in [1, {MAX_VOCAB_SIZE})", t.shape[1])
    return t


def check_no_nan(name: str, t: torch.Tensor) -> None:
    """``check_nan=True``: no NaN entries (synchronises with the host)."""
    if t.numel() and bool(torch.isnan(t).any()):
        raise input_error(name, "no NaN entries (check_nan=True)", "NaN entries")


def resolve_rows(
    indices: object, num_input_rows: int, device: torch.device, check_values: bool, input_name: str
) -> tuple[torch.Tensor | None, int, torch.dtype]:
    """(rows [B]: the input row of each output, ``indices`` as given (int32 or int64), B, output
    dtype). Without ``indices`` the outputs are the input rows (rows None: the kernels need no
    index tensor) and int32; with it, one output per entry, of its dtype."""
    if indices is None:
        return None, num_input_rows, torch.int32
    if not isinstance(indices, torch.Tensor):
        raise input_error("indices", "a torch.Tensor or None", type_name(indices))
    if indices.dim() != 1:
        raise input_error("indices", "a 1-d tensor (batch_size,)", _shape(indices))
    if indices.dtype not in INT_DTYPES:
        raise input_error("indices", "dtype torch.int32 or torch.int64", indices.dtype)
    if indices.device != device:
        raise input_error("indices", f"device {device} (that of {input_name})", f"device {indices.device}")
    if check_values and indices.numel():
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= num_input_rows:
            raise input_error(
                "indices", f"row indices in [0, {num_input_rows}) ({input_name} rows)", lo if lo < 0 else hi
            )
    return indices, indices.shape[0], indices.dtype


def flashinfer_shape_sentence(t: torch.Tensor, batch_size: int) -> str:
    """FlashInfer's own sentence for a per-request parameter tensor of the wrong shape (its
    ``check_tensor_param``), so that code matching FlashInfer's messages keeps working."""
    if t.dim() == 0:
        return (
            "Expected a 1D tensor of shape (batch_size,) or scalar for the sampling parameter, "
            "but got a 0-dimensional tensor."
        )
    if t.dim() > 1:
        return f"Expected a 1D tensor or scalar for the sampling parameter, but got a {t.dim()}D tensor."
    return (
        f"Sampling parameter tensor batch size mismatch: expected length {batch_size} to match the "
        f"reference tensor batch size, but got length {t.shape[0]}."
    )


def _param_tensor(name: str, t: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
    """A [B] per-request parameter tensor of any real dtype (bool, integer or floating point, as
    FlashInfer accepts; the caller converts it as FlashInfer does)."""
    if t.dim() != 1 or t.shape[0] != batch_size:
        raise input_error(
            name,
            f"a scalar or a tensor of shape ({batch_size},) (one per output)",
            f"{_shape(t)} (FlashInfer: {flashinfer_shape_sentence(t, batch_size)})",
        )
    if t.is_complex():
        raise input_error(name, "a real dtype (bool, integer or floating point)", t.dtype)
    if t.device != device:
        raise input_error(name, f"device {device}", f"device {t.device}")
    return t


def _float_scalar(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise input_error(name, "a float or a tensor", type_name(value))
    return float(value)


# Each per-request parameter has two forms: ``*_arg`` checks it and leaves it as given (a [B]
# tensor, any real dtype; a Python scalar made canonical on the host), which the kernels read and
# normalise in their prologue (no eager op per call); ``canonical_*`` makes the [B] tensor the
# PyTorch reference and the custom ops read. Both apply the same rules.


def top_k_arg(top_k: object, batch_size: int, vocab_size: int, device: torch.device) -> torch.Tensor | int:
    """top_k as the kernels read it: a checked [B] tensor, or an int with 0 meaning "keep every
    token" (FlashInfer: top_k <= 0 or >= V disables)."""
    if isinstance(top_k, torch.Tensor):
        return _param_tensor("top_k", top_k, batch_size, device)
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise input_error("top_k", "an int or a tensor", type_name(top_k))
    return top_k if 0 < top_k < vocab_size else 0


def canonical_top_k(top_k: object, batch_size: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """[B] int64 top_k; 0 means "keep every token" (FlashInfer: top_k <= 0 or >= V disables).

    A tensor of any real dtype is read as FlashInfer reads it (``.int()``): floating values are
    truncated toward zero, booleans are 0 / 1; NaN keeps every token."""
    t = top_k_arg(top_k, batch_size, vocab_size, device)
    if isinstance(t, int):
        return torch.full((batch_size,), t, dtype=torch.int64, device=device)
    if t.is_floating_point():  # truncate as .int() does, with NaN / inf defined (never a huge int)
        t = torch.nan_to_num(t.double(), nan=0.0, posinf=vocab_size, neginf=0.0).clamp(-1, vocab_size).trunc()
    t = t.to(torch.int64)
    return torch.where((t <= 0) | (t >= vocab_size), 0, t)


def top_p_arg(top_p: object, batch_size: int, device: torch.device, check_values: bool) -> torch.Tensor | float:
    """top_p as the kernels read it: a checked [B] tensor (its values checked in (0, 1] with
    ``check_values``, a host synchronisation), or a float in (0, 1]."""
    if isinstance(top_p, torch.Tensor):
        t = _param_tensor("top_p", top_p, batch_size, device)
        if check_values and batch_size:
            f = t.to(torch.float32)
            bad = ~((f > 0) & (f <= 1))
            if bool(bad.any()):
                raise input_error("top_p", "values in (0, 1]", float(f[bad][0]))
        return t
    value = _float_scalar("top_p", top_p)
    if not 0.0 < value <= 1.0:
        raise input_error("top_p", "a value in (0, 1]", value)
    return value


def canonical_top_p(top_p: object, batch_size: int, device: torch.device, check_values: bool) -> torch.Tensor:
    """[B] fp32 top_p in (0, 1]. Unchecked tensor values: NaN and values > 1 keep everything,
    values <= 0 keep only the most probable tokens."""
    t = top_p_arg(top_p, batch_size, device, check_values)
    if not isinstance(t, torch.Tensor):
        return torch.full((batch_size,), t, dtype=torch.float32, device=device)
    t = t.to(torch.float32)  # any real dtype (.float())
    return torch.where(torch.isnan(t) | (t > 1), 1.0, t)


def min_p_arg(min_p: object, batch_size: int, device: torch.device, check_values: bool) -> torch.Tensor | float:
    """min_p as the kernels read it: a checked [B] tensor (values checked in [0, 1] with
    ``check_values``), or a float in [0, 1]."""
    if isinstance(min_p, torch.Tensor):
        t = _param_tensor("min_p", min_p, batch_size, device)
        if check_values and batch_size:
            f = t.to(torch.float32)
            bad = ~((f >= 0) & (f <= 1))
            if bool(bad.any()):
                raise input_error("min_p", "values in [0, 1]", float(f[bad][0]))
        return t
    value = _float_scalar("min_p", min_p)
    if not 0.0 <= value <= 1.0:
        raise input_error("min_p", "a value in [0, 1]", value)
    return value


def canonical_min_p(min_p: object, batch_size: int, device: torch.device, check_values: bool) -> torch.Tensor:
    """[B] fp32 min_p in [0, 1]. Unchecked tensor values: NaN counts as 0 (keep everything);
    values > 1 keep only the most probable tokens, negative values keep everything."""
    t = min_p_arg(min_p, batch_size, device, check_values)
    if not isinstance(t, torch.Tensor):
        return torch.full((batch_size,), t, dtype=torch.float32, device=device)
    t = t.to(torch.float32)  # any real dtype (.float())
    return torch.where(torch.isnan(t), 0.0, t)


def temperature_arg(
    temperature: object, batch_size: int, device: torch.device, check_values: bool
) -> torch.Tensor | float:
    """The temperature as the kernels read it: a checked [B] tensor (values checked finite and
    >= 0 with ``check_values``), or a finite float >= 0 (None: 1)."""
    if temperature is None:
        return 1.0
    if isinstance(temperature, torch.Tensor):
        t = _param_tensor("temperature", temperature, batch_size, device)
        if check_values and batch_size:
            f = t.to(torch.float32)
            bad = ~(torch.isfinite(f) & (f >= 0))
            if bool(bad.any()):
                raise input_error("temperature", "finite values >= 0 (0 = one-hot of the argmax)", float(f[bad][0]))
        return t
    value = _float_scalar("temperature", temperature)
    if not (math.isfinite(value) and value >= 0):
        raise input_error("temperature", "a finite value >= 0 (0 = one-hot of the argmax)", value)
    return value


def canonical_temperature(
    temperature: object, batch_size: int, device: torch.device, check_values: bool
) -> torch.Tensor:
    """[B] fp32 temperature >= 0 (0: one-hot of the argmax). Unchecked tensor values that are not
    finite or negative act as 1."""
    t = temperature_arg(temperature, batch_size, device, check_values)
    if not isinstance(t, torch.Tensor):
        return torch.full((batch_size,), t, dtype=torch.float32, device=device)
    t = t.to(torch.float32)
    return torch.where(torch.isfinite(t) & (t >= 0), t, 1.0)


def check_filter_order(filter_apply_order: object) -> bool:
    """True for "joint", False for "top_k_first"."""
    if filter_apply_order not in FILTER_ORDERS:
        raise input_error("filter_apply_order", " or ".join(map(repr, FILTER_ORDERS)), repr(filter_apply_order))
    return filter_apply_order == "joint"


def _int64_scalar(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise input_error(name, "an int, an int64 tensor or None", type_name(value))
    if not -(2**63) <= value < 2**64:
        raise input_error(name, "a value in [-2**63, 2**64)", value)
    return value - 2**64 if value >= 2**63 else value  # uint64 seeds as their int64 bit pattern


def _seed_tensor(name: str, t: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
    if t.dim() != 1 or t.shape[0] not in (1, batch_size):
        raise input_error(name, f"a 1-d tensor of length 1 or {batch_size}", _shape(t))
    if t.dtype not in INT_DTYPES:
        raise input_error(name, "dtype torch.int64 (or torch.int32)", t.dtype)
    if t.device != device:
        raise input_error(name, f"device {device}", f"device {t.device}")
    return t


def kernel_seeds(
    seed: object, offset: object, generator: object, batch_size: int, device: torch.device
) -> dict[str, Any]:
    """The randomness of a call as the race's kernels read it, without a device op (except the
    draw of seed None): ``seeds`` and ``offsets`` ([B] or [1] int32/int64 tensors, or Python
    ints) and ``derive``: True when ``seeds`` is one seed for the batch, from which the kernel
    derives row b's seed (with the shared offset, or offset 0 when the offsets are per row).
    The rules are :func:`resolve_seeds`'s:

    * seed and offset as [B] tensors: row b uses (seed[b], offset[b]), so its token depends on
      nothing else (FlashInfer reads element 0 only);
    * a scalar seed (a Python int, or a length-1 tensor when B > 1) with a scalar offset: one
      stream for the batch, as FlashInfer; the rows get distinct seeds derived from (seed, offset,
      row);
    * a scalar seed with [B] offsets: each row keeps its own offset, the seeds are derived with
      offset 0;
    * seed None: one seed per row drawn from ``generator`` (torch's default generator of the
      device when None), which advances it; offset (default 0) is used as given.
    A missing offset is 0 (FlashInfer draws both from the generator when either is None).
    """
    if generator is not None and not isinstance(generator, torch.Generator):
        raise input_error("generator", "a torch.Generator or None", type_name(generator))
    offsets: torch.Tensor | int = 0
    if isinstance(offset, torch.Tensor):
        offsets = _seed_tensor("offset", offset, batch_size, device)
    elif offset is not None:
        offsets = _int64_scalar("offset", offset)
    if seed is None:
        gen_device = generator.device if generator is not None else device
        drawn = torch.randint(0, SEED_HIGH, (batch_size,), dtype=torch.int64, generator=generator, device=gen_device)
        return dict(seeds=drawn.to(device), offsets=offsets, derive=False)
    if isinstance(seed, torch.Tensor):
        seeds = _seed_tensor("seed", seed, batch_size, device)
        return dict(seeds=seeds, offsets=offsets, derive=seed.shape[0] != batch_size)
    return dict(seeds=_int64_scalar("seed", seed), offsets=offsets, derive=True)


def resolve_seeds(
    seed: object, offset: object, generator: object, batch_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`kernel_seeds` as tensors, for the PyTorch paths: (seeds, offsets [B] int64, shared
    offset). When the shared offset is None, row b uses (seeds[b], offsets[b]); otherwise
    ``seeds`` is one [1] seed for the batch, and row b's seed is derived from (seeds, shared
    offset [1], b) (:func:`spec_samplers.rng_sampling.derive_row_seeds`, or its kernel twin
    ``sampling_launch.row_seeds_triton``: the caller runs one or the other)."""
    plan = kernel_seeds(seed, offset, generator, batch_size, device)

    def as_tensor(value: torch.Tensor | int) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value.to(torch.int64)
        return torch.full((1,), value, dtype=torch.int64, device=device)

    seeds, offsets = as_tensor(plan["seeds"]), as_tensor(plan["offsets"])
    if not plan["derive"]:
        return seeds, offsets.expand(batch_size).contiguous(), None
    if offsets.shape[0] != 1:
        # per-row offsets with one shared seed: each row keeps its own offset, seeds still decorrelated
        return seeds, offsets, torch.zeros((1,), dtype=torch.int64, device=device)
    return seeds, offsets.expand(batch_size).contiguous(), offsets
