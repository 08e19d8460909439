"""spec_samplers.rng: Philox4x32-10 known answers, counter layout, precision constants (exact
counting), structural findings of issue 10, statistical tests of the words."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from spec_samplers import rng

M32 = 0xFFFFFFFF


def philox_python(ctr: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """Philox4x32-10 on Python ints, straight from the Random123 definition."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0 = rng.PHILOX_M0 * c0
        p1 = rng.PHILOX_M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0 = (k0 + rng.PHILOX_W0) & M32
        k1 = (k1 + rng.PHILOX_W1) & M32
    return c0, c1, c2, c3


def t64(v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int64)


# Random123 kat_vectors: philox4x32 10 ctr[4] key[2] -> out[4]
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32, M32, M32, M32), (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_philox_known_answers(ctr, key, expected):
    out = rng.philox4x32(*(t64(c) for c in ctr), *(t64(k) for k in key))
    assert tuple(int(w) for w in out) == expected
    assert philox_python(ctr, key) == expected


def test_philox_matches_python_on_random_inputs():
    g = torch.Generator().manual_seed(0)
    words = torch.randint(0, 2**32, (6, 300), generator=g, dtype=torch.int64)
    out = rng.philox4x32(*words)
    for i in range(300):
        ref = philox_python(tuple(int(w) for w in words[:4, i]), (int(words[4, i]), int(words[5, i])))
        assert tuple(int(o[i]) for o in out) == ref


def test_random_words_counter_layout():
    """Key = seed (64 bits), counter = (counter lo, counter hi | stream << 24, offset lo, offset hi)."""
    seed, offset, counter, stream = -3, 2**40 + 5, 2**33 + 7, 9
    words = rng.random_words(t64(seed), t64(offset), t64(counter), stream)
    ctr = (counter & M32, (counter >> 32) | (stream << 24), offset & M32, (offset >> 32) & M32)
    assert tuple(words.tolist()) == philox_python(ctr, (seed & M32, (seed >> 32) & M32))


def test_random_words_broadcasts_and_rejects_bad_streams():
    w = rng.random_words(torch.tensor([[1], [2]]), torch.tensor([0]), torch.arange(5), rng.STREAM_RECOVER)
    assert w.shape == (2, 5, 4) and w.dtype == torch.int64
    assert int(w.min()) >= 0 and int(w.max()) <= M32
    single = rng.random_words(t64(2), t64(0), t64(3), rng.STREAM_RECOVER)
    assert torch.equal(w[1, 3], single)
    for bad in (-1, 256, 1.0):
        with pytest.raises(ValueError, match="stream"):
            rng.random_words(t64(0), t64(0), t64(0), bad)


def test_uniform_and_exponential_ranges():
    # pairs in increasing order of n = a * 2**32 + b
    a = torch.tensor([0, 0, 255, 256, 2**24 - 1, M32, M32], dtype=torch.int64)
    b = torch.tensor([0, M32, M32, 0, M32, 0, M32], dtype=torch.int64)
    u = rng.uniform_from_words(a, b)
    assert float(u.min()) == rng.UNIFORM_MIN and float(u.max()) == rng.UNIFORM_MAX
    assert torch.all(u[1:] >= u[:-1])  # monotone in a * 2**32 + b
    e = rng.exponential_from_words(a, b)
    assert float(e.min()) == pytest.approx(rng.EXP_MIN, rel=1e-6)
    assert float(e.max()) == pytest.approx(rng.EXP_MAX, rel=1e-6)
    assert math.isclose(rng.EXP_MAX, -math.log(2.0**-24))


def test_cpu_exponentials_are_the_rounded_fp64_log1p():
    """On the CPU, E is -log1p(-u) computed in fp64 and rounded once to fp32 (torch's fp32 log1p
    is not vectorised there); the ``out=`` form (a strided view) writes the same values."""
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(0, 2**32, (4096,), generator=gen)
    b = torch.randint(0, 2**32, (4096,), generator=gen)
    u = rng.uniform_from_words(a, b).to(torch.float64)
    expected = (-torch.log1p(-u)).to(torch.float32)
    assert torch.equal(rng.exponential_from_words(a, b), expected)
    out = torch.empty(4096, 2)
    rng.exponential_from_words(a, b, out=out[:, 1])
    assert torch.equal(out[:, 1], expected)


# ---------------------------------------------------------------------------------------------
# Exact counting: u = uniform_from_words(a, b) is monotone in n = a * 2**32 + b, so
# P(u < x) = #{n : u(n) < x} / 2**64 is found by binary search over n.


def _search(lo: torch.Tensor, hi: torch.Tensor, reaches) -> torch.Tensor:
    """Smallest v in (lo, hi] with reaches(v) (reaches monotone; reaches(hi) assumed), elementwise."""
    while bool((hi - lo > 1).any()):
        mid = (lo + hi) // 2
        ok = reaches(mid)
        hi, lo = torch.where(ok, mid, hi), torch.where(ok, lo, mid)
    return hi


def prob_below(x: torch.Tensor) -> torch.Tensor:
    """Exact P(u < x) for fp32 thresholds x: u = uniform_from_words(a, b) is non-decreasing in
    n = a * 2**32 + b, so #{n : u(n) < x} = a* 2**32 + b* with a* the first a whose largest u
    reaches x and b* the first b reaching x within a* (two binary searches). float64 [x.shape]."""
    top = torch.full(x.shape, M32, dtype=torch.int64)
    none = rng.uniform_from_words(top, top) < x  # no n reaches x: probability 1
    a_star = _search(torch.full(x.shape, -1), top, lambda a: rng.uniform_from_words(a, top) >= x)
    b_star = _search(torch.full(x.shape, -1), top, lambda b: rng.uniform_from_words(a_star, b) >= x)
    p = a_star.double() * 2.0**-32 + b_star.double() * 2.0**-64
    return torch.where(none, torch.ones((), dtype=torch.float64), p)


def fp32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(torch.float32)


def test_uniform_cdf_is_exact_to_the_stated_constant():
    """|P(u < x) - x| <= UNIFORM_CDF_REL_ERR * x + 2**-64 for fp32 x over 64 binades, and the
    accept probability at q/p = 1e-9 (the old 24-bit uniforms gave 2**-24: 58x too often)."""
    g = torch.Generator().manual_seed(3)
    xs = [1e-9, 1e-7, 1e-12, 1e-18, 2.0**-24, 3e-8, 0.5, 0.999, 1.0 - 2.0**-24, 1.0, 2.0**-63, 1e-3]
    xs += (10.0 ** (-19 * torch.rand(60, generator=g, dtype=torch.float64))).tolist()
    x = fp32(xs)
    for xv, p in zip(x.double().tolist(), prob_below(x).tolist()):
        assert abs(p - xv) <= rng.UNIFORM_CDF_REL_ERR * xv + rng.UNIFORM_MIN, (xv, p)
    # q/p = 1e-9: accept iff u < fl(q/p)
    q, p = fp32([1e-9]), fp32([1.0])
    ratio = (q / p).double().item()
    prob = prob_below(q / p).item()
    assert abs(prob / ratio - 1) < 2**-22


def _e_of_u(bits: torch.Tensor) -> torch.Tensor:
    """E = -log1p(-u) for fp32 u given by its bit pattern (int64 tensor)."""
    return -torch.log1p(-bits.to(torch.int32).view(torch.float32))


def test_exponential_is_monotone_in_u():
    """E = -log1p(-u) is non-decreasing over fp32 u (checked on 2**20 sorted u, all binades), so
    P(E < x) = P(u < u*(x)) with u*(x) the smallest u whose E reaches x."""
    g = torch.Generator().manual_seed(4)
    lo_bits, hi_bits = 0x1F800000, 0x3F7FFFFF  # 2**-64 .. 1 - 2**-24
    bits = torch.randint(lo_bits, hi_bits + 1, (2**20,), generator=g, dtype=torch.int64).sort().values
    e = -torch.log1p(-bits.to(torch.int32).view(torch.float32))
    assert bool(torch.all(e[1:] >= e[:-1]))


def exp_cdf(x: torch.Tensor) -> list[float]:
    """Exact P(E < x) of exponential_from_words for fp32 thresholds x (> 0), by counting."""
    # smallest fp32 u (as int32 bits; positive floats order like their bits) with E(u) >= x
    lo = torch.full(x.shape, 0x1F800000 - 1, dtype=torch.int64)  # E(lo) < x (E(u < 2**-64) ~ u)
    hi = torch.full(x.shape, 0x3F800000, dtype=torch.int64)  # u = 1: E = inf >= x
    u_star = _search(lo, hi, lambda bits: _e_of_u(bits) >= x).to(torch.int32).view(torch.float32)
    return prob_below(u_star).tolist()


def test_exponential_cdf_relative_error_at_small_arguments():
    """P(E < x) = (1 - e^-x)(1 +- 2**-21) + 2**-64 down to x = 2**-40; the largest E is EXP_MAX."""
    x = fp32((10.0 ** torch.linspace(-12, 1.2, 40, dtype=torch.float64)).tolist())
    for xv, f in zip(x.double().tolist(), exp_cdf(x)):
        exact = -math.expm1(-xv)
        assert abs(f - exact) <= 2**-21 * exact + 2**-64, (xv, f, exact)
    assert exp_cdf(fp32([rng.EXP_MAX * 1.0001]))[0] == 1.0


@functools.cache
def _race_partition() -> tuple[torch.Tensor, list[float]]:
    """Partition y_k of an exponential's range (geometric, ratio 1.002, from 1e-20; then linear,
    step 0.002, up to EXP_MAX) and the exact CDF F(y_k) of our E there."""
    y = torch.cat(
        [
            10.0 ** torch.arange(-20, 0, math.log10(1.002), dtype=torch.float64),
            torch.arange(1.0, rng.EXP_MAX + 0.01, 0.002, dtype=torch.float64),
        ]
    )
    y = torch.unique(fp32(y.tolist()))
    return y, exp_cdf(y)


@pytest.mark.parametrize("w", [1e-12, 1e-10, 3.6e-9, 2.0**-24, 3e-8, 1e-6, 1e-3, 0.3, 0.9])
def test_race_win_probability_of_small_weights_is_exact(w):
    """Two-token race, weights (w, 1 - w): token 0 wins iff E_0 < rho * E_1, rho = w / (1 - w)
    (any race: the competitors' min of E_j / w_j is one Exp(1 - w)). P = E[F(rho * E_1)] with F
    the exact CDF of our E (counting); E_1 has the same distribution, so P lies between the lower
    and upper Riemann-Stieltjes sums of F(rho * y) over a partition y_k of E_1's range whose masses
    F(y_{k+1}) - F(y_k) are counted exactly. The bracket is rigorous (+-6.4e-4 wide at this
    partition: within 1e-3 of w, the issue asks 1%); its midpoint, accurate to O(1e-7) for this
    smooth integrand, is within RACE_TAIL_REL_ERR. (The old 24-bit exponentials gave 0 below
    3.6e-9, -15% at 2**-24, -44% at 3e-8.)"""
    rho = w / (1 - w)
    y, F_y = _race_partition()
    F_rho = exp_cdf(fp32((y.double() * rho).clamp(min=1e-30).tolist()))
    masses = [b - a for a, b in zip([0.0] + F_y, F_y + [1.0])]  # E_1 in [y_{k-1}, y_k)
    lower = sum(m * f for m, f in zip(masses[1:], F_rho))  # F(rho * E_1) >= F(rho * y_{k-1})
    upper = sum(m * f for m, f in zip(masses, F_rho + [1.0]))
    assert 1 - 1e-3 < lower / w <= upper / w < 1 + 1e-3, (lower / w, upper / w)
    assert abs((lower + upper) / 2 / w - 1) < rng.RACE_TAIL_REL_ERR


# ---------------------------------------------------------------------------------------------
# The structural findings of issue 10 are gone.


def _as_u64_signature(w_hi: torch.Tensor, w_lo: torch.Tensor) -> torch.Tensor:
    """Two words as one int64 (injective: (hi - 2**31) * 2**32 + lo)."""
    return (w_hi - 2**31) * 2**32 + w_lo


def test_no_stream_collisions_among_random_62_bit_seeds():
    """2e6 random 62-bit seeds: the old 32-bit state gave 452 pairs with identical streams (the
    birthday estimate for 2**32 states is 466). Here the seed is the key: 64 bits of output at
    counter 0 of both streams collide for no pair (expected 2e6**2 / 2**65 = 1e-7 by chance)."""
    g = torch.Generator().manual_seed(10)
    seeds = torch.unique(torch.randint(0, rng.SEED_HIGH, (2_000_000,), generator=g))
    zero = torch.zeros((), dtype=torch.int64)
    w = rng.philox_words(seeds, zero, zero, rng.STREAM_RECOVER)
    assert torch.unique(_as_u64_signature(w[0], w[1])).numel() == seeds.numel()
    w = rng.philox_words(seeds[:200_000], zero, zero, rng.STREAM_ACCEPT)
    assert torch.unique(_as_u64_signature(w[0], w[1])).numel() == 200_000


def test_no_seed_offset_aliasing():
    """Seeds 0..9999 x offsets {0..49, 50 random in 50..999}: the old XOR-folded offsets aliased
    12,688 (seed, offset) pairs of the full grid. Every (seed, offset) here has its own 64-bit
    signature (words 0, 1 at counter 0; 1e6 pairs, expected chance collisions 3e-8)."""
    g = torch.Generator().manual_seed(11)
    offsets = torch.cat([torch.arange(50), torch.randperm(950, generator=g)[:50] + 50])
    s = torch.arange(10_000)[:, None]
    w = rng.philox_words(s, offsets[None, :], torch.zeros((), dtype=torch.int64), rng.STREAM_RECOVER)
    sig = _as_u64_signature(w[0], w[1]).flatten()
    assert torch.unique(sig).numel() == sig.numel()
    # the old aliasing pattern, directly: (s, o) against (s ^ d, o ^ d) for small d (1e5 pairs each)
    first = w[0][:1000]
    zero = torch.zeros((), dtype=torch.int64)
    for d in (1, 2, 3, 7, 64):
        other = rng.philox_words(s[:1000] ^ d, offsets[None, :] ^ d, zero, rng.STREAM_RECOVER)[0]
        assert int((first == other).sum()) <= 1  # chance 2**-32 per pair


def test_keys_sharing_top_bits_give_unrelated_vectors():
    """The old per-token bits depended on key ^ vocab index only, so keys agreeing in their top 26
    bits gave recovery vectors that were permutations of each other. Here seeds s and s ^ d share
    no 64-bit word pair across 8192 vocabulary entries (chance ~2**-38), and their exponentials
    are uncorrelated (|r| < 5 / sqrt(V): false-failure rate 6e-7 per pair)."""
    V = 8192
    zero = torch.zeros(1, dtype=torch.int64)
    for base in (0, 12345, 2**61 + 17):
        ref = rng.recover_exponentials(torch.tensor([base]), zero, zero, V)[0]
        half = torch.arange(V // 2)
        words = rng.philox_words(torch.tensor(base), zero, half, rng.STREAM_RECOVER)
        sig_ref = set(_as_u64_signature(words[0], words[1]).tolist())
        for d in (1, 2, 63):
            other = rng.recover_exponentials(torch.tensor([base ^ d]), zero, zero, V)[0]
            assert not torch.equal(ref.sort().values, other.sort().values)
            sig = _as_u64_signature(*rng.philox_words(torch.tensor(base ^ d), zero, half, rng.STREAM_RECOVER)[:2])
            assert not sig_ref & set(sig.tolist())
            assert abs(float(torch.corrcoef(torch.stack([ref, other]))[0, 1])) < 5 / V**0.5


def test_subnormal_only_mass_wins():
    """A row whose only mass is subnormal (issue 9, finding 4) emits that token for every seed:
    its key (w * 2**32) / E is a positive normal number, zeros stay 0."""
    V = 64
    w = torch.zeros(200, V)
    w[:, 17] = 1.4e-45  # 2**-149, the smallest subnormal
    w[:100, 40] = 3e-39  # a second subnormal in half the rows
    seeds = torch.arange(200) * 7919
    zero = torch.zeros(200, dtype=torch.int64)
    won = rng.recovery_race(w, seeds, zero, zero)
    assert set(won[100:].tolist()) == {17}
    assert set(won[:100].tolist()) <= {17, 40} and 40 in won[:100].tolist()
    keys = (w * rng.RACE_SCALE) / rng.recover_exponentials(seeds, zero, zero, V)
    assert float(keys[:, 17].min()) >= torch.finfo(torch.float32).tiny


# ---------------------------------------------------------------------------------------------
# Statistical tests of the words (fixed seeds; stated false-failure rates at a random seed).

from scipy import stats  # noqa: E402

#: family-wise false-failure rate of each statistical test below
ALPHA = 1e-3


def _bit_counts(words: torch.Tensor) -> torch.Tensor:
    """[32] number of ones at each bit position over all words."""
    bits = (words.reshape(-1, 1) >> torch.arange(32)) & 1
    return bits.sum(dim=0)


def _assert_bits_balanced(words: torch.Tensor, tests: int) -> None:
    """Each of 32 bit positions is Binomial(n, 1/2); two-sided z test, Bonferroni over ``tests``
    calls x 32 bits so the whole test fails with probability <= ALPHA at a random seed."""
    n = words.numel()
    z = stats.norm.isf(ALPHA / (2 * 32 * tests))
    dev = (_bit_counts(words).double() - n / 2).abs().max().item()
    assert dev <= z * math.sqrt(n) / 2, (dev, z * math.sqrt(n) / 2)


def test_bit_balance_of_all_four_words():
    """2**18 counters x 4 words of one key, and the same for 2**18 random keys at counter 0."""
    counters = torch.arange(2**18)
    w = rng.random_words(torch.tensor(42), torch.tensor(7), counters, rng.STREAM_RECOVER)
    g = torch.Generator().manual_seed(12)
    seeds = torch.randint(-(2**63), 2**63 - 1, (2**18,), generator=g)
    w2 = rng.random_words(seeds, torch.tensor(0), torch.tensor(0), rng.STREAM_ACCEPT)
    for i in range(4):
        _assert_bits_balanced(w[:, i], tests=8)
        _assert_bits_balanced(w2[:, i], tests=8)


def _assert_pair_independent(x: torch.Tensor, y: torch.Tensor, tests: int) -> None:
    """x, y: words of neighbouring inputs. Bits of x ^ y balanced, and the joint distribution of
    the top 4 bits of x and y uniform on 256 cells (chi-square); Bonferroni over ``tests`` calls
    x 2 checks for a family-wise false-failure rate <= ALPHA."""
    _assert_bits_balanced(x ^ y, tests=2 * tests)
    cells = ((x >> 28) * 16 + (y >> 28)).flatten()
    counts = torch.bincount(cells, minlength=256).double()
    p = stats.chisquare(counts.numpy()).pvalue
    assert p > ALPHA / (2 * tests), p


def test_neighbouring_seeds_offsets_counters_are_independent():
    """Words at (s, o, c) against (s + 1, o, c), (s, o + 1, c), (s, o, c + 1), (s ^ 2**40, o, c)
    and stream 0 against 1: 2**17 pairs each, words 0 and 3."""
    g = torch.Generator().manual_seed(13)
    n = 2**17
    s = torch.randint(0, 2**62, (n,), generator=g)
    o = torch.randint(0, 2**40, (n,), generator=g)
    c = torch.randint(0, 2**40, (n,), generator=g)
    base = rng.random_words(s, o, c, rng.STREAM_RECOVER)
    neighbours = [
        rng.random_words(s + 1, o, c, rng.STREAM_RECOVER),
        rng.random_words(s, o + 1, c, rng.STREAM_RECOVER),
        rng.random_words(s, o, c + 1, rng.STREAM_RECOVER),
        rng.random_words(s ^ 2**40, o, c, rng.STREAM_RECOVER),
        rng.random_words(s, o, c, rng.STREAM_ACCEPT),
    ]
    for other in neighbours:
        for i in (0, 3):
            _assert_pair_independent(base[:, i], other[:, i], tests=2 * len(neighbours))


def test_accept_uniforms_and_exponentials_are_well_distributed():
    """KS tests on 2**16 draws (false-failure rate 1e-3 each at a random seed), and the accept
    rate at q/p = 1e-3 within 5 standard errors."""
    B = 2**16
    u = rng.accept_uniforms(torch.arange(B), torch.zeros(B, dtype=torch.int64), 2)
    assert float(u.min()) >= rng.UNIFORM_MIN and float(u.max()) <= rng.UNIFORM_MAX
    assert stats.kstest(u[:, 0].double().numpy(), "uniform").pvalue > 1e-3
    assert stats.kstest(u[:, 1].double().numpy(), "uniform").pvalue > 1e-3
    rate = float((u < 1e-3).double().mean())
    assert abs(rate - 1e-3) < 5 * math.sqrt(1e-3 / (2 * B))
    e = rng.recover_exponentials(torch.tensor([3]), torch.tensor([0]), torch.tensor([1]), B)[0]
    assert stats.kstest(e.double().numpy(), "expon").pvalue > 1e-3


# ---------------------------------------------------------------------------------------------
# The samplers on the new generator.


@pytest.mark.parametrize("backend", ["torch", "kernel"])
def test_sampler_emits_the_subnormal_only_token(backend):
    """q_j's only mass is one subnormal entry; the draft (p = one-hot at 0, q(0) = 0) is rejected,
    the residual has no mass, so the recovery races over q_j and must emit that entry, on both
    backends (the old w / E keys underflowed to 0 and emitted token 0, of probability 0). Logits
    inputs cannot produce such a row: softmax normalises by the row max."""
    from conftest import DEVICE, KERNEL_BACKEND

    from spec_samplers import RejectionSampler

    B, V = 4, 16
    target = torch.zeros(B, 2, V)
    target[:, 0, 5] = 1.4e-45
    target[:, 1, 3] = 1.0
    draft = torch.zeros(B, 1, V)
    draft[:, 0, 0] = 1.0
    ids = torch.zeros(B, 1, dtype=torch.int64)
    bonus = torch.full((B, 1), 3)
    seeds = torch.arange(B) * 1009
    dev = DEVICE if backend == "kernel" else torch.device("cpu")
    sampler = RejectionSampler(backend=KERNEL_BACKEND if backend == "kernel" else "torch")
    out = sampler(target.to(dev), bonus.to(dev), draft.to(dev), ids.to(dev), seeds=seeds.to(dev))
    assert out[:, 0].tolist() == [5] * B
