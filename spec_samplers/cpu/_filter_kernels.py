"""numba kernels of the CPU path's filtered sampling operations: top-k, top-p and min-p sampling,
``top_k_renorm_probs`` / ``top_p_renorm_probs`` and ``top_k_mask_logits`` on fp32 rows, one output
row per iteration, without sorting.

``sampling.reference`` is the specification (its module docstring): every filter keeps the values
>= a per-row threshold tau, and tau is defined by order-free quantities (the k-th largest value;
fixed-point int64 masses ``round(min(w, 1) * 2**MASS_BITS)`` above a value), so a kernel that
never sorts finds the same tau exactly:

* values map to an order-preserving uint32 key (the fp32 bits, sign-flipped; -0.0 as +0.0), and
  a radix select finds the smallest candidate key K with ``pass(M(> K))``, M the count (top-k:
  pass is M < k, so K is the k-th largest) or the fixed-point mass (top-p: M == 0 or
  M < top_p * M_total in fp64, the reference's comparison) of the candidates above K. Level 1
  histograms the top 11 key bits over the row (count and mass per bin); scanning the bins from
  the top, the lowest bin whose mass above passes holds K (pass is monotone); its entries are
  copied out and levels 2 (11 bits) and 3 (10 bits) run on that copy;
* a vectorised first pass takes each race group's largest key (the row maximum, and bounds:
  top-k's select starts at the k-th largest group maximum, top-p on probabilities at a floor
  from the maxima (:func:`_top_p_floor`), and groups below a select's candidates are skipped);
* min-p's tau is min(min_p * max, max) in fp32, and the thresholds combine as the reference's
  (top-p's candidates are the top-k survivors unless ``joint``, then min-p last);
* the draw is ``rng.sample_race`` of the kept weights (value >= tau, else 0): the race of
  ``_numba_kernels`` (``_pick_group``, ``_fill_exponentials``) over group sums of the kept weights
  (fp64, another order than torch.sum: docs/cpu.md, "Tokens"), level 2 as ``_numba_kernels._race``.
  It is written here rather than as a ``_recover`` mode because ``_recover`` races the whole row
  when the raced mass is <= RESIDUAL_MASS_EPS, and a kept mass may be that small.

Loops index slices from 0 (numba's negative-index wraparound on ``q[lo + i]`` makes LLVM gather).
Imported by :mod:`spec_samplers.cpu.draw` when numba is installed; compiled code is cached on disk.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from spec_samplers import rng
from spec_samplers.constants import FLOAT32_MAX, SAMPLING_MASS_BITS
from spec_samplers.cpu._numba_kernels import _G, _SCALE, _clean, _f32_bits, _fill_exponentials, _pick_group

_F0 = np.float32(0.0)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_NEG_INF = np.float32(-np.inf)
_FMAX = np.float32(FLOAT32_MAX)
_MSCALE = np.float32(2.0**SAMPLING_MASS_BITS)
_STREAM_SAMPLE = np.uint64(rng.STREAM_SAMPLE)
_BASE = np.int64(0)
#: key bits per level of the radix select (11 + 11 + 10 = 32)
_BINS = 2048
#: the key of no candidate (below every value's: -inf's key is 0x007FFFFF)
_NONE = np.int64(0)


@njit(cache=True, inline="always")
def _key(x):
    """The order-preserving key of a non-NaN fp32 as an int64 in [0, 2**32): -0.0 counts as +0.0."""
    b = np.int64(_f32_bits(x + _F0))
    s = b >> np.int64(63)
    return (b ^ (s & np.int64(0x7FFFFFFF))) + np.int64(0x80000000)


@intrinsic
def _bits_f32(typingctx, b):
    """The fp32 of the bits of an int32 (an LLVM bitcast)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@njit(cache=True, inline="always")
def _value_of(key):
    """The fp32 whose key is ``key`` (>= 2**31: a non-negative value; else a negative one)."""
    k = key - np.int64(0x80000000)
    return _bits_f32(np.int32(k ^ ((k >> np.int64(63)) & np.int64(0x7FFFFFFF))))


@njit(cache=True, inline="always")
def _mass(w):
    """reference.fixed_mass of one clean fp32 weight: the fp32 product and sum, truncated."""
    return np.int64(np.float32(np.float32(min(w, _ONE) * _MSCALE) + _HALF))


