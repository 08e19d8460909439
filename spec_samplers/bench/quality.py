"""What a sampler buys and what it costs: acceptance, emitted tokens, theory, output TV.

Each context c (a pair q_c, p_c over V tokens, see ``workloads``) is repeated over ``rows`` rows;
every row proposes k drafts, each drawn from p_c, and a bonus token drawn from q_c, and all k
positions use the same pair. Measured, over all rows:

    per_position[i]  fraction of rows whose draft at position i was accepted (unconditional, as
                     vLLM's per-position acceptance counters: accepted at i / rows)
    acceptance       accepted drafts / proposed drafts (= mean of per_position)
    emitted          mean tokens emitted per step (accepted drafts + 1)

Theory for lossless samplers, with a_c = sum_x min(p_c(x), q_c(x)) = 1 - TV(p_c, q_c):
    per_position[i] = mean_c a_c^(i+1);  acceptance = mean_c (a_c + ... + a_c^k) / k;
    emitted = mean_c (1 - a_c^(k+1)) / (1 - a_c) = mean_c (1 + a_c + ... + a_c^k).
Rows are independent, so measured - theory is asymptotically normal with the reported standard
error (sample std of the per-row count / sqrt(rows)); ``z`` is that difference in standard errors.
|z| < 4.5 fails with probability 7e-6 for an exact sampler (two-sided normal tail).

Block verification (a sampler whose class declares ``acceptance_law = "block"``): the accepted
length tau satisfies P(tau >= i) = E_{x ~ p}[rho_i(x_1..x_i)] with the running ratio
rho_i = min(rho_{i-1} q(x_i) / p(x_i), 1), rho_0 = 1 (Sun et al. 2024; checked exactly in
tests/test_block_verification.py), so per_position[i] = mean_c E[rho_{i+1}],
emitted = 1 + mean_c E[rho_1 + ... + rho_k]. No closed form: ``block_theory`` estimates the
expectations by Monte Carlo (``BLOCK_THEORY_DRAWS`` draft blocks per context) and reports the
estimate's standard error, which ``z`` adds to the measurement's. For point-mass drafts rho_i =
q(x)^i: the token-wise closed form, exactly (block verification gains nothing there).

Output quality: the total variation between the distribution of the first emitted token and the
target, estimated per context from the empirical token frequencies over its rows and averaged
over contexts. The estimate is biased upwards by sampling noise: ``noise_floor`` is its exact
mean when the tokens are exact draws from q_c (what a lossless sampler scores on average;
:func:`tv_noise_floor`) and ``noise_sd`` its standard deviation there (:func:`tv_noise_sd`).
``excess`` = estimate - noise_floor and ``excess_z`` = excess / noise_sd: a lossless sampler's
excess_z is roughly a standard score, typical acceptance's excess is its
quality cost.

Where the law of the first emitted token is computable the report gives it exactly instead
(``exact``, no sampling noise): typical acceptance at position 0 emits x ~ p_c when
q_c(x) > threshold(H(q_c)) and argmax q_c otherwise (:func:`typical_first_token_law`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from spec_samplers.reference import typical_threshold
from spec_samplers.torch_ops import clean_probs

#: a chunk's [rows, k+1, V] + [rows, k, V] inputs hold at most this many elements
CHUNK_ELEMENTS = 2**24
#: |z| bound used by the tests and flagged in the report (false-failure rate 7e-6 per check)
Z_BOUND = 4.5

SamplerFn = Callable[..., torch.Tensor]


def lossless_theory(target: torch.Tensor, draft: torch.Tensor, k: int) -> dict[str, Any]:
    """target, draft: [C, V]. Theory of a lossless sampler that repeats each pair at k positions."""
    a = torch.minimum(target.double(), draft.double()).sum(dim=1).clamp(max=1.0)  # [C]
    per_position = [float((a ** (i + 1)).mean()) for i in range(k)]
    return {
        "alpha": float(a.mean()),
        "per_position": per_position,
        "acceptance": sum(per_position) / k if k else 1.0,
        "emitted": 1.0 + sum(per_position),
    }


#: draft blocks per context of block_theory's Monte Carlo estimate (its stderr is ~1e-3 of a token)
BLOCK_THEORY_DRAWS = 2**16


def block_theory(
    target: torch.Tensor,  # [C, V]
    draft: torch.Tensor,  # [C, V]
    k: int,
    point_mass_drafts: bool = False,
    draws: int = BLOCK_THEORY_DRAWS,
    seed: int = 0,
) -> dict[str, Any]:
    """Theory of block verification when each pair repeats at k positions (module docstring):
    the keys of :func:`lossless_theory` plus ``method`` ("closed form" or "monte carlo") and
    ``stderr`` {"acceptance", "emitted"} of the estimate (0 for the closed form)."""
    if point_mass_drafts:
        exact = {"method": "closed form", "stderr": {"acceptance": 0.0, "emitted": 0.0}}
        return {**lossless_theory(target, draft, k), **exact}
    C = target.shape[0]
    q, p = target.double(), draft.double()
    gen = torch.Generator().manual_seed(seed)
    per_position = torch.zeros(k, dtype=torch.float64)
    emitted_mean = emitted_var = 0.0
    for c in range(C):
        x = torch.multinomial(p[c], draws * k, replacement=True, generator=gen).view(draws, k)
        ratio = q[c][x] / p[c][x]  # [draws, k]; drawn tokens have p > 0
        rho = torch.ones(draws, dtype=torch.float64)
        total = torch.zeros(draws, dtype=torch.float64)
        for i in range(k):
            rho = torch.minimum(rho * ratio[:, i], torch.ones(()))
            per_position[i] += rho.mean() / C
            total += rho
        emitted_mean += float(total.mean()) / C
        emitted_var += float(total.var()) / draws / C**2
    a = torch.minimum(q, p).sum(dim=1).clamp(max=1.0)
    emitted_se = emitted_var**0.5
    return {
        "alpha": float(a.mean()),
        "per_position": per_position.tolist(),
        "acceptance": emitted_mean / k if k else 1.0,
        "emitted": 1.0 + emitted_mean,
        "method": "monte carlo",
        "stderr": {"acceptance": emitted_se / k if k else 0.0, "emitted": emitted_se},
    }


def tv_draft_target(target: torch.Tensor, draft: torch.Tensor) -> float:
    """Mean over contexts of TV(p_c, q_c); target, draft: [C, V]."""
    return float(0.5 * (target.double() - draft.double()).abs().sum(dim=1).mean())


def typical_first_token_law(
    target: torch.Tensor,  # [C, V] probabilities as the sampler sees them
    draft: torch.Tensor,  # [C, V] (one-hot rows for point-mass drafts)
    posterior_threshold: float,
    posterior_alpha: float,
) -> torch.Tensor:
    """[C, V] float64: the exact law of typical acceptance's first emitted token when the draft
    at position 0 is drawn from p_c: P(y) = p(y) [q(y) > threshold] + [y = argmax q] * P(reject).

    Example::

        >>> q = torch.tensor([[0.7, 0.2, 0.1]]); p = torch.tensor([[0.1, 0.1, 0.8]])
        >>> typical_first_token_law(q, p, 0.09, 0.3)   # threshold = 0.09: 0.1 passes, so all pass
        tensor([[0.1000, 0.1000, 0.8000]], dtype=torch.float64)
    """
    q = clean_probs(target)
    accept = q.double() > typical_threshold(q, posterior_threshold, posterior_alpha)[:, None]  # [C, V]
    p = draft.double()
    law = torch.where(accept, p, torch.zeros((), dtype=torch.float64))
    rejected = (p * ~accept).sum(dim=1)  # [C]
    return law.scatter_add(1, torch.argmax(q, dim=1, keepdim=True), rejected[:, None])


def _empirical_tv(counts: torch.Tensor, target: torch.Tensor, rows: int) -> torch.Tensor:
    """counts: [..., C, V] token counts over ``rows`` draws per context; target: [C, V]. Returns [..., C]."""
    return 0.5 * (counts.double() / rows - target.double()).abs().sum(dim=-1)


#: replicate estimates on exact draws behind the noise floor's standard deviation
FLOOR_REPLICATES = 128


def tv_noise_floor(target: torch.Tensor, rows: int) -> float:
    """The exact mean of the TV estimate (:func:`_empirical_tv`, averaged over contexts) when the
    ``rows`` tokens of each context are exact draws from its target row: with N ~ Bin(rows, q),
    E|N - rows q| = 2 nu C(rows, nu) q^nu (1 - q)^(rows - nu + 1), nu = floor(rows q) + 1
    (De Moivre's mean absolute deviation of the binomial), summed over tokens."""
    q = target.double().clamp(0.0, 1.0)  # [C, V]
    n = float(rows)
    nu = torch.floor(n * q) + 1
    inside = (q > 0) & (q < 1) & (nu <= n)  # q = 0 or 1 (or nu > n): the count is exact, deviation 0
    qs = torch.where(inside, q, torch.full_like(q, 0.5))
    nus = torch.where(inside, nu, torch.ones_like(nu))
    log_choose = math.lgamma(n + 1) - torch.lgamma(nus + 1) - torch.lgamma(n - nus + 1)
    log_mad = torch.log(2 * nus) + log_choose + nus * torch.log(qs) + (n - nus + 1) * torch.log1p(-qs)
    mad = torch.where(inside, torch.exp(log_mad), torch.zeros_like(q))  # E|N - n q| per token
    return float((0.5 * mad.sum(dim=1) / n).mean())


def tv_noise_sd(target: torch.Tensor, rows: int, generator: torch.Generator) -> float:
    """Standard deviation of the same estimate on exact draws, from FLOOR_REPLICATES replicate
    estimates (its relative error is about 1 / sqrt(2 * FLOOR_REPLICATES), 6%); no closed form: the
    token counts' absolute deviations are correlated through the fixed total."""
    C, V = target.shape
    draws = torch.multinomial(target, rows * FLOOR_REPLICATES, replacement=True, generator=generator)
    draws = draws.view(C, FLOOR_REPLICATES, rows).transpose(0, 1)  # [R, C, rows]
    counts = torch.zeros(FLOOR_REPLICATES, C, V).scatter_add_(2, draws, torch.ones(FLOOR_REPLICATES, C, rows))
    return float(_empirical_tv(counts, target, rows).mean(dim=1).std())


def measure(
    sampler: SamplerFn,
    target: torch.Tensor,  # [C, V] fp32, CPU
    draft: torch.Tensor,  # [C, V] fp32, CPU (one-hot rows when point_mass_drafts)
    k: int,
    rows: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    point_mass_drafts: bool = False,
    lossless: bool | None = None,
    first_token_law: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    law: str = "token",
) -> dict[str, Any]:
    """Run ``sampler(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)`` on
    every context repeated ``rows`` times and return the measured numbers (module docstring),
    with the theory and z-scores when ``lossless``: token-wise rejection's law, or block
    verification's when ``law == "block"``. ``first_token_law(target, draft) -> [C, V]``: the
    exact law of the first emitted token, when known (``tv_output["exact"]``)."""
    if law not in ("token", "block"):
        raise ValueError(f"law: expected 'token' or 'block', got {law!r}")
    if rows < 2:
        raise ValueError(f"rows: expected >= 2, got {rows}")
    if k < 1:
        raise ValueError(f"k: expected >= 1, got {k}")
    C, V = target.shape
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # unseeded stochastic samplers draw their row seeds from here
    draft_ids = torch.multinomial(draft, rows * k, replacement=True, generator=gen).view(C * rows, k)
    bonus_ids = torch.multinomial(target, rows, replacement=True, generator=gen).view(C * rows, 1)

    chunk = max(1, CHUNK_ELEMENTS // ((2 * k + 1) * V))
    counts = torch.zeros(C, V, dtype=torch.float32)
    accepted_counts, emitted_counts = [], []
    per_position = torch.zeros(k, dtype=torch.float64)
    for start in range(0, C * rows, chunk):
        stop = min(start + chunk, C * rows)
        ctx = torch.arange(start, stop) // rows  # [M] context of each row
        q_rows = target[ctx].to(device=device, dtype=dtype)  # [M, V]
        tgt = q_rows[:, None, :].expand(-1, k + 1, -1).contiguous()  # [M, k+1, V]
        drf = None
        if not point_mass_drafts:
            drf = draft[ctx].to(device=device, dtype=dtype)[:, None, :].expand(-1, k, -1).contiguous()  # [M, k, V]
        out = (
            sampler(tgt, bonus_ids[start:stop].to(device), drf, draft_ids[start:stop].to(device)).cpu().long()
        )  # [M, k+1]
        first = out[:, 0]
        if out.shape != (stop - start, k + 1) or bool(((first < 0) | (first >= V)).any()):
            raise RuntimeError(
                f"sampler output: expected shape ({stop - start}, {k + 1}) with a token in [0, {V}) in slot 0, "
                f"got shape {tuple(out.shape)}"
            )
        accepted = out[:, 1:] != -1  # [M, k]: position i accepted iff slot i+1 holds a token
        per_position += accepted.sum(dim=0).double()
        accepted_counts.append(accepted.sum(dim=1))
        emitted_counts.append((out != -1).sum(dim=1))
        counts.index_put_((ctx, first), torch.ones(stop - start), accumulate=True)

    n = C * rows
    acc = torch.cat(accepted_counts).double() / k  # per-row acceptance rate
    emi = torch.cat(emitted_counts).double()
    tv_est = float(_empirical_tv(counts, target, rows).mean())
    tv_floor, tv_sd = tv_noise_floor(target, rows), tv_noise_sd(target, rows, gen)
    result: dict[str, Any] = {
        "rows": n,
        "per_position": (per_position / n).tolist(),
        "acceptance": float(acc.mean()),
        "acceptance_stderr": float(acc.std() / n**0.5),
        "emitted": float(emi.mean()),
        "emitted_stderr": float(emi.std() / n**0.5),
        "tv_draft_target": tv_draft_target(target, draft),
        "tv_output": {
            "estimate": tv_est,
            "noise_floor": tv_floor,
            "noise_sd": tv_sd,
            "excess": tv_est - tv_floor,
            "excess_z": (tv_est - tv_floor) / tv_sd if tv_sd > 0 else None,
            "exact": None,
        },
        "theory": None,
        "z": None,
    }
    if first_token_law is not None:
        exact_law = first_token_law(target.to(dtype).float(), draft.to(dtype).float())  # [C, V]
        result["tv_output"]["exact"] = float((0.5 * (exact_law - target.double()).abs().sum(dim=1)).mean())
    if lossless:
        if law == "block":
            theory = block_theory(target, draft, k, point_mass_drafts, seed=seed)
        else:
            theory = lossless_theory(target, draft, k)
        theory_se = theory.get("stderr", {"acceptance": 0.0, "emitted": 0.0})
        result["theory"] = theory
        result["z"] = {
            "acceptance": _z(
                result["acceptance"], theory["acceptance"], result["acceptance_stderr"], n, theory_se["acceptance"]
            ),
            "emitted": _z(result["emitted"], theory["emitted"], result["emitted_stderr"], n, theory_se["emitted"]),
        }
    return result


def _z(measured: float, expected: float, stderr: float, rows: int, theory_stderr: float = 0.0) -> float:
    # When every row came out the same (e.g. all drafts accepted) the sample std is 0; one row's
    # worth (1 / rows) is then the resolution of the measurement. A Monte Carlo theory's own
    # error adds in quadrature.
    return (measured - expected) / (max(stderr, 1.0 / rows) ** 2 + theory_stderr**2) ** 0.5
