"""Input checks shared by every sampler.

Metadata checks (rank, shape, dtype, device) cost no device work and always run. Value checks
(token ids in range, probabilities finite, non-negative and summing to one) read the tensors and
synchronise with the host, so they run only in strict mode; without it the samplers stay safe
by construction (out-of-range ids are never used to index memory and never accepted; non-finite
or negative probabilities count as zero).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_samplers.errors import input_error

PROBS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ID_DTYPES = (torch.int32, torch.int64)
#: |sum(probs) - 1| allowed in strict mode, by dtype (16-bit types round each entry to 2**-9)
SUM_TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}


@dataclass(frozen=True)
class Shapes:
    batch_size: int
    num_draft_tokens: int  # k
    vocab_size: int


def _check_tensor(name: str, t: object, rank: int, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise input_error(name, "a torch.Tensor", type(t).__name__)
    if t.dim() != rank:
        raise input_error(name, f"a {rank}-d tensor", f"shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise input_error(name, "dtype in " + ", ".join(str(d) for d in dtypes), t.dtype)
    return t


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
            target_name, f"shape ({B}, {k + 1}, V) from draft_token_ids {(B, k)}",
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
                draft_name, f"shape ({B}, {k}, {V}) (V from {target_name})",
                f"shape {tuple(draft_probs.shape)}",
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


def check_ids_in_range(name: str, ids: torch.Tensor, vocab_size: int) -> None:
    """Strict mode: every id in [0, V). Synchronises with the host."""
    if ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise input_error(name, f"token ids in [0, {vocab_size})", f"id {bad}")


def check_probs_values(name: str, probs: torch.Tensor) -> None:
    """Strict mode: finite, non-negative, rows summing to one (per-dtype tolerance)."""
    if probs.numel() == 0:
        return
    if not bool(torch.isfinite(probs).all()):
        raise input_error(name, "finite probabilities", "NaN or Inf entries")
    if bool((probs < 0).any()):
        raise input_error(name, "non-negative probabilities", f"minimum {float(probs.min())}")
    sums = probs.sum(dim=-1, dtype=torch.float32)
    err = float((sums - 1).abs().max())
    tol = SUM_TOLERANCE[probs.dtype]
    if err > tol:
        raise input_error(name, f"rows summing to 1 (tolerance {tol})", f"a row summing to {1 + err:.6g} or {1 - err:.6g}")


def check_logits_values(name: str, logits: torch.Tensor) -> None:
    """Strict mode: no NaN and no +Inf (-Inf, a masked-out token, is fine)."""
    if logits.numel() == 0:
        return
    if bool(torch.isnan(logits).any()) or bool(torch.isposinf(logits).any()):
        raise input_error(name, "logits without NaN or +Inf", "NaN or +Inf entries")


def check_temperature(temperature: object, batch_size: int, device: torch.device, strict: bool) -> None:
    """[B] float tensor on ``device``; in strict mode also finite and >= 0 (0 = greedy request)."""
    _check_tensor("temperature", temperature, 1, PROBS_DTYPES)
    if temperature.shape[0] != batch_size:
        raise input_error("temperature", f"shape ({batch_size},)", f"shape {tuple(temperature.shape)}")
    if temperature.device != device:
        raise input_error("temperature", f"device {device}", f"device {temperature.device}")
    if strict and batch_size and not bool((torch.isfinite(temperature) & (temperature >= 0)).all()):
        bad = temperature[~(torch.isfinite(temperature) & (temperature >= 0))][0]
        raise input_error("temperature", "finite values >= 0 (0 = greedy)", float(bad))


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
    """All strict-mode value checks (either layout; probabilities, or logits when ``logits``)."""
    check_ids_in_range("draft_token_ids", draft_token_ids, vocab_size)
    check_ids_in_range("bonus_token_ids", bonus_token_ids, vocab_size)
    check_floats = check_logits_values if logits else check_probs_values
    check_floats(target_name, target_probs)
    if draft_probs is not None:
        check_floats(draft_name, draft_probs)


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
) -> Shapes:
    """Ragged-layout metadata checks. Returns (B, K = max_spec_len, V)."""
    _check_tensor(target_name, target_probs, 2, PROBS_DTYPES)
    _check_tensor("draft_token_ids", draft_token_ids, 1, ID_DTYPES)
    _check_tensor("cu_num_draft_tokens", cu_num_draft_tokens, 1, ID_DTYPES)
    if not isinstance(bonus_token_ids, torch.Tensor) or bonus_token_ids.dim() not in (1, 2):
        raise input_error("bonus_token_ids", "a [B] or [B, 1] tensor", getattr(bonus_token_ids, "shape", type(bonus_token_ids).__name__))
    _check_tensor("bonus_token_ids", bonus_token_ids, bonus_token_ids.dim(), ID_DTYPES)
    T, V = target_probs.shape
    B = cu_num_draft_tokens.shape[0]
    if V < 1:
        raise input_error(target_name, "vocabulary size V >= 1", V)
    if isinstance(max_spec_len, bool) or not isinstance(max_spec_len, int) or max_spec_len < 0:
        raise input_error("max_spec_len", "an int >= 0", repr(max_spec_len))
    if draft_token_ids.shape[0] != T:
        raise input_error("draft_token_ids", f"shape ({T},) (one per {target_name} row)", f"shape {tuple(draft_token_ids.shape)}")
    if bonus_token_ids.shape[0] != B or (bonus_token_ids.dim() == 2 and bonus_token_ids.shape[1] != 1):
        raise input_error("bonus_token_ids", f"shape ({B},) or ({B}, 1)", f"shape {tuple(bonus_token_ids.shape)}")
    device = target_probs.device
    tensors = [("draft_token_ids", draft_token_ids), ("bonus_token_ids", bonus_token_ids), ("cu_num_draft_tokens", cu_num_draft_tokens)]
    if draft_probs is not None:
        _check_tensor(draft_name, draft_probs, 2, PROBS_DTYPES)
        if tuple(draft_probs.shape) != (T, V):
            raise input_error(draft_name, f"shape ({T}, {V}) (that of {target_name})", f"shape {tuple(draft_probs.shape)}")
        tensors.append((draft_name, draft_probs))
    for name, t in tensors:
        if t.device != device:
            raise input_error(name, f"device {device} (that of {target_name})", f"device {t.device}")
    return Shapes(B, max_spec_len, V)


def check_ragged_values(cu_num_draft_tokens: torch.Tensor, num_tokens: int, max_spec_len: int) -> None:
    """Strict mode: cu_num_draft_tokens non-decreasing, each k_b <= max_spec_len, last == T."""
    if cu_num_draft_tokens.numel() == 0:
        if num_tokens != 0:
            raise input_error("cu_num_draft_tokens", f"a last entry equal to T = {num_tokens}", "an empty tensor")
        return
    cu = cu_num_draft_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=torch.zeros(1, dtype=torch.int64, device=cu.device))
    lo, hi, last = int(counts.min()), int(counts.max()), int(cu[-1])
    if lo < 0:
        raise input_error("cu_num_draft_tokens", "a non-decreasing cumulative sum", f"a negative count {lo}")
    if hi > max_spec_len:
        raise input_error("cu_num_draft_tokens", f"counts <= max_spec_len = {max_spec_len}", f"a count of {hi}")
    if last != num_tokens:
        raise input_error("cu_num_draft_tokens", f"a last entry equal to T = {num_tokens}", last)
