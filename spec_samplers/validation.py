"""Input checks: the samplers' (first part) and the FlashInfer-compatible sampling operations'
(second part).

The samplers check at three levels:

* metadata (rank, shape, dtype, device, ``max_spec_len``): no device work, always run;
* ``strict_mode=True`` adds what vLLM V0's strict mode checks (token ids in [0, V)) plus the
  [B] arguments (ragged counts consistent with T and ``max_spec_len``, temperatures finite and
  >= 0). These read tensors and synchronise with the host;
* ``check_values=True`` adds the value checks of the float inputs: probabilities finite,
  non-negative, each row summing to one; logits without NaN or +inf and not all -inf in a row.
  V0 callers pass unnormalised targets in strict mode, hence a separate opt-in.

Without them the samplers stay safe by construction: out-of-range ids are never used to index
memory and never accepted; non-finite or negative probabilities count as zero; a row without
probability mass emits no token (-1); malformed ragged requests emit no token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from spec_samplers.constants import MAX_SPEC_LEN, SEED_HIGH, input_error
from spec_samplers.constants import SAMPLING_MAX_VOCAB_SIZE as MAX_VOCAB_SIZE

PROBS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ID_DTYPES = (torch.int32, torch.int64)
#: |sum(probs) - 1| allowed in strict mode, by dtype (16-bit types round each entry to 2**-9)
SUM_TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}


@dataclass(frozen=True)
class Shapes:
    batch_size: int
    num_draft_tokens: int  # k
    vocab_size: int


def type_name(value: object) -> str:
    """``value``'s type as a user wrote it: ``numpy.ndarray``, ``list`` (builtins unqualified)."""
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def require_tensor(name: str, value: object) -> torch.Tensor:
    """The check that argument ``name`` is a tensor, run by every public entry and operation
    before it reads the argument (a numpy array or a list fails here, by name, not deeper in)."""
    if not isinstance(value, torch.Tensor):
        raise input_error(name, "a torch.Tensor", type_name(value))
    return value


def _check_tensor(name: str, t: object, rank: int, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    t = require_tensor(name, t)
    if t.dim() != rank:
        raise input_error(name, f"a {rank}-d tensor", f"shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise input_error(name, "dtype in " + ", ".join(str(d) for d in dtypes), t.dtype)
    return t


def _shape_mismatch(shape: tuple[int, ...], B: int, k: int, V: int, target_name: str) -> str:
    """What differs in a draft tensor's [B, k, V] shape, and which argument fixes each expected size."""
    sources = (("B", B, "draft_token_ids"), ("k", k, "draft_token_ids"), ("V", V, target_name))
    return "; ".join(
        f"{name} = {got} where {source} gives {want}"
        for (name, want, source), got in zip(sources, shape, strict=True)
        if got != want
    )


def check_metadata(
    target_with_bonus_probs: torch.Tensor,  # [B, k+1, V]
    bonus_token_ids: torch.Tensor,  # [B, 1]
    draft_probs: torch.Tensor | None,  # [B, k, V] or None
    draft_token_ids: torch.Tensor,  # [B, k]
    target_name: str = "target_with_bonus_probs",
    draft_name: str = "draft_probs",
) -> Shapes:
    """Rank, shape, dtype and device checks. Returns (B, k, V). The names are the arguments'
    (``target_logits`` / ``draft_logits`` for logits inputs)."""
    _check_tensor(target_name, target_with_bonus_probs, 3, PROBS_DTYPES)
    _check_tensor("draft_token_ids", draft_token_ids, 2, ID_DTYPES)
    _check_tensor("bonus_token_ids", bonus_token_ids, 2, ID_DTYPES)
    B, k = draft_token_ids.shape
    V = target_with_bonus_probs.shape[2]
    if target_with_bonus_probs.shape[:2] != (B, k + 1):
        raise input_error(
            target_name,
            f"shape ({B}, {k + 1}, V) from draft_token_ids {(B, k)}",
            f"shape {tuple(target_with_bonus_probs.shape)}",
        )
    if V < 1:
        raise input_error(target_name, "vocabulary size V >= 1", V)
    if tuple(bonus_token_ids.shape) != (B, 1):
        raise input_error("bonus_token_ids", f"shape ({B}, 1)", f"shape {tuple(bonus_token_ids.shape)}")
    device = target_with_bonus_probs.device
    tensors = [("draft_token_ids", draft_token_ids), ("bonus_token_ids", bonus_token_ids)]
    if draft_probs is not None:
        _check_tensor(draft_name, draft_probs, 3, PROBS_DTYPES)
        if tuple(draft_probs.shape) != (B, k, V):
            raise input_error(
                draft_name,
                f"shape ({B}, {k}, {V})",
                f"shape {tuple(draft_probs.shape)} ({_shape_mismatch(tuple(draft_probs.shape), B, k, V, target_name)})",
            )
        tensors.append((draft_name, draft_probs))
    for name, t in tensors:
        if t.device != device:
            raise input_error(name, f"device {device} (that of {target_name})", f"device {t.device}")
    return Shapes(B, k, V)


def check_seed_tensor(name: str, t: torch.Tensor | None, batch_size: int, device: torch.device) -> None:
    if t is None:
        return
    _check_tensor(name, t, 1, (torch.int64, torch.int32))
    if t.shape[0] != batch_size:
        raise input_error(name, f"shape ({batch_size},)", f"shape {tuple(t.shape)}")
    if t.device != device:
        raise input_error(name, f"device {device}", f"device {t.device}")


def require_data(name: str, t: torch.Tensor | None, why: str) -> None:
    """Value checks read the tensor: a meta tensor (shapes only) cannot be checked."""
    if t is not None and t.device.type == "meta":
        raise input_error(name, f"a tensor with data ({why} reads values)", "a tensor on the meta device")


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    """Index of the first True entry of ``mask`` (which has one). Synchronises with the host."""
    flat = int(torch.argmax(mask.reshape(-1).to(torch.uint8)))
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), mask.shape))


