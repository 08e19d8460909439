"""The Triton counter RNG equals spec_samplers.counter_rng bit for bit."""

from __future__ import annotations

import pytest
import torch

import triton
import triton.language as tl  # noqa: E402

from spec_samplers import counter_rng  # noqa: E402
from spec_samplers.kernels.backend import interpreting  # noqa: E402
from spec_samplers.kernels.rng import bits_to_exponential, bits_to_uniform, element_bits, row_key  # noqa: E402
from conftest import DEVICE  # noqa: E402



@triton.jit
def _draws_kernel(seed_ptr, offset_ptr, pos_ptr, bits_ptr, unif_ptr, exp_ptr, V,
                  STREAM: tl.constexpr, BLOCK: tl.constexpr, PRECISE: tl.constexpr):
    r = tl.program_id(0)
    seed = tl.load(seed_ptr + r)
    offset = tl.load(offset_ptr + r)
    key = row_key(seed, offset, tl.load(pos_ptr + r), STREAM)
    vocab = tl.arange(0, BLOCK)
    m = vocab < V
    bits = element_bits(key, vocab)
    tl.store(bits_ptr + r * V + vocab, bits.to(tl.int64), mask=m)
    tl.store(unif_ptr + r * V + vocab, bits_to_uniform(bits), mask=m)
    tl.store(exp_ptr + r * V + vocab, bits_to_exponential(bits, PRECISE), mask=m)


@pytest.mark.parametrize("stream", [counter_rng.STREAM_ACCEPT, counter_rng.STREAM_RECOVER])
def test_bits_uniforms_exponentials_match(stream):
    g = torch.Generator().manual_seed(stream)
    N, V = 64, 1000
    seeds = torch.randint(-(2**63), 2**63 - 1, (N,), generator=g)
    seeds[:4] = torch.tensor([0, -1, 2**63 - 1, -(2**63)])
    offsets = torch.randint(0, 2**62, (N,), generator=g)
    offsets[:3] = torch.tensor([0, 2**32 - 1, 2**32])
    positions = torch.randint(0, 9, (N,), generator=g)
    bits = torch.empty(N, V, dtype=torch.int64, device=DEVICE)
    unif = torch.empty(N, V, dtype=torch.float32, device=DEVICE)
    exps = torch.empty(N, V, dtype=torch.float32, device=DEVICE)
    s, o, p = seeds.to(DEVICE), offsets.to(DEVICE), positions.to(DEVICE)
    _draws_kernel[(N,)](s, o, p, bits, unif, exps, V, STREAM=stream, BLOCK=1024, PRECISE=not interpreting())

    key = counter_rng.row_key(s[:, None], o[:, None], p[:, None], stream)
    ref_bits = counter_rng.element_bits(key, torch.arange(V, device=DEVICE)[None, :])
    assert torch.equal(bits, ref_bits)
    assert torch.equal(unif, counter_rng.bits_to_uniform(ref_bits))
    ref_exps = counter_rng.bits_to_exponential(ref_bits)
    if interpreting():
        # The interpreter's log is numpy's and torch's CPU log is SLEEF's: they differ by a few
        # ulp on some inputs (compiled kernels use CUDA's logf, which torch.log runs on CUDA).
        # The bits, which decide everything else, are equal.
        torch.testing.assert_close(exps, ref_exps, rtol=1e-6, atol=0)
    else:
        assert torch.equal(exps, ref_exps)
    # The accept stream's helper (vocab index 0) agrees too.
    if stream == counter_rng.STREAM_ACCEPT:
        u = counter_rng.accept_uniforms(s, o, 9)  # [N, 9]
        assert torch.equal(unif[:, 0], u[torch.arange(N), p])
