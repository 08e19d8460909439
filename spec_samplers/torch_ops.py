"""Small PyTorch building blocks shared by the references and the engine adapters."""

from __future__ import annotations

import torch

from spec_samplers import rng


def clean_probs(x: torch.Tensor) -> torch.Tensor:
    """fp32 copy of x with NaN, Inf and negative entries set to 0 (non-strict safety)."""
    # two passes instead of isfinite/gt/and/where's seven (this runs on [B, V] rows)
    return x.to(torch.float32).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0)


def valid_ids(ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(in-range mask, ids clamped into [0, V) as int64) so gathers never read out of bounds."""
    ids = ids.to(torch.int64)
    return (ids >= 0) & (ids < vocab_size), ids.clamp(0, vocab_size - 1)


def race(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """Exponential race: argmax_x weights[x] / E[x] (:func:`spec_samplers.rng.race`: scaled keys, so
    subnormal weights win at their rate), a sample of weights / sum(weights).

    weights, exponentials: [N, V] fp32 (exponentials > 0). Ties go to the lowest index.
    Returns [N] int64.
    """
    return rng.race(weights, exponentials)


def probs_from_logits(
    logits: torch.Tensor,  # [N, V] fp32/fp16/bf16
    temperature: torch.Tensor,  # [N] float, 0 = greedy
) -> torch.Tensor:
    """[N, V] fp32: softmax(logits / T) per row; a row with T == 0 becomes the one-hot of its
    argmax (the greedy token, ties to the lowest index). NaN logits count as -inf; T that is not
    > 0 (other than the greedy 0) is treated as 1."""
    x = logits.to(torch.float32)
    x = torch.where(torch.isnan(x), torch.full((), float("-inf"), device=x.device), x)
    t = torch.where(temperature > 0, temperature.to(torch.float32), torch.ones((), device=x.device))
    probs = torch.softmax(x / t[:, None], dim=-1)
    onehot = torch.nn.functional.one_hot(torch.argmax(x, dim=-1), x.shape[-1]).to(torch.float32)
    return torch.where((temperature == 0)[:, None], onehot, probs)
