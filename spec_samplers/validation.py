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
) -> Shapes:
    """Rank, shape, dtype and device checks. Returns (B, k, V)."""
    _check_tensor("target_with_bonus_probs", target_with_bonus_probs, 3, PROBS_DTYPES)
    _check_tensor("draft_token_ids", draft_token_ids, 2, ID_DTYPES)
    _check_tensor("bonus_token_ids", bonus_token_ids, 2, ID_DTYPES)
    B, k = draft_token_ids.shape
    V = target_with_bonus_probs.shape[2]
    if target_with_bonus_probs.shape[:2] != (B, k + 1):
        raise input_error(
            "target_with_bonus_probs", f"shape ({B}, {k + 1}, V) from draft_token_ids {(B, k)}",
            f"shape {tuple(target_with_bonus_probs.shape)}",
        )
    if V < 1:
        raise input_error("target_with_bonus_probs", "vocabulary size V >= 1", V)
    if tuple(bonus_token_ids.shape) != (B, 1):
        raise input_error("bonus_token_ids", f"shape ({B}, 1)", f"shape {tuple(bonus_token_ids.shape)}")
    device = target_with_bonus_probs.device
    tensors = [("draft_token_ids", draft_token_ids), ("bonus_token_ids", bonus_token_ids)]
    if draft_probs is not None:
        _check_tensor("draft_probs", draft_probs, 3, PROBS_DTYPES)
        if tuple(draft_probs.shape) != (B, k, V):
            raise input_error(
                "draft_probs", f"shape ({B}, {k}, {V}) (V from target_with_bonus_probs)",
                f"shape {tuple(draft_probs.shape)}",
            )
        tensors.append(("draft_probs", draft_probs))
    for name, t in tensors:
        if t.device != device:
            raise input_error(name, f"device {device} (that of target_with_bonus_probs)", f"device {t.device}")
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


def check_values(
    shapes: Shapes,
    target_with_bonus_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
) -> None:
    """All strict-mode value checks."""
    check_ids_in_range("draft_token_ids", draft_token_ids, shapes.vocab_size)
    check_ids_in_range("bonus_token_ids", bonus_token_ids, shapes.vocab_size)
    check_probs_values("target_with_bonus_probs", target_with_bonus_probs)
    if draft_probs is not None:
        check_probs_values("draft_probs", draft_probs)


def check_row_mask(name: str, t: torch.Tensor | None, batch_size: int, device: torch.device) -> None:
    """An optional [B] bool tensor on ``device``."""
    if t is None:
        return
    _check_tensor(name, t, 1, (torch.bool,))
    if t.shape[0] != batch_size:
        raise input_error(name, f"shape ({batch_size},)", f"shape {tuple(t.shape)}")
    if t.device != device:
        raise input_error(name, f"device {device}", f"device {t.device}")
