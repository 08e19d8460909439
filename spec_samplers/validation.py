"""Input checks shared by every sampler.

Three levels:

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

from dataclasses import dataclass

import torch

from spec_samplers.constants import MAX_SPEC_LEN, input_error

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


def check_temperature(temperature: object, batch_size: int, device: torch.device, strict: bool) -> None:
    """[B] float tensor on ``device``; in strict mode also finite and >= 0 (0 = greedy request)."""
    _check_temperatures("temperature", temperature, batch_size, device, strict, greedy=True)


def check_draft_temperature(draft_temperature: object, batch_size: int, device: torch.device, strict: bool) -> None:
    """[B] float tensor on ``device``: the temperature of the draft rows. In strict mode also
    finite and > 0 (without it a T that is not > 0, or NaN, counts as 1, as for ``temperature``)."""
    _check_temperatures("draft_temperature", draft_temperature, batch_size, device, strict, greedy=False)


def _check_temperatures(
    name: str, t: object, batch_size: int, device: torch.device, strict: bool, greedy: bool
) -> None:
    """[B] float tensor ``name`` on ``device``; strict: finite and > 0 (>= 0 where 0 marks greedy)."""
    _check_tensor(name, t, 1, PROBS_DTYPES)
    assert isinstance(t, torch.Tensor)
    if t.shape[0] != batch_size:
        raise input_error(name, f"shape ({batch_size},)", f"shape {tuple(t.shape)}")
    if t.device != device:
        raise input_error(name, f"device {device}", f"device {t.device}")
    if strict and batch_size:
        require_data(name, t, "strict_mode")
        bad = ~(torch.isfinite(t) & ((t >= 0) if greedy else (t > 0)))
        if bool(bad.any()):
            index = _first_index(bad)
            expected = "finite values >= 0 (0 = greedy)" if greedy else "finite values > 0"
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