def _where(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, index)) + "]"


def check_ids_in_range(name: str, ids: torch.Tensor, vocab_size: int) -> None:
    """Strict mode: every id in [0, V). Synchronises with the host."""
    if ids.numel() == 0:
        return
    require_data(name, ids, "strict_mode")
    bad = (ids < 0) | (ids >= vocab_size)
    if bool(bad.any()):
        index = _first_index(bad)
        raise input_error(name, f"token ids in [0, {vocab_size})", f"id {int(ids[index])} at {_where(index)}")


def check_probs_values(name: str, probs: torch.Tensor) -> None:
    """check_values: finite, non-negative, rows summing to one (per-dtype tolerance)."""
    if probs.numel() == 0:
        return
    require_data(name, probs, "check_values")
    finite = torch.isfinite(probs)
    if not bool(finite.all()):
        index = _first_index(~finite)
        raise input_error(name, "finite probabilities", f"{float(probs[index])} at {_where(index)}")
    negative = probs < 0
    if bool(negative.any()):
        index = _first_index(negative)
        raise input_error(name, "non-negative probabilities", f"{float(probs[index])} at {_where(index)}")
    sums = probs.sum(dim=-1, dtype=torch.float32)
    err = (sums - 1).abs()
    tol = SUM_TOLERANCE[probs.dtype]
    worst = _first_index(err == err.max())
    if float(err[worst]) > tol:
        raise input_error(
            name,
            f"rows summing to 1 (tolerance {tol})",
            f"row {_where(worst)} summing to {float(sums[worst]):.7g} (the worst row)",
        )


def check_logits_values(name: str, logits: torch.Tensor) -> None:
    """check_values: no NaN, no +Inf, and no row without a finite logit (-Inf, a masked-out
    token, is fine where the row has another)."""
    if logits.numel() == 0:
        return
    require_data(name, logits, "check_values")
    bad = torch.isnan(logits) | torch.isposinf(logits)
    if bool(bad.any()):
        index = _first_index(bad)
        raise input_error(name, "logits without NaN or +Inf", f"{float(logits[index])} at {_where(index)}")
    empty = torch.isneginf(logits).all(dim=-1)
    if bool(empty.any()):
        index = _first_index(empty)
        raise input_error(name, "rows with a finite logit (a distribution)", f"row {_where(index)} all -inf")


def check_temperature(t: object, batch_size: int, device: torch.device, strict: bool, *, draft: bool = False) -> None:
    """[B] float tensor on ``device``: ``temperature`` (0 = greedy request) or, ``draft``, the
    ``draft_temperature`` of the draft rows. In strict mode also finite and >= 0, > 0 for the draft
    rows (without it a draft T that is not > 0, or NaN, counts as 1, as for ``temperature``)."""
    name = "draft_temperature" if draft else "temperature"
    _check_tensor(name, t, 1, PROBS_DTYPES)
    assert isinstance(t, torch.Tensor)
    if t.shape[0] != batch_size:
        raise input_error(name, f"shape ({batch_size},)", f"shape {tuple(t.shape)}")
    if t.device != device:
        raise input_error(name, f"device {device}", f"device {t.device}")
    if strict and batch_size:
        require_data(name, t, "strict_mode")
        bad = ~(torch.isfinite(t) & ((t > 0) if draft else (t >= 0)))
        if bool(bad.any()):
            index = _first_index(bad)
            expected = "finite values > 0" if draft else "finite values >= 0 (0 = greedy)"
            raise input_error(name, expected, f"{float(t[index])} at {_where(index)}")


