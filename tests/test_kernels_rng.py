"""The Triton Philox (spec_samplers.kernels.rng) equals spec_samplers.rng bit for bit."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE  # noqa: E402

from spec_samplers import rng
from spec_samplers.kernels.backend import interpreting
from spec_samplers.kernels.rng import exponential_from_words, random_words, uniform_from_words


@triton.jit
def _words_kernel(
    seed_ptr,
    offset_ptr,
    counter_ptr,
    words_ptr,
    unif_ptr,
    exp_ptr,
    n,
    STREAM: tl.constexpr,
    BLOCK: tl.constexpr,
    PRECISE: tl.constexpr,
):
    r = tl.program_id(0)
    seed = tl.load(seed_ptr + r)  # scalar key, as in the sampler kernels
    offset = tl.load(offset_ptr + r)
    i = tl.arange(0, BLOCK)
    m = i < n
    counter = tl.load(counter_ptr + r * n + i, mask=m, other=0)  # [BLOCK] int64
    w0, w1, w2, w3 = random_words(seed, offset, counter, STREAM)
    base = (r * n + i) * 4
    tl.store(words_ptr + base, w0.to(tl.int64), mask=m)
    tl.store(words_ptr + base + 1, w1.to(tl.int64), mask=m)
    tl.store(words_ptr + base + 2, w2.to(tl.int64), mask=m)
    tl.store(words_ptr + base + 3, w3.to(tl.int64), mask=m)
    tl.store(unif_ptr + r * n + i, uniform_from_words(w0, w1), mask=m)
    tl.store(exp_ptr + r * n + i, exponential_from_words(w2, w3, PRECISE), mask=m)


@pytest.mark.parametrize("stream", [rng.STREAM_ACCEPT, rng.STREAM_RECOVER, 255])
def test_words_uniforms_exponentials_match(stream):
    g = torch.Generator().manual_seed(stream)
    N, n = 16, 64
    seeds = torch.randint(-(2**63), 2**63 - 1, (N,), generator=g)
    seeds[:4] = torch.tensor([0, -1, 2**63 - 1, -(2**63)])
    offsets = torch.randint(-(2**63), 2**63 - 1, (N,), generator=g)
    offsets[:3] = torch.tensor([0, 2**32 - 1, 2**32])
    counters = torch.randint(0, 2**56, (N, n), generator=g)
    counters[0, :8] = torch.tensor([0, 1, 2**32 - 1, 2**32, 2**56 - 1, 5 << 32, 7, 2**55])
    s, o, c = seeds.to(DEVICE), offsets.to(DEVICE), counters.to(DEVICE)
    words = torch.empty(N, n, 4, dtype=torch.int64, device=DEVICE)
    unif = torch.empty(N, n, dtype=torch.float32, device=DEVICE)
    exps = torch.empty(N, n, dtype=torch.float32, device=DEVICE)
    _words_kernel[(N,)](s, o, c, words, unif, exps, n, STREAM=stream, BLOCK=64, PRECISE=not interpreting())

    ref = rng.random_words(s[:, None], o[:, None], c, stream)
    assert torch.equal(words, ref)
    assert torch.equal(unif, rng.uniform_from_words(ref[..., 0], ref[..., 1]))
    ref_exps = rng.exponential_from_words(ref[..., 2], ref[..., 3])
    if interpreting():
        # The interpreter has no libdevice: its log1p is Goldberg's formula on numpy's log, torch's
        # CPU log1p is SLEEF's; they differ by a few ulp. Compiled kernels call CUDA's log1pf,
        # which torch.log1p runs on CUDA. The words and uniforms, which decide the rest, are equal.
        torch.testing.assert_close(exps, ref_exps, rtol=4e-7, atol=0)
    else:
        assert torch.equal(exps, ref_exps)


@triton.jit
def _uniform_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    a = tl.load(a_ptr + i, mask=m, other=0).to(tl.uint32)
    b = tl.load(b_ptr + i, mask=m, other=0).to(tl.uint32)
    tl.store(out_ptr + i, uniform_from_words(a, b), mask=m)


def test_uniform_conversion_matches_at_the_edges():
    """Every branch of the fp32 conversion: a < 2**8 (all 64 bits count), a around 2**24, the
    clamp below 1, b = 0 (the forced low bit)."""
    M32 = 2**32 - 1
    a = [0, 0, 0, 1, 255, 256, 2**24 - 1, 2**24, 2**24 + 1, 2**31, M32 - 128, M32 - 127, M32, M32]
    b = [0, 1, M32, 0, M32, 0, M32, 2**31, 2**16, 123, M32, 0, 0, M32]
    g = torch.Generator().manual_seed(5)
    a = torch.tensor(
        a + torch.randint(0, 2**32, (50,), generator=g).tolist() + torch.randint(0, 300, (50,), generator=g).tolist()
    )
    b = torch.tensor(b + torch.randint(0, 2**32, (100,), generator=g).tolist())
    out = torch.empty(a.shape[0], dtype=torch.float32, device=DEVICE)
    _uniform_kernel[(triton.cdiv(a.shape[0], 64),)](a.to(DEVICE), b.to(DEVICE), out, a.shape[0], BLOCK=64)
    assert torch.equal(out.cpu(), rng.uniform_from_words(a, b))
