"""Small PyTorch building blocks shared by the references and the engine adapters."""

from __future__ import annotations

import torch


def clean_probs(x: torch.Tensor) -> torch.Tensor:
    """fp32 copy of x with NaN, Inf and negative entries set to 0 (non-strict safety)."""
    # two passes instead of isfinite/gt/and/where's seven (this runs on [B, V] rows)
    return x.to(torch.float32).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0)


def valid_ids(ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(in-range mask, ids clamped into [0, V) as int64) so gathers never read out of bounds."""
    ids = ids.to(torch.int64)
    return (ids >= 0) & (ids < vocab_size), ids.clamp(0, vocab_size - 1)


def scaled_exp(x: torch.Tensor, row_max: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """exp((x - m) / T), the unnormalised softmax of the shared logits rule (fp32, broadcast).

    x: logits (NaN already -inf); m: their row max; T > 0 (+inf allowed). When m = +inf the
    +inf entries get exp(0) = 1 and every other entry 0; x - m = -inf (x = -inf, or a difference
    that overflows fp32) gives 0, so -inf / +inf never makes a NaN. Kernel twin:
    ``spec_samplers.kernels.common.scaled_exp``."""
    inf = torch.full((), float("inf"), device=x.device)
    d = torch.where(row_max == inf, torch.where(x == inf, torch.zeros((), device=x.device), -inf), x - row_max)
    z = torch.where(d > -inf, d / temperature, -inf)
    return torch.exp(z)


def probs_from_logits(
    logits: torch.Tensor,  # [N, V] fp32/fp16/bf16
    temperature: torch.Tensor,  # [N] float, 0 = greedy
) -> torch.Tensor:
    """[N, V] fp32: softmax(logits / T) per row, computed stably and with defined limits.

    * NaN logits count as -inf; T that is negative or NaN counts as 1;
    * q = exp((x - m) / T) / sum, with m the row's largest logit (so x / T never overflows);
    * T = +inf: uniform over the entries with x > -inf; a tiny T: one-hot on the max (ties share);
    * +inf logits: uniform over the +inf entries;
    * a row whose logits are all -inf (or NaN) has no distribution: an all-zero row, from which
      the samplers emit no token (-1);
    * T == 0 (greedy): the one-hot of the row's argmax (ties to the lowest index); all-zero when
      the row has no finite or +inf logit.

    The Triton kernels compute the same rule (``kernels/softmax_kernels.py``, ``common.load_q``).

    Example::

        >>> probs_from_logits(torch.tensor([[0.0, float("inf"), float("inf")]]), torch.tensor([1.0]))
        tensor([[0.0000, 0.5000, 0.5000]])
    """
    x = logits.to(torch.float32)
    neg_inf = torch.full((), float("-inf"), device=x.device)
    x = torch.where(torch.isnan(x), neg_inf, x)
    row_max = x.amax(dim=-1, keepdim=True)  # [N, 1]
    has_mass = row_max > neg_inf  # [N, 1]
    t = torch.where(temperature > 0, temperature.to(torch.float32), torch.ones((), device=x.device))[:, None]
    e = scaled_exp(x, row_max, t)
    zero = torch.zeros((), device=x.device)
    probs = torch.where(has_mass, e / e.sum(dim=-1, keepdim=True), zero)
    onehot = torch.nn.functional.one_hot(torch.argmax(x, dim=-1), x.shape[-1]).to(torch.float32)
    onehot = torch.where(has_mass, onehot, zero)
    return torch.where((temperature == 0)[:, None], onehot, probs)
