"""spec_samplers.rng: Philox4x32-10 known answers, counter layout, precision constants (exact
counting), structural findings of issue 10, statistical tests of the words."""

from __future__ import annotations

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
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0), (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
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