@njit(cache=True, inline="always")
def _value(xv, probs):
    """The value the filters compare: clean_probs' for probabilities, the cleaned logit as given."""
    return _clean(xv) if probs else xv


@njit(cache=True, inline="always")
def _passes(m, thr):
    """The select's test of the mass (or count) above a key: M == 0 or M < thr in fp64."""
    return m == 0 or np.float64(m) < thr


@njit(cache=True, inline="always")
def _max_key(xs, probs, n):
    """The largest key of the first n values of a block (an integer max: vectorised)."""
    best = np.int64(0)
    for i in range(n):
        k = _key(_value(xs[i], probs))
        best = k if k > best else best
    return best


@njit(cache=True)
def _block_max_keys(x, probs, bmax):
    """bmax [G] <- the largest key of each race group of the row (blocks of RACE_GROUP entries,
    full ones of a known trip count); returns the row's largest key. The selects and sums skip
    the blocks whose largest key is below their candidates'."""
    V = x.shape[0]
    full = V // _G
    best = np.int64(0)
    for g in range(full):
        lo = g * _G
        m = _max_key(x[lo : lo + _G], True, _G) if probs else _max_key(x[lo : lo + _G], False, _G)
        bmax[g] = m
        best = m if m > best else best
    if full < bmax.shape[0]:
        lo = full * _G
        m = _max_key(x[lo:V], True, V - lo) if probs else _max_key(x[lo:V], False, V - lo)
        bmax[full] = m
        best = m if m > best else best
    return best


@njit(cache=True, inline="always")
def _hist(xs, ws, probs, lo_key, use_mass, cnt, msum):
    """Level 1's histogram loop (inlined with ``probs`` and ``use_mass`` constants: no per-entry
    branch on them); a branch skips non-candidates (well predicted: they come in runs)."""
    for v in range(xs.shape[0]):
        k = _key(_value(xs[v], probs))
        if k >= lo_key:
            b = np.uint64(k >> np.int64(21))  # (unsigned: no wraparound code)
            cnt[b] += 1
            if use_mass:
                msum[b] += _mass(_clean(ws[v]))


@njit(cache=True)
def _level1(x, w, probs, lo_key, use_mass, cnt, msum, bmax):
    """Level 1's histogram of the candidates (key >= lo_key) of a row by their top 11 key bits:
    counts, and fixed-point masses when ``use_mass`` (bin 0 holds no value's key); blocks whose
    largest key is below lo_key are skipped."""
    cnt[:] = 0
    msum[:] = 0
    V = x.shape[0]
    for g in range(bmax.shape[0]):
        if bmax[g] < lo_key:
            continue
        lo = g * _G
        hi = min(lo + _G, V)
        xs = x[lo:hi]
        ws = w[lo:hi]
        if probs:
            if use_mass:
                _hist(xs, ws, True, lo_key, True, cnt, msum)
            else:
                _hist(xs, ws, True, lo_key, False, cnt, msum)
        elif use_mass:
            _hist(xs, ws, False, lo_key, True, cnt, msum)
        else:
            _hist(xs, ws, False, lo_key, False, cnt, msum)


@njit(cache=True, inline="always")
def _copy_bin(xs, ws, probs, lo_key, use_mass, top, bkeys, bmass):
    """The entries of level 1's chosen bin ``top`` (key, mass or 1) into bkeys, bmass; their count."""
    n = 0
    for v in range(xs.shape[0]):
        k = _key(_value(xs[v], probs))
        if (k >> np.int64(21)) == top and k >= lo_key:
            bkeys[n] = k
            bmass[n] = _mass(_clean(ws[v])) if use_mass else 1
            n += 1
    return n


@njit(cache=True)
def _scan(cnt, msum, use_mass, above, thr, lowest):
    """(the lowest bin >= ``lowest`` whose mass above passes, that mass): bins scanned from the
    top, ``above`` the mass of the candidates above every bin; -1 when none passes."""
    chosen = -1
    base = above
    for b in range(cnt.shape[0] - 1, lowest - 1, -1):
        c = cnt[b]
        if c == 0:
            continue
        if not _passes(above, thr):
            break
        chosen = b
        base = above
        above += msum[b] if use_mass else c
    return chosen, base


