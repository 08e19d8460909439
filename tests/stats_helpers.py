"""Statistical helpers shared by the sampler tests (core and kernel paths).

Every statistical test runs at fixed seeds, so it is deterministic; the stated false-failure
rate is the probability that a correct sampler fails at a random seed.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.stats as stats
import torch

#: per-test significance level of the chi-square tests (false-failure rate at a random seed)
CHI2_ALPHA = 1e-3
#: acceptance and emitted-token checks allow this many standard errors (two-sided false-failure
#: rate 5.7e-7 under the normal approximation)
Z_BOUND = 5.0


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit of integer ``samples`` against ``probs`` [V] (normalised here).

    Bins with expected count < 5 are pooled; a sample in a zero-probability bin gives p = 0.
    """
    probs = probs.double().cpu()
    probs = probs / probs.sum()
    samples = samples.cpu()
    n = samples.numel()
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    if bool((counts[probs == 0] > 0).any()):
        return 0.0
    expected = probs * n
    big = expected >= 5
    obs = counts[big].tolist()
    exp = expected[big].tolist()
    if (~big & (probs > 0)).any():
        obs.append(float(counts[~big].sum()))
        exp.append(float(expected[~big].sum()))
    if len(obs) < 2:
        return 1.0
    return float(stats.chisquare(np.array(obs), np.array(exp)).pvalue)


def binomial_bound(p: float, n: int) -> float:
    """Z_BOUND standard errors of a proportion p over n trials (plus a floor for p near 0 or 1)."""
    return Z_BOUND * math.sqrt(max(p * (1 - p), 1.0 / n) / n)


def expected_emitted(a: float, k: int) -> float:
    """Mean tokens emitted per step with i.i.d. per-position acceptance a: (1 - a^(k+1)) / (1 - a)."""
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
