"""PyTorch references of the FlashInfer-compatible sampling operations: the CPU path of
:mod:`spec_samplers.sampling`, and what the Triton kernels, tests and benchmarks compare against.

Every function here takes *resolved* arguments (the public API in :mod:`spec_samplers.sampling.api`
validates and canonicalises them): per-output-row parameter tensors, per-output-row seeds and
offsets, and ``rows`` (the input row of each output: ``indices``, or 0..B-1).

The semantics are defined so that an implementation that never sorts (the kernels' pivot search)
finds exactly the same kept set, whatever order it visits the vocabulary in:

* values: probabilities cleaned as everywhere in the package (NaN, Inf, negatives -> 0), or
  logits with NaN -> -inf and +inf -> the largest finite fp32 (so softmax weights stay finite);
* weights: the probabilities, or w = exp(x - max x) for logits (the unnormalised softmax);
* masses are sums of weights in fixed point, ``round(min(w, 1) * 2**MASS_BITS)`` in int64: integer
  sums do not depend on the summation order, so "mass of the tokens above v" is one exact number;
* top-k keeps v >= tau_k, tau_k the k-th largest value (every token tied with it is kept);
  k <= 0 or k >= V keeps everything;
* top-p keeps v >= tau_p, tau_p the smallest value v with M(> v) < top_p * M_total or M(> v) = 0,
  where M(> v) is the mass of the tokens strictly above v and M_total the mass of the candidates
  (the whole row, or the top-k survivors when top-k is applied first); top_p >= 1 keeps all;
* min-p keeps v >= min(min_p * max, max);
* sampling is the package's two-level exponential race over the kept tokens
  (:func:`spec_samplers.rng.two_level_race`): a group of RACE_GROUP tokens by its fp64 sum of
  kept weights, then a token of that group, argmax_x (w_x * 2**32) / E_x, with Exp(1) variables
  from 64 random bits keyed by (row seed, row offset) on the sampling stream of the Philox
  generator (:mod:`spec_samplers.rng`), ties to the lowest index. It reads no running
  sum, so it too is independent of the visiting order.
"""

from __future__ import annotations

import torch

from spec_samplers import rng
from spec_samplers.constants import FLOAT32_MAX
from spec_samplers.constants import SAMPLING_MASS_BITS as MASS_BITS
from spec_samplers.torch_ops import clean_probs, probs_from_logits, reciprocal_sum, scaled_exp

MASS_SCALE = float(2**MASS_BITS)


def clean_logits(x: torch.Tensor, owned: bool = False) -> torch.Tensor:
    """fp32 copy of logits with NaN -> -inf, +inf -> FLOAT32_MAX and -0.0 -> +0.0 (in place in x
    when ``owned``: a copy the caller made, e.g. by indexing rows)."""
    x = x.to(torch.float32, copy=not (owned and x.dtype == torch.float32))  # then in place: 3 passes, not 7
    return torch.nan_to_num_(x, nan=float("-inf"), posinf=FLOAT32_MAX, neginf=float("-inf")).add_(0.0)


def logit_weights(x: torch.Tensor, owned: bool = False) -> torch.Tensor:
    """x: [N, V] cleaned logits. Returns [N, V] fp32 exp(x - row max) (0 everywhere on a row
    that is all -inf); in x when ``owned`` (the caller's copy: no second [N, V] allocation, whose
    page faults cost as much as the exp on one CPU thread)."""
    m = x.amax(dim=-1, keepdim=True)
    m = torch.where(m > float("-inf"), m, torch.zeros((), device=x.device))
    return (x.sub_(m) if owned else torch.sub(x, m)).exp_()


def fixed_mass(w: torch.Tensor) -> torch.Tensor:
    """int64 fixed-point units of fp32 weights (any shape): round(min(w, 1) * 2**MASS_BITS)."""
    return (w.clamp(max=1.0) * MASS_SCALE + 0.5).to(torch.int64)


