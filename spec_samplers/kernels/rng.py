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


@triton.jit
def precise_exp2(x, PRECISE: tl.constexpr):
    """fp32 2**x: libdevice's exp2f when compiled (ex2.approx under Triton's FTZ: one MUFU.EX2,
    what CUDA's exp2f, hence torch.exp2, computes for results in the normal range; subnormal
    results are flushed, so callers keep x >= -126), numpy's in the interpreter."""
    if PRECISE:
        return libdevice.exp2(x)
    else:
        return tl.exp2(x)


# ---------------------------------------------------------------------------------------------
# The two-level race (spec_samplers.rng.two_level_race), shared by every kernel that draws.

_RACE_GROUP = tl.constexpr(rng.RACE_GROUP)
_LEVEL1_COUNTER = tl.constexpr(rng.LEVEL1_COUNTER)
_RACE_SCALE = tl.constexpr(rng.RACE_SCALE)


@triton.jit
def race_exponential(seed, offset, counter_base, index, STREAM: tl.constexpr, PRECISE: tl.constexpr):
    """Exp(1) of entry ``index`` (int tensor) of a race at ``counter_base`` (int64 scalar):
    counter counter_base + index // 2, words (0, 1) for an even index, (2, 3) for an odd one
    (:func:`spec_samplers.rng.race_exponentials`; level 1 passes counter_base + LEVEL1_COUNTER).
    For arbitrary indices; :func:`race_exponentials_from` makes a run of them at half the cost."""
    index = index.to(tl.int64)
    w0, w1, w2, w3 = random_words(seed, offset, counter_base + (index >> 1), STREAM)
    odd = (index & 1) == 1
    return exponential_from_words(tl.where(odd, w2, w0), tl.where(odd, w3, w1), PRECISE)


@triton.jit
def race_exponentials_from(
    seed, offset, counter_base, first, BLOCK: tl.constexpr, PRECISE: tl.constexpr, STREAM: tl.constexpr
):
    """[BLOCK] :func:`race_exponential` of entries first .. first + BLOCK - 1 (``first`` even):
    one Philox block per pair of entries, all four words used (even entry: words (0, 1), odd:
    (2, 3), interleaved)."""
    pairs = counter_base + (first >> 1) + tl.arange(0, BLOCK // 2)
    w0, w1, w2, w3 = random_words(seed, offset, pairs, STREAM)
    return tl.interleave(exponential_from_words(w0, w1, PRECISE), exponential_from_words(w2, w3, PRECISE))


@triton.jit
def group_tile(BLOCK_V: tl.constexpr):
    """[BLOCK_V // RACE_GROUP, RACE_GROUP] offsets of a vector step of BLOCK_V entries (a multiple
    of RACE_GROUP), one race group per row: ``tl.sum(w.to(tl.float64), axis=1)`` of weights
    loaded at ``start + group_tile(BLOCK_V)`` gives the step's group sums (no reshape, so no
    layout conversion)."""
    return tl.arange(0, BLOCK_V // _RACE_GROUP)[:, None] * _RACE_GROUP + tl.arange(0, _RACE_GROUP)[None, :]


@triton.jit
def pick_group(
    b_ptr,
    c_ptr,
    num_groups,
    ok,
    seed,
    offset,
    counter_base,
    STREAM: tl.constexpr,
    PRECISE: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """Level 1 of the race over TWO candidate rows of fp64 group sums at once (``b_ptr`` and
    ``c_ptr``, ``num_groups`` each; nothing is read unless ``ok``), sharing their
    exponentials (one of the two is used). Returns (group of b, group of c, total of b, total of
    c): argmax_g sums[g] / E[g] in fp64, ties to the lowest group (torch.argmax's), and the fp64
    sums of each row's group sums (the row's mass)."""
    best_b = tl.full([], -1.0, tl.float64)
    best_c = tl.full([], -1.0, tl.float64)
    g_b = tl.full([], 0, tl.int64)
    g_c = tl.full([], 0, tl.int64)
    tot_b = tl.full([], 0.0, tl.float64)
    tot_c = tl.full([], 0.0, tl.float64)
    for g0 in range(0, tl.where(ok, num_groups, 0), BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        m = g < num_groups
        e = race_exponentials_from(seed, offset, counter_base + _LEVEL1_COUNTER, g0, BLOCK_G, PRECISE, STREAM)
        e = e.to(tl.float64)
        s_b = tl.load(b_ptr + g, mask=m, other=0.0)
        s_c = tl.load(c_ptr + g, mask=m, other=0.0)
        tot_b += tl.sum(s_b, axis=0)
        tot_c += tl.sum(s_c, axis=0)
        k_b = tl.where(m, s_b / e, -1.0)
        k_c = tl.where(m, s_c / e, -1.0)
        top_b = tl.max(k_b, axis=0)
        top_c = tl.max(k_c, axis=0)
        arg_b = tl.argmax(k_b, axis=0, tie_break_left=True).to(tl.int64) + g0
        arg_c = tl.argmax(k_c, axis=0, tie_break_left=True).to(tl.int64) + g0
        g_b = tl.where(top_b > best_b, arg_b, g_b)
        best_b = tl.maximum(best_b, top_b)
        g_c = tl.where(top_c > best_c, arg_c, g_c)
        best_c = tl.maximum(best_c, top_c)
    return g_b, g_c, tot_b, tot_c


@triton.jit
def race_in_group(w, mask, seed, offset, counter_base, STREAM: tl.constexpr, PRECISE: tl.constexpr):
    """Level 2: index in the group (int64) of argmax (w * RACE_SCALE) / E over the [RACE_GROUP]
    weights ``w`` of the chosen group (``mask``: entries inside the vocabulary and candidates),
    ties to the lowest index; E of entry i at counter counter_base + i // 2."""
    e = race_exponentials_from(seed, offset, counter_base, 0, _RACE_GROUP, PRECISE, STREAM)
    keys = tl.where(mask, tl.math.div_rn(w * _RACE_SCALE, e), -1.0)
    return tl.argmax(keys, axis=0, tie_break_left=True).to(tl.int64)