def check_draft_rows_values(draft_rows: torch.Tensor, num_rows: int) -> None:
    """Strict mode: every draft row index in [0, N), N the draft matrix's rows (without strict
    mode a draft whose row is out of range is rejected, its row never read)."""
    if draft_rows.numel() == 0:
        return
    require_data("draft_rows", draft_rows, "strict_mode")
    bad = (draft_rows < 0) | (draft_rows >= num_rows)
    if bool(bad.any()):
        index = _first_index(bad)
        actual = f"{int(draft_rows[index])} at {_where(index)}"
        raise input_error("draft_rows", f"row indices in [0, {num_rows}) (the rows of draft_logits)", actual)


def check_token_ids(vocab_size: int, bonus_token_ids: torch.Tensor, draft_token_ids: torch.Tensor) -> None:
    """Strict mode (vLLM V0's checks): draft and bonus ids in [0, V)."""
    check_ids_in_range("draft_token_ids", draft_token_ids, vocab_size)
    check_ids_in_range("bonus_token_ids", bonus_token_ids, vocab_size)


def check_float_values(
    target_probs: torch.Tensor,  # [B, k+1, V] or [T, V]
    draft_probs: torch.Tensor | None,
    target_name: str = "target_with_bonus_probs",
    draft_name: str = "draft_probs",
    logits: bool = False,
) -> None:
    """check_values: the float inputs (probabilities, or logits when ``logits``)."""
    check_floats = check_logits_values if logits else check_probs_values
    check_floats(target_name, target_probs)
    if draft_probs is not None:
        check_floats(draft_name, draft_probs)


def check_values(
    vocab_size: int,
    target_probs: torch.Tensor,  # [B, k+1, V] or [T, V]
    bonus_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_name: str = "target_with_bonus_probs",
    draft_name: str = "draft_probs",
    logits: bool = False,
) -> None:
    """Token ids and float values together (:func:`check_token_ids` and :func:`check_float_values`)."""
    check_token_ids(vocab_size, bonus_token_ids, draft_token_ids)
    check_float_values(target_probs, draft_probs, target_name, draft_name, logits)


def check_row_mask(name: str, t: torch.Tensor | None, batch_size: int, device: torch.device) -> None:
    """An optional [B] bool tensor on ``device``."""
    if t is None:
        return
    _check_tensor(name, t, 1, (torch.bool,))
    if t.shape[0] != batch_size:
        raise input_error(name, f"shape ({batch_size},)", f"shape {tuple(t.shape)}")
    if t.device != device:
        raise input_error(name, f"device {device}", f"device {t.device}")


