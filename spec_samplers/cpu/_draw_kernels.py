"""numba kernel of the CPU path's draw from logits: softmax(logits / T) and the two-level race of
one position, in one request's pass, no [B, V] temporary.

A request without drafts in a vLLM V1 plain step (``integrations.vllm.fast_path``) is verified as
one ragged request whose only draft is the -1 placeholder: always rejected, so rejection sampling
and block verification both draw its token by the recovery race of position 0 over the target
row q = ``torch_ops.probs_from_logits`` (logits, T), on ``STREAM_RECOVER`` (``_numba_kernels
._recover`` with the raced row q itself), and a greedy request (T = 0) takes q's argmax. This
kernel computes that q one request at a time into a [V] scratch row and runs the same
``_recover``: the same floats as the sampler's twin, but for

* the row's sum: fp64 here, rounded to fp32, where ``probs_from_logits`` sums in fp32 in torch's
  order; the two agree within torch's rounding (a few fp32 ulps, relative), so r = 1 / sum may
  differ in its last bits, and q = e r with it: a token changes only when two race keys agree to
  ~2**-23 relative (docs/cpu.md, "Tokens");
* exp2: here the correctly rounded fp32 2**z (``_exp2``: an fp64 polynomial, vectorised), SLEEF's
  ``exp2f`` in torch, within an ulp of it (the two differ in the last bit on ~6% of entries, as
  libm's ``exp2f`` and SLEEF's do; a last-bit difference moves a weight by 2**-24 relative, the
  same kind of event).

Imported by :func:`spec_samplers.cpu.draw.draw_from_logits` when numba is installed; compiled code is cached
on disk (``cache=True``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from spec_samplers import rng
from spec_samplers.constants import LOG2E_FP32, WEIGHT_MIN
from spec_samplers.cpu._numba_kernels import (
    _STREAM_RECOVER,
    _U32,
    RES_Q,
    _bits_f32,
    _bits_f64,
    _f32_bits,
    _f64_bits,
    _recover,
    _words,
)

_F0 = np.float32(0.0)
_ONE = np.float32(1.0)
_INF = np.float32(np.inf)
_NEG_INF = np.float32(-np.inf)
_LOG2E = np.float32(LOG2E_FP32)
_WEIGHT_MIN = np.float32(WEIGHT_MIN)
_STREAM_SAMPLE = np.uint64(rng.STREAM_SAMPLE)


#: the int32 key of -inf: keys (_key) order fp32 values as floats, NaN excluded
_NEG_INF_KEY = np.int32(-0x7F800001)
_LOW31 = np.int32(0x7FFFFFFF)


@njit(cache=True, inline="always")
def _key(x):
    """An int32 whose order is fp32 x's (x not NaN): the bits of x >= +0, the bits with the 31 low
    ones flipped below (-0.0 keys -1, one under +0.0: the max's sign of zero is not read, every use
    compares with ==, where -0.0 == +0.0)."""
    b = _f32_bits(x)
    return b if b >= np.int32(0) else b ^ _LOW31


@njit(cache=True)
def _row_max(x):
    """max of the row with NaN as -inf (torch.fmax(x, -inf) then amax), as an integer max of the
    values' keys (_key; a NaN keys -inf), which LLVM vectorises (a float max with NaN skipped does
    not vectorise without fastmath flags: 0.49 against ~0.03 ns an entry at V = 128256)."""
    m = _NEG_INF_KEY
    for v in range(x.shape[0]):
        xv = x[v]
        k = _key(xv) if xv == xv else _NEG_INF_KEY
        m = k if k > m else m
    return _bits_f32(m if m >= np.int32(0) else m ^ _LOW31)


@njit(cache=True)
def _first_index_of(x, m):
    """The first v with x[v] == m (m the row's max, not NaN): torch.argmax's tie rule."""
    for v in range(x.shape[0]):
        if x[v] == m:
            return v
    return -1


#: 1.5 * 2**52: z + it, for |z| < 2**51, is round(z) + it exactly, and its bits' low word is round(z)
_SHIFTER = 6755399441055744.0
_SHIFTER_BITS = np.int64(0x4338000000000000)
_EXP_BIAS = np.int64(1023)
_EXP_SHIFT = np.int64(52)
#: ln2**n / n! for n = 0 ... 12: 2**f = exp(f ln2) to ~2**-52 relative for |f| <= 1/2 (the next
#: term is under 2**-52)
_E0 = 1.0
_E1 = 0.6931471805599453
_E2 = 0.2402265069591007
_E3 = 0.05550410866482158
_E4 = 0.009618129107628477
_E5 = 0.0013333558146428443
_E6 = 0.00015403530393381608
_E7 = 1.525273380405984e-05
_E8 = 1.3215486790144307e-06
_E9 = 1.0178086009239699e-07
_E10 = 7.054911620801123e-09
_E11 = 4.445538271870811e-10
_E12 = 2.5678435993488202e-11


@njit(cache=True, fastmath={"contract"})
def _exp2(z):
    """2**z of an fp32 z in [-inf, 0], rounded to fp32, without a branch or a libm call (LLVM
    vectorises a loop of it; libm's exp2f is a scalar call, 3 ns an entry): in fp64, 2**k times
    the Taylor polynomial of 2**f, z = k + f, |f| <= 1/2, within ~2**-50 relative, so the fp32
    result is the correctly rounded one but where 2**z lies within 2**-50 of a rounding boundary
    (libm's and SLEEF's exp2f are within an ulp of it: they agree on most entries, as they agree
    with each other). z below -150 is taken as -150: 2**z is 0 in fp32 either way (and every
    weight under WEIGHT_MIN = 2**-126 becomes 0)."""
    zd = max(np.float64(z), -150.0)
    t = zd + _SHIFTER
    k = t - _SHIFTER
    f = zd - k  # exact: |f| <= 1/2 and zd, k have bits in common
    scale = _bits_f64((_f64_bits(t) - _SHIFTER_BITS + _EXP_BIAS) << _EXP_SHIFT)
    # Estrin's scheme: four independent chains, not a 12-step one (its latency bound the loop)
    f2 = f * f
    f4 = f2 * f2
    a = (_E0 + f * _E1) + f2 * (_E2 + f * _E3)
    b = (_E4 + f * _E5) + f2 * (_E6 + f * _E7)
    c = (_E8 + f * _E9) + f2 * (_E10 + f * _E11)
    p = a + f4 * (b + f4 * (c + f4 * _E12))
    return np.float32(p * scale)


@njit(cache=True, error_model="numpy")
def _fill_weights(x, m, c, e):
    """e [V] fp32 <- torch_ops.scaled_exp's weights (2**min((x - m) c, 0), 0 below WEIGHT_MIN).
    m is the row's max (+inf for a row without a finite or +inf logit), c = LOG2E / T (0 for
    T = +inf: then x - m = -inf weighs 0, probs_from_logits' mask)."""
    inf_t = c == _F0
    for v in range(x.shape[0]):
        xv = x[v]
        xv = xv if xv == xv else _NEG_INF  # NaN -> -inf (fmax(x, -inf))
        d = np.float32(xv - m)
        z = np.float32(d * c)
        z = z if z < _F0 else _F0  # fmin(z, 0): NaN (inf - inf, 0 * inf) gives 0
        w = _exp2(z)
        w = w if w >= _WEIGHT_MIN else _F0
        e[v] = _F0 if inf_t and d == _NEG_INF else w


@njit(cache=True, fastmath={"reassoc"})
def _sum64(e):
    """fp64 sum of the fp32 row e (vectorised: its lanes fix an order, docs/cpu.md "Tokens")."""
    acc = 0.0
    for v in range(e.shape[0]):
        acc += np.float64(e[v])
    return acc


@njit(cache=True)
def _weights(x, m, c, e):
    """e [V] fp32 <- the weights of row x (_fill_weights); returns their fp64 sum."""
    _fill_weights(x, m, c, e)
    return _sum64(e)


@njit(cache=True)
def _unnormalised(x, m, t, q):
    """q [V] fp32 <- the weights of row x (its max m, NaN as -inf) at temperature t > 0 (negative
    or NaN t counts as 1); returns r = 1 / sum in fp32, 0 for a row without mass: q * r is the
    row of ``probs_from_logits`` (a non-greedy row)."""
    t = t if t > _F0 else _ONE  # negative or NaN T counts as 1
    c = np.float32(_LOG2E / t)
    total = np.float32(_weights(x, m if m > _NEG_INF else _INF, c, q))
    return np.float32(_ONE / total) if total > _F0 else _F0


@njit(cache=True)
def _normalise(q, r):
    """q <- q * r in fp32 (probs_from_logits' e * r)."""
    for v in range(q.shape[0]):
        q[v] = np.float32(q[v] * r)


@njit(cache=True)
def draw_rows_kernel(
    logits,  # [B, V] fp32
    temperature,  # [B] fp32, 0 = greedy
    seeds,  # [B] uint64
    offsets,  # [B] uint64
    position,  # int: the race's position (counter base position << 32)
    out,  # [B] int64: the token, -1 where the row has no mass
):
    """Per request: q = probs_from_logits(logits[b], T[b]) into one scratch row, then
    ``_numba_kernels._recover`` of q itself (RES_Q) at ``position`` on STREAM_RECOVER; a greedy
    request is the argmax of its logits (NaN as -inf, ties to the lowest index), -1 when the row
    has no finite or +inf logit."""
    B, V = logits.shape
    q = np.empty(V, dtype=np.float32)
    for b in range(B):
        x = logits[b]
        m = _row_max(x)
        t = temperature[b]
        if t == _F0:
            out[b] = -1 if m == _NEG_INF else _first_index_of(x, m)
            continue
        _normalise(q, _unnormalised(x, m, t, q))
        out[b] = _recover(q, q, RES_Q, _ONE, -1, False, seeds[b], offsets[b], position, _STREAM_RECOVER)


@njit(cache=True)
def softmax_rows_kernel(
    logits,  # [B, V] fp32
    temperature,  # [B] fp32, 0 = greedy (other values <= 0, and NaN, count as 1)
    out,  # [B, V] fp32
):
    """``torch_ops.probs_from_logits`` of each row into ``out`` (the rule of ``sampling.softmax``):
    the weights and r = 1 / sum of :func:`_unnormalised`, then q = e r; a greedy row is the one-hot
    of its logits' argmax (NaN as -inf, the lowest index on ties), a row without a finite or +inf
    logit all zeros. One pass per row over the logits and two over the output row, no
    temporary."""
    B, V = logits.shape
    for b in range(B):
        x = logits[b]
        q = out[b]
        m = _row_max(x)
        if temperature[b] == _F0:
            for v in range(V):
                q[v] = _F0
            if m > _NEG_INF:
                q[_first_index_of(x, m)] = _ONE
            continue
        _normalise(q, _unnormalised(x, m, temperature[b], q))


@njit(cache=True, inline="always")
def _sample_row(q, seed, offset):
    """``rng.sample_race`` of the clean row q (NaN, inf and negatives weigh 0): the two-level race
    with counter base 0 on STREAM_SAMPLE, which ``_recover`` of the row itself (RES_Q) at position
    0 runs; -1 when the clean row sums to 0 (the reference's invalid row)."""
    return _recover(q, q, RES_Q, _ONE, -1, False, seed, offset, 0, _STREAM_SAMPLE)


@njit(cache=True)
def sample_rows_kernel(
    probs,  # [R, V] fp32, unnormalised rows
    rows,  # [B] int64: the input row of each output (outside [0, R): no row)
    seeds,  # [B] uint64
    offsets,  # [B] uint64
    out,  # [B] int64: the token, -1 where the row is missing or has no mass
):
    """``sampling.reference.sample_reference`` without filters, one output row at a time
    (:func:`_sample_row`)."""
    R = probs.shape[0]
    for b in range(rows.shape[0]):
        r = rows[b]
        if r < 0 or r >= R:
            out[b] = -1
            continue
        out[b] = _sample_row(probs[r], seeds[b], offsets[b])


@njit(cache=True)
def decode_rows_kernel(
    probs,  # [N, V] fp32, unnormalised rows
    seeds,  # [N] uint64: the requests' seeds
    offsets,  # [N] uint64: the requests' step counters
    position,  # int: the draw's position
    stream,  # uint64: the decoding loop's stream of the draw
    out,  # [N] int64: the token, -1 where the row has no mass
):
    """``decoding.strategy.draw``: row b's draw seed is words (0, 1) of (seeds[b], offsets[b],
    position) on ``stream`` (``rng.derive_seeds``), then :func:`_sample_row` with that seed at
    offset 0."""
    for b in range(probs.shape[0]):
        w0, w1, _, _ = _words(seeds[b], offsets[b], np.int64(position), stream)
        out[b] = _sample_row(probs[b], (w1 << _U32) | w0, np.uint64(0))