def values_and_weights(x: torch.Tensor, logits: bool, owned: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(values the filters compare, weights the masses and the race use), both [N, V] fp32
    (``owned``: x is the caller's copy, cleaned in place)."""
    if logits:
        v = clean_logits(x, owned)
        return v, logit_weights(v)
    v = clean_probs(x)
    return v, v


# ---------------------------------------------------------------------------------------------
# Thresholds: every filter keeps the tokens whose value is >= a per-row threshold tau.


def min_p_threshold(row_max: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """[B] fp32 min(min_p * max, max): the row's most probable tokens always stay."""
    return torch.minimum(min_p.to(torch.float32) * row_max, row_max)


def filter_threshold(
    values: torch.Tensor,  # [B, V] fp32 cleaned values
    weights: torch.Tensor,  # [B, V] fp32 weights
    top_k: torch.Tensor | None,  # [B] int64
    top_p: torch.Tensor | None,  # [B] fp32
    min_p: torch.Tensor | None,  # [B] fp32
    joint: bool = False,  # top-k and top-p on the full row (True) or top-p after top-k (False)
    fast: bool = False,
    min_p_first: bool = False,  # vLLM's order: min-p, then top-k, then top-p on the survivors
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (tau [B] fp32: keep values >= tau, kept mass [B] int64).

    FlashInfer's order (default) applies min-p last, to the values top-k / top-p kept; vLLM's
    (``min_p_first``) applies it first, so top-p's total is the mass of the min-p and top-k
    survivors. Top-k keeps the same tokens either way (max(tau_min_p, tau_k)).

    ``fast`` (CPU: it reads data-dependent sizes on the host) sorts only a prefix of each row
    (torch.topk), growing it until the thresholds are decided inside it: the same tau as the full
    sort, whose tie order does not matter."""
    B, V = values.shape
    row_max = values.max(dim=-1).values
    row_min = values.min(dim=-1).values
    floor = row_min
    if min_p is not None and min_p_first:
        floor = torch.maximum(row_min, min_p_threshold(row_max, min_p))
    tau = floor
    if top_k is not None or top_p is not None:
        size = V
        if fast and B:
            size = min(V, 256)
            if top_k is not None:
                size = max(size, min(V, int(torch.where((top_k <= 0) | (top_k >= V), 1, top_k).max())))
        while True:
            order = torch.topk(values, size, dim=-1) if size < V else torch.sort(values, dim=-1, descending=True)
            sorted_desc = order.values
            decided = torch.ones(B, dtype=torch.bool, device=values.device)
            tau = floor
            if top_k is not None:
                off = (top_k <= 0) | (top_k >= V)
                decided &= off | (top_k <= size)
                tau = torch.where(off, floor, torch.maximum(floor, top_k_threshold(sorted_desc, top_k.clamp(1, size))))
            if top_p is not None:
                tau_lo = floor if joint or top_k is None else tau
                total = torch.where(values >= tau_lo[:, None], fixed_mass(weights), 0).sum(dim=-1)
                sorted_mass = fixed_mass(weights.gather(1, order.indices))
                tau_p, inside = top_p_threshold(sorted_desc, sorted_mass, top_p, tau_lo, total)
                decided &= inside | (size == V)
                tau = torch.maximum(tau, tau_p)
            if size == V or bool(decided.all()):
                break
            size = min(V, size * 8)
    if min_p is not None:
        tau = torch.maximum(tau, min_p_threshold(row_max, min_p))
    kept_mass = torch.where(values >= tau[:, None], fixed_mass(weights), 0).sum(dim=-1)
    return tau, kept_mass


def top_k_threshold(sorted_desc: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """tau_k, the k-th largest value, from the S largest values sorted descending ([B, S]) and
    k [B] int64 in [1, S]."""
    return sorted_desc.gather(1, (k - 1)[:, None])[:, 0]


def top_p_threshold(
    sorted_desc: torch.Tensor,  # [B, S] the S largest values, descending
    sorted_mass: torch.Tensor,  # [B, S] int64 their fixed-point weights
    top_p: torch.Tensor,  # [B] fp32
    tau_lo: torch.Tensor,  # [B] fp32
    total: torch.Tensor,  # [B] int64 M(>= tau_lo) over the whole row
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tau_p, whether the prefix decided it). tau_p is the smallest candidate value v (v >=
    tau_lo) with M(> v) < top_p * M(>= tau_lo) or M(> v) = 0 (top_p >= 1: tau_lo). In descending
    order the positions whose exclusive prefix mass passes form a prefix, and its last position
    holds tau_p whatever the order of ties. The prefix decides when a position inside it fails
    (every candidate beyond would fail too) or top_p >= 1."""
    candidate = sorted_desc >= tau_lo[:, None]
    above = torch.cumsum(sorted_mass, dim=-1) - sorted_mass
    threshold = top_p.to(torch.float64) * total.to(torch.float64)
    passes = candidate & ((above == 0) | (above.to(torch.float64) < threshold[:, None]))
    count = passes.sum(dim=-1)
    tau = sorted_desc.gather(1, (count.clamp(min=1) - 1)[:, None])[:, 0]
    inside = (count < sorted_desc.shape[1]) | (top_p >= 1)
    return torch.where(top_p >= 1, tau_lo, tau), inside


# ---------------------------------------------------------------------------------------------
# Operations.


def softmax_reference(
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    temperature: torch.Tensor,  # [B] fp32; 0 = greedy (one-hot of the argmax), other values <= 0 act as 1
    fast: bool | None = None,
) -> torch.Tensor:
    """[B, V] fp32 softmax(logits / T): the package's one logits rule
    (:func:`spec_samplers.torch_ops.probs_from_logits`, exp((x - max) / T) / sum, as the
    verification samplers); a row that is all -inf (or NaN) gives zeros.

    ``fast`` (default: on CPU) runs torch.softmax on every row and the spelled-out rule only on
    the rows that need it (non-finite logits, T == 0), found on the host."""
    if fast is None:
        fast = logits.device.type == "cpu"
    if not (fast and logits.shape[0]):
        return probs_from_logits(logits, temperature)
    t = torch.where(temperature > 0, temperature.to(torch.float32), torch.ones((), device=logits.device))
    x = logits.to(torch.float32)
    probs = torch.softmax(x if bool((t == 1).all()) else x / t[:, None], dim=-1)
    # NaN propagates through both: they find the non-finite rows (on one CPU thread amin and amax
    # take a tenth of torch.aminmax's time, which does not vectorise: 27 against 282 us at [2, 32000])
    lo, hi = x.amin(dim=-1), x.amax(dim=-1)
    special = torch.nonzero((temperature == 0) | ~torch.isfinite(lo) | ~torch.isfinite(hi)).flatten()
    if special.numel():
        probs[special] = probs_from_logits(logits[special], temperature[special])
    return probs


def filtered_softmax_reference(
    logits: torch.Tensor,  # [N, V] fp32/fp16/bf16
    temperature: torch.Tensor,  # [N] float; 0 = greedy (one-hot of the argmax), other values <= 0 act as 1
    top_k: torch.Tensor | None = None,  # [N] int64, 0 = off
    top_p: torch.Tensor | None = None,  # [N] fp32, 1 = off
    min_p: torch.Tensor | None = None,  # [N] fp32, 0 = off
    fast: bool | None = None,
) -> torch.Tensor:
    """[N, V] fp32: the distribution a verification sampler judges against when a request brings
    SamplingParams, defined so that a kernel can apply it while reading logits, without writing it.

    Weights are the shared logits rule e = exp((x - max) / T) (:func:`spec_samplers.torch_ops.scaled_exp`,
    1 at the max); the filters keep e >= tau in vLLM's order (min-p: e >= min_p; top-k, ties kept;
    top-p on the survivors' fixed-point mass; :func:`filter_threshold` with ``min_p_first``), and the
    kept weights are multiplied by the reciprocal of their fixed-point mass (a sum that does not depend
    on the order it is taken in, so a kernel gets the same float, and the same q). Greedy rows (T = 0)
    are the one-hot of the argmax, rows without a finite or +inf logit all zero, as
    :func:`spec_samplers.torch_ops.probs_from_logits`.

    Example::

        >>> q = filtered_softmax_reference(torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([1.0]),
        ...                                top_k=torch.tensor([2]))
        >>> q[0, 2].item()
        0.0
    """
    if fast is None:
        fast = logits.device.type == "cpu"
    x = torch.fmax(logits.to(torch.float32), torch.full((), float("-inf"), device=logits.device))  # NaN -> -inf
    row_max = x.amax(dim=-1, keepdim=True)
    t = torch.where(temperature > 0, temperature.to(torch.float32), torch.ones((), device=x.device))[:, None]
    e = scaled_exp(x, row_max, t)
    tau, kept_mass = filter_threshold(e, e, top_k, top_p, min_p, fast=fast, min_p_first=True)
    kept_sum = kept_mass.to(torch.float32) * (1.0 / MASS_SCALE)
    keep = (e >= tau[:, None]) & (kept_sum > 0)[:, None]
    probs = torch.where(keep, e * reciprocal_sum(kept_sum)[:, None], 0.0)  # the kernels' e * r
    greedy = probs_from_logits(x, torch.zeros_like(temperature))  # one-hot rows (zero without mass)
    return torch.where((temperature == 0)[:, None], greedy, probs)


def race(
    weights: torch.Tensor,  # [B, V] fp32
    kept: torch.Tensor,  # [B, V] bool
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
) -> torch.Tensor:
    """[B] int64: a sample of the kept weights, normalised, by the two-level race
    (:func:`spec_samplers.rng.sample_race`). Rows without kept mass give some index
    (callers mark them invalid)."""
    # a token left out weighs 0: it never wins level 1 (its group's sum leaves it out) nor
    # level 2 against a kept token of positive weight
    return rng.sample_race(torch.where(kept, weights, 0.0), seeds, offsets)


def sample_reference(
    x: torch.Tensor,  # [R, V] probabilities or logits (fp32/fp16/bf16)
    rows: torch.Tensor,  # [B] int64: the input row of each output (outside [0, R): no row)
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
    logits: bool = False,
    top_k: torch.Tensor | None = None,  # [B] int64
    top_p: torch.Tensor | None = None,  # [B] fp32
    min_p: torch.Tensor | None = None,  # [B] fp32
    joint: bool = False,
    fast: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per output row from its input row, filtered. Returns (tokens [B] int64, valid [B]
    bool). A row is valid when it exists and has mass (a probability > 0, or a logit > -inf);
    invalid rows give the token -1 (a missing token, never a wrong one).

    ``fast`` (default: on CPU tensors) takes a shortcut that reads sizes on the host (a sorted
    prefix instead of a full sort); the tokens are the same."""
    R, V = x.shape
    B = rows.shape[0]
    if R == 0:
        return torch.full((B,), -1, dtype=torch.int64, device=x.device), torch.zeros(
            B, dtype=torch.bool, device=x.device
        )
    if fast is None:
        fast = x.device.type == "cpu"
    row_ok = (rows >= 0) & (rows < R)
    # (index_select: a tenth of x[rows]'s time on one CPU thread, 34 against 248 us at [1, 128256])
    values, weights = values_and_weights(x.index_select(0, rows.clamp(0, R - 1)), logits, owned=True)
    if top_k is None and top_p is None and min_p is None:  # no filter: every token is kept
        tokens = rng.sample_race(weights, seeds, offsets)
    else:
        tau, _ = filter_threshold(values, weights, top_k, top_p, min_p, joint, fast)
        tokens = race(weights, values >= tau[:, None], seeds, offsets)
    valid = row_ok & (values.amax(dim=-1) > (float("-inf") if logits else 0.0))
    return torch.where(valid, tokens, -1), valid


def renorm_reference(
    probs: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor | None = None,  # [B] int64
    top_p: torch.Tensor | None = None,  # [B] fp32
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """[B, V] kept probabilities divided by the kept mass (as a float: units * 2**-MASS_BITS),
    0 elsewhere; a row without mass gives zeros."""
    values = clean_probs(probs)
    tau, kept_mass = filter_threshold(values, values, top_k, top_p, None, fast=probs.device.type == "cpu")
    denom = kept_mass.to(torch.float32) * (1.0 / MASS_SCALE)
    safe = torch.where(denom > 0, denom, 1.0)
    out = torch.where((values >= tau[:, None]) & (denom > 0)[:, None], values / safe[:, None], 0.0)
    return out.to(out_dtype)


def mask_logits_reference(
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor,  # [B] int64
) -> torch.Tensor:
    """[B, V] logits (input dtype) with every token below the k-th largest set to -inf (NaN
    logits become -inf)."""
    values = clean_logits(logits)
    tau, _ = filter_threshold(values, values, top_k, None, None, fast=logits.device.type == "cpu")
    keep = (values >= tau[:, None]) & ~torch.isnan(logits)
    return torch.where(keep, logits, torch.full((), float("-inf"), dtype=logits.dtype, device=logits.device))
