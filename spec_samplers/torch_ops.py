"""Small PyTorch building blocks shared by the references and the engine adapters."""

from __future__ import annotations

import torch

from spec_samplers.constants import LOG2E_FP32, WEIGHT_MIN


def clean_probs(x: torch.Tensor) -> torch.Tensor:
    """fp32 copy of x with NaN, Inf and negative entries set to 0 (non-strict safety)."""
    # two passes instead of isfinite/gt/and/where's seven (this runs on [B, V] rows)
    return x.to(torch.float32).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0)


def valid_ids(ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(in-range mask, ids clamped into [0, V) as int64) so gathers never read out of bounds."""
    ids = ids.to(torch.int64)
    return (ids >= 0) & (ids < vocab_size), ids.clamp(0, vocab_size - 1)


def logits_scale(temperature: torch.Tensor) -> torch.Tensor:
    """c = fp32(log2 e) / T, the per-row scale of the shared logits rule (fp32, ``temperature``'s
    shape): ONE IEEE division, as the kernels' ``div_rn`` (``LOG2E_FP32 / t`` would be a reciprocal
    and a product in torch). T = +inf gives 0; a T below ~4.2e-39 gives +inf."""
    t = temperature.to(torch.float32)
    return torch.div(torch.full((), LOG2E_FP32, dtype=torch.float32, device=t.device), t)


def reciprocal_sum(row_sum: torch.Tensor) -> torch.Tensor:
    """r = 1 / sum (one IEEE division, as the kernels' ``div_rn``), 0 where the sum is not positive
    (a row without mass): the rule's q is e * r."""
    s = row_sum.to(torch.float32)
    zero = torch.zeros((), device=s.device)
    return torch.where(s > 0, torch.div(torch.ones((), device=s.device), s), zero)


def scaled_exp(x: torch.Tensor, row_max: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """exp((x - m) / T), the unnormalised softmax of the shared logits rule (fp32, broadcast),
    computed as 2**z with z = min((x - m) * c, 0) and c = :func:`logits_scale` (T): a subtraction,
    a product and an exp2 per entry, the same IEEE operations in the same order as the kernel twin
    (``spec_samplers.kernels.common.weights``), so both give the same floats on CUDA (torch.exp2
    and the kernels' ex2 agree on the normal range, and a weight below WEIGHT_MIN = 2**-126 is 0
    on both).

    x: logits (NaN already -inf); m: their row max; T > 0 (+inf allowed). The limits:

    * a row whose max is -inf (no finite or +inf logit) weighs 0 everywhere (m is taken as +inf);
    * m = +inf: the +inf entries get 1 (inf - inf is NaN, and min(NaN, 0) = 0), every other
      entry 0 (x - m = -inf);
    * x - m = -inf (x = -inf, or a difference that overflows fp32) gives 0, also at T = +inf
      where c = 0 (the test on x - m, not the product -inf * 0, decides);
    * x = m gives 1 even when c overflows to +inf for a tiny T (0 * inf is NaN: min(NaN, 0) = 0),
      and every x < m gives 0 there (one-hot on the max, ties share); T = +inf gives c = 0 and
      weight 1 on every entry with x - m > -inf.

    Precision: relative to exp((x - m) / T) in exact arithmetic, a weight w = 2**z is within
    (4 ln2 |z| + 4) * 2**-24 (four roundings in z: x - m, log2(e), the division, the product; the
    exp2 within 2 ulp, CUDA's bound for exp2f), about 7e-6 at w = 1e-12 (|z| = 40); weights
    below 2**-126 (subnormal) are 0. Kernel twin: ``spec_samplers.kernels.common.weights``."""
    zero = torch.zeros((), device=x.device)
    inf = torch.full((), float("inf"), device=x.device)
    m = torch.where(row_max > -inf, row_max, inf)
    d = x - m
    e = torch.exp2(torch.fmin(d * logits_scale(temperature), zero))
    return torch.where((d != -inf) & (e >= WEIGHT_MIN), e, zero)


def probs_from_logits(
    logits: torch.Tensor,  # [N, V] fp32/fp16/bf16
    temperature: torch.Tensor,  # [N] float, 0 = greedy
) -> torch.Tensor:
    """[N, V] fp32: softmax(logits / T) per row, computed stably and with defined limits.

    * NaN logits count as -inf; T that is negative or NaN counts as 1;
    * q = exp((x - m) / T) / sum, with m the row's largest logit (so x / T never overflows),
      computed as e * r: e = :func:`scaled_exp` (2**((x - m) * c), c = log2(e) / T) and
      r = 1 / sum (:func:`reciprocal_sum`), one division per row, none per entry;
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
    # (whole, not in chunks of rows: torch sums a lone row along another path than rows of a
    # batch, so chunks would change the last bits of the sums)
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    _probs_into(logits, temperature, out)
    return out


#: the largest fp32 below WEIGHT_MIN: ``threshold`` keeps x > it, i.e. x >= WEIGHT_MIN
_BELOW_WEIGHT_MIN = float(torch.nextafter(torch.tensor(WEIGHT_MIN), torch.tensor(0.0)))


def _probs_into(logits: torch.Tensor, temperature: torch.Tensor, out: torch.Tensor) -> None:
    """out [n, V] fp32 <- :func:`probs_from_logits` of [n, V] logits: :func:`scaled_exp`'s
    operations in place in ``out`` (nine passes), the greedy one-hot only when a row is greedy
    (read on the CPU, where it costs no synchronisation; always elsewhere), and the mask of
    ``x - m = -inf`` only when a row has T = +inf (c = 0: elsewhere exp2(-inf * c) is 0 already)."""
    cpu = logits.device.type == "cpu"
    neg_inf = torch.full((), float("-inf"), device=logits.device)
    zero = torch.zeros((), device=logits.device)
    x = torch.fmax(logits, neg_inf, out=out) if logits.dtype == torch.float32 else out.copy_(logits)
    if logits.dtype != torch.float32:
        torch.fmax(x, neg_inf, out=x)  # NaN -> -inf (fmax drops a NaN)
    row_max = x.amax(dim=-1, keepdim=True)  # [n, 1]
    greedy = temperature == 0
    onehot = None
    if not cpu or bool(greedy.any()):
        onehot = torch.nn.functional.one_hot(torch.argmax(x, dim=-1), x.shape[-1]).to(torch.float32)
        onehot = torch.where(row_max > neg_inf, onehot, zero)
    t = torch.where(temperature > 0, temperature.to(torch.float32), torch.ones((), device=x.device))[:, None]
    c = logits_scale(t)  # [n, 1]
    m = torch.where(row_max > neg_inf, row_max, -neg_inf)
    d = x.sub_(m)
    infinite_t = None if cpu and not bool((c == 0).any()) else d == neg_inf
    e = torch.fmin(d.mul_(c), zero, out=d).exp2_()
    torch.nn.functional.threshold(e, _BELOW_WEIGHT_MIN, 0.0, inplace=True)  # weights below WEIGHT_MIN: 0
    if infinite_t is not None:
        e.masked_fill_(infinite_t, 0.0)
    e.mul_(reciprocal_sum(e.sum(dim=-1, keepdim=True)))  # rows without mass: e = 0, r = 0
    if onehot is not None:
        torch.where(greedy[:, None], onehot, e, out=e)