@njit(cache=True)
def _select(x, w, probs, lo_key, use_mass, thr, cnt, msum, bkeys, bmass, bmax):
    """The smallest candidate key K (key >= lo_key) whose mass above passes (:func:`_passes`):
    the radix select of the module docstring, level 1's histogram already in cnt, msum."""
    top, base = _scan(cnt, msum, use_mass, np.int64(0), thr, 1)
    top = np.int64(top)
    n = 0  # copy the chosen bin's entries out (key, mass)
    V = x.shape[0]
    for g in range(bmax.shape[0]):
        if bmax[g] < lo_key or (bmax[g] >> np.int64(21)) < top:
            continue
        lo = g * _G
        hi = min(lo + _G, V)
        if probs:
            n += _copy_bin(x[lo:hi], w[lo:hi], True, lo_key, use_mass, top, bkeys[n:], bmass[n:])
        else:
            n += _copy_bin(x[lo:hi], w[lo:hi], False, lo_key, use_mass, top, bkeys[n:], bmass[n:])
    mid, base = _refine(bkeys, bmass, n, np.int64(10), np.int64(2047), base, thr, cnt, msum)
    m = 0  # keep the chosen sub-bin's entries
    for i in range(n):
        if ((bkeys[i] >> np.int64(10)) & np.int64(2047)) == mid:
            bkeys[m] = bkeys[i]
            bmass[m] = bmass[i]
            m += 1
    low, _ = _refine(bkeys, bmass, m, np.int64(0), np.int64(1023), base, thr, cnt, msum)
    return (np.int64(top) << np.int64(21)) | (np.int64(mid) << np.int64(10)) | np.int64(low)


@njit(cache=True)
def _refine(bkeys, bmass, n, shift, mask, above, thr, cnt, msum):
    """Levels 2 and 3 of the select on the copied entries: the histogram of key bits
    (key >> shift) & mask, then :func:`_scan` from the mass above them."""
    nb = mask + 1
    cnt[:nb] = 0
    msum[:nb] = 0
    for i in range(n):
        b = np.uint64((bkeys[i] >> shift) & mask)
        cnt[b] += 1
        msum[b] += bmass[i]
    return _scan(cnt[:nb], msum[:nb], True, above, thr, 0)


@njit(cache=True, inline="always")
def _block_mass(xs, ws, probs, tau_key, n):
    """The fixed-point mass of the first n entries of a block with key >= tau_key (vectorised)."""
    total = np.int64(0)
    for i in range(n):
        m = _mass(_clean(ws[i]))
        total += m if _key(_value(xs[i], probs)) >= tau_key else 0
    return total


@njit(cache=True)
def _kept_mass(x, w, probs, tau_key, bmax):
    """The fixed-point mass of the values with key >= tau_key (blocks below it skipped)."""
    total = np.int64(0)
    V = x.shape[0]
    for g in range(bmax.shape[0]):
        if bmax[g] < tau_key:
            continue
        lo = g * _G
        n = min(_G, V - lo)
        xs = x[lo : lo + n]
        ws = w[lo : lo + n]
        total += _block_mass(xs, ws, True, tau_key, n) if probs else _block_mass(xs, ws, False, tau_key, n)
    return total


@njit(cache=True)
def _top_p_floor(bmax, lo, thr):
    """A key below which top-p keeps nothing, from the block maxima of a probabilities row: at a
    block maximum T, the maxima above T weigh at least their own masses, so once those reach thr
    M(> T) fails the test and tau_p > T (lo when no maximum decides it)."""
    sk = np.sort(bmax)
    above = np.int64(0)
    i = sk.shape[0] - 1
    while i >= 0 and sk[i] >= lo:
        k = sk[i]
        if above > 0 and not _passes(above, thr):
            return k + np.int64(1)
        m = _mass(_value_of(k))
        while i >= 0 and sk[i] == k:
            above += m
            i -= 1
    return lo


