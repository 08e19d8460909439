"""Triton mirror of :mod:`spec_samplers.rng` (Philox4x32-10 and the fp32 conversions), bit for bit.

Words are uint32, so multiplication wraps modulo 2**32, right shifts are logical and
``tl.umulhi`` gives the high half of the 32x32-bit product; constants are built as uint32
explicitly (a Python literal >= 2**31 would promote to int64). Globals read inside
@triton.jit functions must be constexpr.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from spec_samplers import rng

_M0 = tl.constexpr(rng.PHILOX_M0)
_M1 = tl.constexpr(rng.PHILOX_M1)
_W0 = tl.constexpr(rng.PHILOX_W0)
_W1 = tl.constexpr(rng.PHILOX_W1)
_ROUNDS = tl.constexpr(rng.PHILOX_ROUNDS)
# counter word 1 = (counter >> 32) & 0xFFFFFF | stream << 24, written with literals below
assert rng.COUNTER_BITS == 56 and rng.STREAM_BITS == 8
_UNIFORM_MAX = tl.constexpr(rng.UNIFORM_MAX)
_TWO_POW_M24 = tl.constexpr(2.0**-24)
_TWO_POW_M48 = tl.constexpr(2.0**-48)
_TWO_POW_M64 = tl.constexpr(2.0**-64)


@triton.jit
def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint32 words (broadcastable tensors); returns the four output words."""
    m0 = tl.full([], _M0, tl.uint32)
    m1 = tl.full([], _M1, tl.uint32)
    w0 = tl.full([], _W0, tl.uint32)
    w1 = tl.full([], _W1, tl.uint32)
    for _ in tl.static_range(_ROUNDS):
        hi0 = tl.umulhi(c0, m0)
        lo0 = c0 * m0
        hi1 = tl.umulhi(c2, m1)
        lo1 = c2 * m1
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + w0
        k1 = k1 + w1
    return c0, c1, c2, c3


@triton.jit
def random_words(seed, offset, counter, STREAM: tl.constexpr):
    """:func:`spec_samplers.rng.random_words` as four uint32 tensors: seed, offset int64 (scalars
    or tensors), counter int64 tensor in [0, 2**56), STREAM in [0, 256)."""
    seed = seed.to(tl.int64)
    offset = offset.to(tl.int64)
    counter = counter.to(tl.int64)
    c0 = counter.to(tl.uint32)
    c1 = (((counter >> 32) & 0xFFFFFF) | (STREAM << 24)).to(tl.uint32)
    c2 = offset.to(tl.uint32)
    c3 = (offset >> 32).to(tl.uint32)
    k0 = seed.to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    # counter words in the counter's shape; the key stays as given (a scalar key keeps its
    # per-round Weyl increments scalar instead of one add per lane)
    zero = c0 * 0
    return philox4x32(c0, c1 + zero, c2 + zero, c3 + zero, k0, k1)


@triton.jit
def uniform_from_words(a, b):
    """fp32 uniform from uint32 words a, b (see spec_samplers.rng.uniform_from_words)."""
    hi = (a >> 8).to(tl.float32) * _TWO_POW_M24
    mid = (((a & 0xFF) << 16) | (b >> 16)).to(tl.float32) * _TWO_POW_M48
    low = ((b | 1) & 0xFFFF).to(tl.float32) * _TWO_POW_M64
    return tl.minimum(hi + (mid + low), _UNIFORM_MAX)


@triton.jit
def exponential_from_words(a, b, PRECISE: tl.constexpr):
    """fp32 Exp(1) sample -log1p(-u) from uint32 words a, b."""
    return -precise_log1p(-uniform_from_words(a, b), PRECISE)


@triton.jit
def precise_log1p(x, PRECISE: tl.constexpr):
    """fp32 log1p: CUDA's log1pf (libdevice, what torch.log1p runs on CUDA) when compiled; in the
    interpreter (no libdevice) Goldberg's log(1 + x) * x / ((1 + x) - 1), a few ulp."""
    if PRECISE:
        return libdevice.log1p(x)
    else:
        u = 1.0 + x
        return tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))


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
