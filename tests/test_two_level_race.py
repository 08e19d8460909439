"""The two-level race (spec_samplers.rng.two_level_race, issue 23): its law, its tails, its
independence from padding and vocabulary splits, and kernel == reference beyond one race group.

Statistical tests use fixed seeds; each states its false-failure rate at a random seed.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE
from conftest import to_device as _dev
from kernel_cases import make_case, ragged_view
from op_entries import (
    block_verify_ragged_reference,
    block_verify_ragged_triton,
    block_verify_reference,
    block_verify_triton,
    rejection_sample_ragged_reference,
    rejection_sample_ragged_triton,
    rejection_sample_reference,
    rejection_sample_triton,
)
from scipy import stats
from test_rng import _race_partition, exp_cdf

from spec_samplers import rng
from spec_samplers.kernels import sampling_launch as sl
from spec_samplers.kernels.backend import vocab_split
from spec_samplers.sampling.reference import sample_reference

G = rng.RACE_GROUP


def _fp32_ceil(x: torch.Tensor) -> torch.Tensor:
    """Smallest fp32 >= x (fp64 x > 0): E < x iff E < _fp32_ceil(x) for fp32 E."""
    down = x.to(torch.float32)
    return torch.where(down.double() < x, torch.nextafter(down, torch.tensor(float("inf"))), down)


@pytest.mark.parametrize("w", [1e-12, 1e-10, 1e-6, 1e-3, 0.3])
def test_level1_win_probability_of_tail_groups_is_exact(w):
    """Level 1 compares fp64 keys S_g / E_g: a group of relative weight w wins iff E_g < rho *
    E_1 in exact arithmetic (rho = w / (1 - w), E_1 the competitors' Exp(1) of their total,
    fp64 keeps rho * E_1 to 2**-53), so P = E[F(rho E_1)] with F the exact CDF of our fp32 E at
    the next fp32 above rho * y. Bracketed by the Riemann-Stieltjes sums of test_rng's exact
    partition (rigorous, +-6.4e-4): within 1e-3 of w at 1e-12 (the issue asks 1%)."""
    rho = w / (1 - w)
    y, F_y = _race_partition()
    F_rho = exp_cdf(_fp32_ceil((y.double() * rho).clamp(min=1e-40)))
    masses = [b - a for a, b in zip([0.0] + F_y, F_y + [1.0])]
    lower = sum(m * f for m, f in zip(masses[1:], F_rho))
    upper = sum(m * f for m, f in zip(masses, F_rho + [1.0]))
    assert 1 - 1e-3 < lower / w <= upper / w < 1 + 1e-3, (lower / w, upper / w)


def test_one_product_mulhilo_equals_the_16_bit_split():
    """The CPU Philox's one-int64-product multiply gives the words of the overflow-free split,
    extremes included (products up to 2**64 - 2**33)."""
    x = torch.cat([torch.randint(0, 2**32, (50000,)), torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1])])
    for m in (rng.PHILOX_M0, rng.PHILOX_M1):
        for got, want in zip(rng._mulhilo(x, m), rng.mulhilo_split(x, m)):
            assert torch.equal(got, want)


def test_level1_keys_keep_a_1e12_group_against_a_heavy_one():
    """The rule itself: sums (1e-12, 1) with E = (e_small, 1): the small group wins exactly when
    e_small < 1e-12 (fp64 keys; fp32 keys or fp32 sums would merge the tail)."""
    sums = torch.tensor([[1e-12, 1.0], [1e-12, 1.0]], dtype=torch.float64)
    e = torch.tensor([[0.99e-12, 1.0], [1.01e-12, 1.0]])
    assert rng.pick_group(sums, e).tolist() == [0, 1]


def _draw(weights: torch.Tensor, n: int, stream: int = rng.STREAM_RECOVER) -> torch.Tensor:
    """n tokens of the same row under n seeds (position 3, offset 5)."""
    seeds = torch.arange(n, dtype=torch.int64) * 7919 + 11
    return rng.recovery_race(
        weights.expand(n, -1), seeds, torch.full((n,), 5), torch.full((n,), 3, dtype=torch.int64), stream
    )


def test_level1_and_token_law_chi_square_with_a_partial_last_group():
    """V = 3 groups + 77 (a partial last group): the group frequencies (level 1) and the token
    frequencies both follow the weights (chi-square, 20000 draws; false-failure rate 1e-3 each)."""
    V = 3 * G + 77
    g = torch.Generator().manual_seed(23)
    w = torch.rand(1, V, generator=g) + 0.2
    w[0, 2 * G : 3 * G] *= 0.05  # one light group
    n = 20000
    tokens = _draw(w, n)
    p = w[0].double() / w[0].double().sum()
    groups = torch.bincount(tokens // G, minlength=4).double()
    p_group = torch.stack([p[i * G : (i + 1) * G].sum() for i in range(4)])
    assert stats.chisquare(groups, n * p_group).pvalue > 1e-3
    counts = torch.bincount(tokens, minlength=V).double()
    assert stats.chisquare(counts, n * p).pvalue > 1e-3


def test_group_sums_exponentials_and_layout():
    """Group sums are fp64 over consecutive groups (last partial); level-2 exponentials are the
    single-level race's of entries 0..G-1 at the same position; level 1 draws from its own
    counters (never a level-2 block)."""
    V = 2 * G + 5
    w = torch.rand(3, V)
    sums = rng.race_group_sums(w)
    assert sums.dtype == torch.float64 and sums.shape == (3, 3)
    assert torch.allclose(sums[:, 2], w[:, 2 * G :].double().sum(-1))
    seeds, offsets, pos = torch.tensor([1, 2, 3]), torch.tensor([0, 7, 0]), torch.tensor([0, 1, 2])
    e1, e2 = rng.race_exponentials(seeds, offsets, pos << 32, 3, rng.STREAM_RECOVER)
    assert e1.shape == (3, 3) and e2.shape == (3, G)
    assert torch.equal(e2, rng.recover_exponentials(seeds, offsets, pos, G))
    w0, w1, w2, w3 = rng.philox_words(seeds, offsets, (pos << 32) + rng.LEVEL1_COUNTER + 1, rng.STREAM_RECOVER)
    assert torch.equal(e1[:, 2], rng.exponential_from_words(w0, w1))


def test_padding_and_row_neighbours_do_not_change_tokens():
    """Order-free and batch invariant: zero padding (whole new groups, or completing the last
    group) gives the same tokens, and so does drawing a row alone or among others."""
    V = 2 * G + 40
    g = torch.Generator().manual_seed(5)
    w = torch.rand(64, V, generator=g) ** 8
    seeds = torch.randint(0, 2**62, (64,), generator=g)
    offsets = torch.randint(0, 2**40, (64,), generator=g)
    pos = torch.randint(0, 8, (64,), generator=g)
    base = rng.recovery_race(w, seeds, offsets, pos)
    for extra in (G - 40, 3 * G + 1):
        padded = torch.nn.functional.pad(w, (0, extra))
        assert torch.equal(rng.recovery_race(padded, seeds, offsets, pos), base)
    one = [slice(i, i + 1) for i in (0, 9, 63)]
    alone = torch.cat([rng.recovery_race(w[r], seeds[r], offsets[r], pos[r]) for r in one])
    assert alone.tolist() == base[[0, 9, 63]].tolist()


def test_tokens_have_mass_and_zeros_never_win():
    """A token with weight 0 never wins against positive weights, in any group."""
    V = 5 * G
    w = torch.zeros(200, V)
    w[:, 3] = 1e-30
    w[:100, 4 * G + 7] = 1.0
    seeds = torch.arange(200) * 13
    zero = torch.zeros(200, dtype=torch.int64)
    won = rng.recovery_race(w, seeds, zero, zero)
    assert set(won[100:].tolist()) == {3}
    assert set(won[:100].tolist()) <= {3, 4 * G + 7}


# ---------------------------------------------------------------------------------------------
# Kernels == reference beyond one race group (interpreter: small B and K).


def _split(V: int, B: int, block_v: int, num_blocks: int):
    return vocab_split(V, B, DEVICE, block_v=block_v, num_blocks=num_blocks)


@pytest.mark.parametrize("V", [2100, 2300])
def test_rejection_kernel_equals_reference_across_groups_and_splits(V):
    B, K = 3, 2
    case = make_case(B, K, V, seed=V, closeness=0.2, greedy="mixed")
    target, draft, ids, bonus, seeds, offs, greedy = _dev(
        case.target, case.draft, case.draft_ids, case.bonus, case.seeds, case.offsets, case.is_greedy
    )
    ref = rejection_sample_reference(target, bonus, draft, ids, seeds, offs, greedy)
    for block_v, nb in ((64, 3), (512, 2)):  # below and above a race group; different splits
        out = rejection_sample_triton(target, bonus, draft, ids, seeds, offs, greedy, split=_split(V, B, block_v, nb))
        assert torch.equal(out, ref), (block_v, nb, out, ref)
    rt, rd, rids, cu = _dev(*ragged_view(case.target, case.draft, case.draft_ids, torch.tensor([2, 0, 1])))
    ref = rejection_sample_ragged_reference(rt, bonus[:, 0], rd, rids, cu, K, seeds, offs, greedy)
    split = _split(V, B, 256, 3)
    out = rejection_sample_ragged_triton(rt, bonus[:, 0], rd, rids, cu, K, seeds, offs, greedy, split=split)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("use_draft", [True, False])
def test_block_kernel_equals_reference_across_groups(use_draft):
    B, K, V = 3, 2, 2100
    case = make_case(B, K, V, seed=7 + use_draft, closeness=0.3)
    target, draft, ids, bonus, seeds, offs = _dev(
        case.target, case.draft if use_draft else None, case.draft_ids, case.bonus, case.seeds, case.offsets
    )
    ref = block_verify_reference(target, bonus, draft, ids, seeds, offs)
    out = block_verify_triton(target, bonus, draft, ids, seeds, offs, split=_split(V, B, 128, 3))
    assert torch.equal(out, ref), (out, ref)
    rt, rd, rids, cu = _dev(*ragged_view(case.target, case.draft, case.draft_ids, torch.tensor([2, 1, 0])))
    rd = rd if use_draft else None
    ref = block_verify_ragged_reference(rt, bonus[:, 0], rd, rids, cu, K, seeds, offs)
    out = block_verify_ragged_triton(rt, bonus[:, 0], rd, rids, cu, K, seeds, offs, split=_split(V, B, 512, 2))
    assert torch.equal(out, ref)


@pytest.mark.parametrize("logits", [False, True])
def test_sampling_kernel_equals_reference_across_groups_and_splits(logits):
    B, V = 4, 2300
    g = torch.Generator().manual_seed(31 + logits)
    x = 3 * torch.randn(B, V, generator=g)
    if not logits:
        x = torch.softmax(x, -1)
    rows = torch.tensor([0, 1, 2, 3])
    seeds = torch.randint(0, 2**62, (B,), generator=g)
    offsets = torch.randint(0, 2**40, (B,), generator=g)
    top_k = torch.tensor([0, 50, 1000, 3])
    x, rows, seeds, offsets, top_k = _dev(x, rows, seeds, offsets, top_k)
    ref, _ = sample_reference(x, rows, seeds, offsets, logits=logits, top_k=top_k)
    for block_v, nb in ((64, 3), (1024, 2)):
        got, _ = sl.sample_triton(
            x=x, rows=rows, seeds=seeds, offsets=offsets, logits=logits, top_k=top_k, split=_split(V, B, block_v, nb)
        )
        assert torch.equal(got, ref), (block_v, nb, got, ref)