@njit(cache=True)
def _threshold(x, w, probs, k, p, mp, has_k, has_p, has_m, joint, max_key, cnt, msum, bkeys, bmass, bmax):
    """reference.filter_threshold of one row (FlashInfer's order), as a key: keep key >= tau_key
    (1: every value). Top-k's select starts from the k-th largest block maximum (k entries lie at
    or above it, so tau_k does too: the blocks below it are skipped)."""
    V = x.shape[0]
    tau = np.int64(1)
    if has_k and k > 0 and k < V:
        lo = np.int64(1)
        G = bmax.shape[0]
        if k <= G:
            lo = np.sort(bmax)[G - k]
        _level1(x, w, probs, lo, False, cnt, msum, bmax)
        tau = _select(x, w, probs, lo, False, np.float64(k), cnt, msum, bkeys, bmass, bmax)
    if has_p:
        lo = np.int64(1) if joint else tau
        if p >= _ONE:
            tau_p = lo
        else:
            thr = np.float64(p) * np.float64(_kept_mass(x, w, probs, lo, bmax))
            if probs:  # (logits' weights are not their values: no floor from the maxima)
                lo = max(lo, _top_p_floor(bmax, lo, thr))
            _level1(x, w, probs, lo, True, cnt, msum, bmax)
            tau_p = _select(x, w, probs, lo, True, thr, cnt, msum, bkeys, bmass, bmax)
        tau = max(tau, tau_p)
    if has_m:
        row_max = _value_of(max_key)
        t = np.float32(mp * row_max)
        t = t if t < row_max else row_max
        tau = max(tau, _key(t))
    return tau


@njit(cache=True, fastmath={"reassoc"}, inline="always")
def _kept_sum(ws, xs, tau, n):
    """fp64 sum of the first n kept weights of a group (slices from 0)."""
    acc = 0.0
    for i in range(n):
        wv = _clean(ws[i])
        acc += np.float64(wv if xs[i] >= tau else _F0)
    return acc


@njit(cache=True, fastmath={"reassoc"})
def _kept_group_sums(w, x, tau, tau_key, bmax, sums):
    """sums [G] fp64 <- the race's group sums of the kept weights; full groups of a known size
    ("reassoc" here too: the inlined sums take their caller's flags); a group whose largest key is
    below tau_key keeps nothing (0)."""
    V = w.shape[0]
    full = V // _G
    for g in range(full):
        lo = g * _G
        sums[g] = _kept_sum(w[lo : lo + _G], x[lo : lo + _G], tau, _G) if bmax[g] >= tau_key else 0.0
    if full < sums.shape[0]:
        lo = full * _G
        sums[full] = _kept_sum(w[lo:V], x[lo:V], tau, V - lo) if bmax[full] >= tau_key else 0.0


@njit(cache=True)
def _race_kept(w, x, tau, tau_key, bmax, seed, offset, sums, e):
    """rng.sample_race of the kept weights (clean w where x >= tau, else 0): level 1 over the
    group sums, level 2 over the chosen group, as _numba_kernels._race."""
    V = w.shape[0]
    _kept_group_sums(w, x, tau, tau_key, bmax, sums)
    g = _pick_group(sums, seed, offset, _BASE, _STREAM_SAMPLE, e)
    _fill_exponentials(seed, offset, _BASE, _STREAM_SAMPLE, e, _G)
    best = np.float32(-np.inf)
    best_i = 0
    for i in range(_G):
        v = g * _G + i
        weight = np.float32(-1.0)
        if v < V:
            weight = _clean(w[v]) if x[v] >= tau else _F0
        key = (weight * _SCALE) / e[i]
        if key > best:
            best = key
            best_i = i
    return g * _G + best_i