def check_ragged_metadata(
    target_probs: torch.Tensor,  # [T, V]
    bonus_token_ids: torch.Tensor,  # [B] or [B, 1]
    draft_probs: torch.Tensor | None,  # [T, V] or None
    draft_token_ids: torch.Tensor,  # [T]
    cu_num_draft_tokens: torch.Tensor,  # [B]
    max_spec_len: int,
    target_name: str = "target_probs",
    draft_name: str = "draft_probs",
    draft_rows: torch.Tensor | None = None,  # [T] int32/int64: draft row t is draft_probs[draft_rows[t]]
) -> Shapes:
    """Ragged-layout metadata checks. Returns (B, K = max_spec_len, V). With ``draft_rows`` the
    draft is an [N, V] matrix (any N) whose rows ``draft_rows`` index, else [T, V]."""
    _check_tensor(target_name, target_probs, 2, PROBS_DTYPES)
    _check_tensor("draft_token_ids", draft_token_ids, 1, ID_DTYPES)
    _check_tensor("cu_num_draft_tokens", cu_num_draft_tokens, 1, ID_DTYPES)
    if require_tensor("bonus_token_ids", bonus_token_ids).dim() not in (1, 2):
        raise input_error("bonus_token_ids", "a [B] or [B, 1] tensor", f"shape {tuple(bonus_token_ids.shape)}")
    _check_tensor("bonus_token_ids", bonus_token_ids, bonus_token_ids.dim(), ID_DTYPES)
    T, V = target_probs.shape
    B = cu_num_draft_tokens.shape[0]
    if V < 1:
        raise input_error(target_name, "vocabulary size V >= 1", V)
    if isinstance(max_spec_len, bool) or not isinstance(max_spec_len, int) or not 0 <= max_spec_len <= MAX_SPEC_LEN:
        raise input_error("max_spec_len", f"an int in [0, {MAX_SPEC_LEN}]", repr(max_spec_len))
    if draft_token_ids.shape[0] != T:
        raise input_error(
            "draft_token_ids", f"shape ({T},) (one per {target_name} row)", f"shape {tuple(draft_token_ids.shape)}"
        )
    if bonus_token_ids.shape[0] != B or (bonus_token_ids.dim() == 2 and bonus_token_ids.shape[1] != 1):
        raise input_error("bonus_token_ids", f"shape ({B},) or ({B}, 1)", f"shape {tuple(bonus_token_ids.shape)}")
    device = target_probs.device
    tensors = [
        ("draft_token_ids", draft_token_ids),
        ("bonus_token_ids", bonus_token_ids),
        ("cu_num_draft_tokens", cu_num_draft_tokens),
    ]
    if draft_rows is not None:
        if draft_probs is None:
            raise input_error("draft_rows", f"None without {draft_name} (point-mass drafts have no rows)", "a tensor")
        _check_tensor("draft_rows", draft_rows, 1, ID_DTYPES)
        if draft_rows.shape[0] != T:
            raise input_error(
                "draft_rows", f"shape ({T},) (one per {target_name} row)", f"shape {tuple(draft_rows.shape)}"
            )
        tensors.append(("draft_rows", draft_rows))
    if draft_probs is not None:
        _check_tensor(draft_name, draft_probs, 2, PROBS_DTYPES)
        if draft_rows is not None and draft_probs.shape[1] != V:
            raise input_error(
                draft_name, f"shape (N, {V}) (V that of {target_name}; rows picked by draft_rows)",
                f"shape {tuple(draft_probs.shape)}",
            )  # fmt: skip
        if draft_rows is None and tuple(draft_probs.shape) != (T, V):
            raise input_error(
                draft_name, f"shape ({T}, {V}) (that of {target_name})", f"shape {tuple(draft_probs.shape)}"
            )
        tensors.append((draft_name, draft_probs))
    for name, t in tensors:
        if t.device != device:
            raise input_error(name, f"device {device} (that of {target_name})", f"device {t.device}")
    return Shapes(B, max_spec_len, V)


def check_ragged_values(cu_num_draft_tokens: torch.Tensor, num_tokens: int, max_spec_len: int) -> None:
    """Strict mode: cu_num_draft_tokens non-decreasing from >= 0, each k_b <= max_spec_len,
    last == T (without strict mode a request breaking these emits no token, see
    :mod:`spec_samplers.layout`)."""
    name = "cu_num_draft_tokens"
    if cu_num_draft_tokens.numel() == 0:
        if num_tokens != 0:
            raise input_error(name, f"a last entry equal to T = {num_tokens} (B = 0 needs T = 0)", "an empty tensor")
        return
    require_data(name, cu_num_draft_tokens, "strict_mode")
    cu = cu_num_draft_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=torch.zeros(1, dtype=torch.int64, device=cu.device))
    negative = counts < 0
    if bool(negative.any()):
        b = _first_index(negative)[0]
        actual = f"entry {b} = {int(cu[b])} after {int(cu[b] - counts[b])}"
        raise input_error(name, "a non-decreasing cumulative sum from >= 0", actual)
    too_long = counts > max_spec_len
    if bool(too_long.any()):
        b = _first_index(too_long)[0]
        raise input_error(name, f"counts <= max_spec_len = {max_spec_len}", f"count {int(counts[b])} of request {b}")
    last = int(cu[-1])
    if last != num_tokens:
        raise input_error(name, f"a last entry equal to T = {num_tokens}", last)


# --- The sampling operations (spec_samplers.sampling) --------------------------------------------
# Argument checks and canonical forms of the FlashInfer-compatible sampling operations.
#
# Metadata (types, ranks, shapes, dtypes, devices) and Python scalars are checked on every call at
# no device cost. Values inside tensors (NaN in the inputs, per-request parameters out of range,
# ``indices`` out of range) need a host synchronisation, so they are checked only when the caller
# asks with ``check_nan=True``; without it, out-of-range values have a defined, safe meaning (see
# :func:`canonical_top_p` and friends) and never address memory out of bounds.

#: the input dtypes (the verification samplers' probability dtypes) and the index dtypes (above);
#: the per-request parameter tensors may also be fp64
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
    offset [1], b) (:func:`spec_samplers.rng.derive_row_seeds`, or its kernel twin
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
