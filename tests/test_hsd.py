"""Hierarchical Speculative Decoding (Zhou et al. 2026) checked by exact law (docs/multipath.md).

Its single-path verification, written in the paper's terms (joint prefix probabilities, the
capped prefix mass, branch masses, step-back probabilities; tests/multipath_cases.py:hsd_law), has
block verification's output law and expected accepted length (float64 enumeration, 1e-12): it
does not accept more than block verification. The released code's full-draft test, min(1, prod
q/p) uncapped, is lossy; the planted fault shipped for ``spec-samplers certify --plant
hsd-full-draft`` is that variant (its completed law fails a chi-square at CHI2_ALPHA = 1e-3, and
its mean accepted length is the variant's exact one within Z_BOUND standard errors).
"""

from __future__ import annotations

import math

import pytest
import torch
from multipath_cases import ToyPair, complete, gbv_law, hsd_law, sample_paths
from stats_helpers import CHI2_ALPHA, Z_BOUND, chi2_pvalue

from spec_samplers import BlockVerificationSampler
from spec_samplers.certify.faults import PLANTS, FullDraftProductSampler, planted_sampler

CASES = [(3, 2, 1), (3, 3, 2), (2, 4, 3), (3, 4, 4), (4, 2, 5)]


@pytest.mark.parametrize("V,L,seed", CASES)
def test_algorithm_2_is_block_verification_in_law_and_acceptance(V, L, seed):
    pair = ToyPair(V, L, seed)
    hsd, hsd_accepted = hsd_law(pair)
    block, block_accepted = gbv_law(pair, 1)
    assert float((hsd - block).abs().max()) < 1e-12
    assert float((hsd - pair.joint_target()).abs().max()) < 1e-12
    assert abs(hsd_accepted - block_accepted) < 1e-12  # "strictly more than block verification": no


@pytest.mark.parametrize("V,L,seed", CASES)
def test_released_full_draft_test_is_lossy_and_accepts_more(V, L, seed):
    pair = ToyPair(V, L, seed)
    released, released_accepted = hsd_law(pair, capped=False)
    _, block_accepted = gbv_law(pair, 1)
    assert 0.5 * float((released - pair.joint_target()).abs().sum()) > 5e-3
    assert released_accepted > block_accepted + 1e-3


def test_the_planted_fault_is_the_released_variant():
    """The shipped fault fails the law test where block verification passes on the same drafts,
    and accepts the released variant's exact mean length."""
    pair = ToyPair(2, 4, seed=3)
    gen = torch.Generator().manual_seed(31)
    B, L = 20000, pair.L
    target, draft, tokens = sample_paths(pair, 1, B, gen)
    bonus = torch.multinomial(target[:, L], 1, generator=gen)
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    args = (target, bonus, draft[:, :L], tokens)
    faulty = FullDraftProductSampler()(*args, seeds=seeds)
    exact = BlockVerificationSampler()(*args, seeds=seeds)
    assert chi2_pvalue(complete(pair, faulty, gen), pair.joint_target()) < CHI2_ALPHA
    assert chi2_pvalue(complete(pair, exact, gen), pair.joint_target()) > CHI2_ALPHA
    _, expected = hsd_law(pair, capped=False)
    mean = float(((faulty != -1).sum(1) - 1).double().mean())
    assert abs(mean - expected) < Z_BOUND * (L / 2) / math.sqrt(B)
    # it only ever adds whole-draft acceptances to block verification's outcomes
    differ = (faulty != exact).any(dim=1)
    assert bool(differ.any()) and bool((faulty[differ] != -1).all())


def test_registered_as_a_plant():
    assert "hsd-full-draft" in PLANTS
    assert type(planted_sampler("hsd-full-draft", 1.0)) is FullDraftProductSampler