@njit(cache=True)
def sample_filtered_kernel(
    x,  # [R, V] fp32: probabilities (raw), or cleaned logits
    w,  # [R, V] fp32: the weights (the same array as x for probabilities)
    probs,  # bool: x holds probabilities (cleaned here) rather than cleaned logits
    rows,  # [B] int64: the input row of each output (outside [0, R): no row)
    seeds,  # [B] uint64
    offsets,  # [B] uint64
    top_k,  # [B] int64 (read when has_k)
    top_p,  # [B] fp32 (read when has_p)
    min_p,  # [B] fp32 (read when has_m)
    has_k,
    has_p,
    has_m,
    joint,  # bool: top-p on the whole row rather than on the top-k survivors
    out,  # [B] int64: the token, -1 where the row is missing or has no mass
):
    """``sampling.reference.sample_reference`` with filters, one output row at a time: the row's
    max (validity, min-p), the threshold (:func:`_threshold`), the race of the kept weights."""
    R, V = x.shape
    cnt = np.empty(_BINS, dtype=np.int64)
    msum = np.empty(_BINS, dtype=np.int64)
    bkeys = np.empty(V, dtype=np.int64)
    bmass = np.empty(V, dtype=np.int64)
    G = max(-(-V // _G), 1)
    sums = np.empty(G, dtype=np.float64)
    bmax = np.empty(G, dtype=np.int64)
    e = np.empty(max(G + 1, _G), dtype=np.float32)
    for b in range(rows.shape[0]):
        r = rows[b]
        if r < 0 or r >= R:
            out[b] = -1
            continue
        xr = x[r]
        wr = w[r]
        max_key = _block_max_keys(xr, probs, bmax)
        row_max = _value_of(max_key)
        if not (row_max > _F0 if probs else row_max > _NEG_INF):
            out[b] = -1
            continue
        tau_key = _threshold(
            xr,
            wr,
            probs,
            top_k[b] if has_k else 0,
            top_p[b] if has_p else _ONE,
            min_p[b] if has_m else _F0,
            has_k,
            has_p,
            has_m,
            joint,
            max_key,
            cnt,
            msum,
            bkeys,
            bmass,
            bmax,
        )
        tau = _NEG_INF if tau_key <= np.int64(1) else _value_of(tau_key)
        out[b] = _race_kept(wr, xr, tau, tau_key, bmax, seeds[b], offsets[b], sums, e)


@njit(cache=True, error_model="numpy")
def renorm_kernel(
    probs,  # [B, V] fp32
    top_k,  # [B] int64 (read when has_k)
    top_p,  # [B] fp32 (read when has_p)
    has_k,
    has_p,
    out,  # [B, V] fp32
):
    """``sampling.reference.renorm_reference`` (fp32 output): the kept clean probabilities divided
    by the kept fixed-point mass as an fp32 (units * 2**-MASS_BITS), zeros on a row without it."""
    B, V = probs.shape
    cnt = np.empty(_BINS, dtype=np.int64)
    msum = np.empty(_BINS, dtype=np.int64)
    bkeys = np.empty(V, dtype=np.int64)
    bmass = np.empty(V, dtype=np.int64)
    inv = np.float32(1.0 / 2.0**SAMPLING_MASS_BITS)
    bmax = np.empty(max(-(-V // _G), 1), dtype=np.int64)
    for b in range(B):
        x = probs[b]
        o = out[b]
        max_key = _block_max_keys(x, True, bmax)
        tau_key = _threshold(
            x,
            x,
            True,
            top_k[b] if has_k else 0,
            top_p[b] if has_p else _ONE,
            _F0,
            has_k,
            has_p,
            False,
            False,
            max_key,
            cnt,
            msum,
            bkeys,
            bmass,
            bmax,
        )
        denom = np.float32(np.float32(_kept_mass(x, x, True, tau_key, bmax)) * inv)
        if not denom > _F0:
            o[:] = _F0
            continue
        tau = _NEG_INF if tau_key <= np.int64(1) else _value_of(tau_key)
        for v in range(V):
            c = _clean(x[v])
            o[v] = np.float32(c / denom) if c >= tau else _F0


@njit(cache=True)
def mask_logits_kernel(
    logits,  # [B, V] fp32
    top_k,  # [B] int64
    out,  # [B, V] fp32
):
    """``sampling.reference.mask_logits_reference``: logits whose cleaned value is below the k-th
    largest become -inf, NaN logits too."""
    B, V = logits.shape
    cnt = np.empty(_BINS, dtype=np.int64)
    msum = np.empty(_BINS, dtype=np.int64)
    bkeys = np.empty(V, dtype=np.int64)
    bmass = np.empty(V, dtype=np.int64)
    clean = np.empty(V, dtype=np.float32)
    G = max(-(-V // _G), 1)
    bmax = np.empty(G, dtype=np.int64)
    for b in range(B):
        x = logits[b]
        o = out[b]
        for v in range(V):  # clean_logits: NaN -> -inf, +inf -> the largest finite fp32
            xv = x[v]
            xv = xv if xv == xv else _NEG_INF
            clean[v] = _FMAX if xv == np.float32(np.inf) else xv
        k = top_k[b]
        tau = _NEG_INF
        if k > 0 and k < V:
            _block_max_keys(clean, False, bmax)
            tau_key = _threshold(
                clean, clean, False, k, _ONE, _F0, True, False, False, False, 0, cnt, msum, bkeys, bmass, bmax
            )
            tau = _value_of(tau_key)
        for v in range(V):
            xv = x[v]
            o[v] = xv if (clean[v] >= tau) & (xv == xv) else _NEG_INF
