"""Triton mirror of :mod:`spec_samplers.counter_rng`, bit for bit.

Words are uint32 so that multiplication wraps modulo 2**32 and right shifts are logical; the
multipliers are built as uint32 explicitly (a Python literal >= 2**31 would promote to int64).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from spec_samplers import counter_rng

# Globals read inside @triton.jit functions must be constexpr.
_GOLDEN = tl.constexpr(counter_rng.GOLDEN)
_MUL1 = tl.constexpr(counter_rng.MIX_MUL1)
_MUL2 = tl.constexpr(counter_rng.MIX_MUL2)
_TWO_POW_M24 = tl.constexpr(counter_rng.TWO_POW_M24)


@triton.jit
def mix32(x):
    """lowbias32 on uint32 words (any shape)."""
    x = x ^ (x >> 16)
    x = x * tl.full([], _MUL1, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full([], _MUL2, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def row_key(seed, offset, position, stream: tl.constexpr):
    """Per-(row, position, stream) key: seed, offset int64 scalars; position int tensor."""
    seed_lo = seed.to(tl.uint32)
    seed_hi = (seed >> 32).to(tl.uint32)
    off_lo = offset.to(tl.uint32)
    off_hi = (offset >> 32).to(tl.uint32)
    h = mix32(seed_lo ^ tl.full([], _GOLDEN, tl.uint32))
    h = mix32(h ^ seed_hi)
    h = mix32(h ^ off_lo)
    h = mix32(h ^ off_hi)
    return mix32(h ^ (position.to(tl.int64) * 4 + stream).to(tl.uint32))


@triton.jit
def element_bits(key, vocab_index):
    """32 random bits for (key, vocab index); vocab_index int tensor in [0, 2**32)."""
    return mix32(mix32(key ^ vocab_index.to(tl.uint32)))


@triton.jit
def bits_to_uniform(bits):
    return (bits >> 8).to(tl.float32) * _TWO_POW_M24


@triton.jit
def precise_log(x, PRECISE: tl.constexpr):
    """fp32 log: CUDA's logf (libdevice, what torch.log runs on CUDA) when compiled, numpy's in
    the interpreter (which has no libdevice)."""
    if PRECISE:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def precise_exp(x, PRECISE: tl.constexpr):
    """fp32 exp: CUDA's expf (libdevice) when compiled, numpy's in the interpreter."""
    if PRECISE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def bits_to_exponential(bits, PRECISE: tl.constexpr):
    u = ((bits >> 9) * 2 + 1).to(tl.float32) * _TWO_POW_M24
    return -precise_log(u, PRECISE)
