"""numba kernels of the CPU path: the samplers' verification and the seeded draw, compiled.

Each kernel is the PyTorch reference's arithmetic written as explicit loops, so the floats are the
same operations in the same precision (fp32 accept ratios and level-2 keys, fp64 group sums and
level-1 keys), and Philox4x32-10 runs inside the loop over the vocabulary group being raced
(``spec_samplers.rng`` is the specification, bit for bit). One thread: a request's vocabulary pass
reads its rows once. (``prange`` over requests cost 10-25 ms a call on a loaded 2-core machine,
the OpenMP region waiting for a descheduled thread, against 0.1 ms for one request serially.)

Blocked passes (a race's group sums, the argmax's first pass) call their inline block helper with
``hi = lo + BLOCK`` for the full blocks and once more for the shorter last block: with the trip
count known, LLVM unrolls the vector loop into independent accumulators. On the project's CPU that
made a 128256-entry row's group sums 6x faster (92 -> 14 us) and the argmax's first pass 10x
(40 -> 3.7 us) as against ``hi = min(lo + BLOCK, V)``; the group sums came out bit for bit the same
on rows of a group or more. (The entropy's passes keep the general loop: inlined so, they ran
1.4-5x slower.)

Imported only by :mod:`spec_samplers.cpu` when numba is installed (``pip install
spec-samplers[cpu]``); compiled code is cached on disk (``cache=True``), so only the first process
on a machine compiles.

Exactness notes (tests/test_cpu_path.py compares tokens with the references):

* fp64 sums of a race group are taken in one fixed order here and in another by ``torch.sum``:
  they differ by at most ~2**-53 relative, which changes a level-1 winner only when its two best
  keys agree to that precision (the same argument as the Triton kernels', rng.race_group_sums);
* the race exponentials' fp64 ``-log1p(-u)`` is ``-_log(1 - u)`` here (1 - u exact; fdlibm's
  kernel, branch-free, so that the loop filling a group's exponentials vectorises: a libm call per
  entry was half the race's time), SLEEF's ``log1p`` in PyTorch: both within an fp64 ulp, rounded
  to fp32, so they differ only when an fp64 result lies within an ulp or two of an fp32 rounding
  boundary (about 2**-28 of the draws);
* typical acceptance's fp64 ``log`` is :func:`_log` (fdlibm's kernel, branch-free so that LLVM
  vectorises it), within an ulp of the true value as SLEEF's is, and unequal to it in a last bit
  on ~4% of entries: the entropy moves by ~2**-52 relative, as with the order of its sum.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from spec_samplers import rng
from spec_samplers.constants import RESIDUAL_MASS_EPS

_MASK32 = np.uint64(0xFFFFFFFF)
_M0 = np.uint64(rng.PHILOX_M0)
_M1 = np.uint64(rng.PHILOX_M1)
_W0 = np.uint64(rng.PHILOX_W0)
_W1 = np.uint64(rng.PHILOX_W1)
_U8 = np.uint64(8)
_U16 = np.uint64(16)
_U24 = np.uint64(24)
_U32 = np.uint64(32)
_FF = np.uint64(0xFF)
_FFFF = np.uint64(0xFFFF)
_FFFFFF = np.uint64(0xFFFFFF)
_ONE = np.uint64(1)
_P24 = np.float32(2.0**-24)
_P48 = np.float32(2.0**-48)
_P64 = np.float32(2.0**-64)
_UMAX = np.float32(rng.UNIFORM_MAX)
_SCALE = np.float32(rng.RACE_SCALE)
_F0 = np.float32(0.0)
_INF_BITS = np.int32(0x7F800000)
_ONE32 = np.float32(1.0)
_G = rng.RACE_GROUP
_L1 = np.int64(rng.LEVEL1_COUNTER)
_EPS = RESIDUAL_MASS_EPS
_STREAM_ACCEPT = np.uint64(rng.STREAM_ACCEPT)
_STREAM_RECOVER = np.uint64(rng.STREAM_RECOVER)
#: below it, 1 - u is not exact in fp64 (_exponential_v)
_TINY_U = 2.0**-30


@njit(cache=True, inline="always")
def _philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint64 words < 2**32 (rng.philox4x32)."""
    for _ in range(10):
        p0 = c0 * _M0
        p1 = c2 * _M1
        c0, c1, c2, c3 = (p1 >> _U32) ^ c1 ^ k0, p1 & _MASK32, (p0 >> _U32) ^ c3 ^ k1, p0 & _MASK32
        k0 = (k0 + _W0) & _MASK32
        k1 = (k1 + _W1) & _MASK32
    return c0, c1, c2, c3


@njit(cache=True, inline="always")
def _words(seed, offset, counter, stream):
    """rng.random_words: seed, offset uint64 (two's complement), counter int64, stream uint64."""
    c = np.uint64(counter)
    c1 = ((c >> _U32) & _FFFFFF) | (stream << _U24)
    return _philox(c & _MASK32, c1, offset & _MASK32, offset >> _U32, seed & _MASK32, seed >> _U32)


@njit(cache=True, inline="always")
def _uniform(a, b):
    """rng.uniform_from_words: three exact fp32 pieces added smallest first, clamped."""
    hi = np.float32(a >> _U8) * _P24
    mid = np.float32(((a & _FF) << _U16) | (b >> _U16)) * _P48
    low = np.float32((b | _ONE) & _FFFF) * _P64
    return min(hi + (mid + low), _UMAX)


@njit(cache=True, inline="always")
def _clean(x):
    """torch_ops.clean_probs of one fp32 value: NaN, Inf and negatives to 0 (a select, no branch).
    The kept values are the positive finite ones, whose bits as an int32 lie in (0, +Inf's bits):
    one integer range test, which LLVM vectorises 8 lanes wide (the float tests ``0 < x < inf``
    became a dozen integer ops per 4 lanes, half the speed of a row's group sums; the two forms
    agree on all 2**32 inputs)."""
    b = _f32_bits(x)
    return x if (b > np.int32(0)) & (b < _INF_BITS) else _F0


@njit(cache=True, inline="always", error_model="numpy")
def _exponential_v(a, b):
    """rng.exponential_from_words on the CPU (the fp64 -log1p(-u) of the fp32 u, rounded to fp32),
    without a libm call, so that a loop of it vectorises: -log(1 - u) by _log
    (fdlibm's kernel, within an ulp as libm's log1p is), 1 - u exact in fp64 for u >= 2**-30 (u's
    24 bits then lie within 53 of 2**0); below, -log1p(-u) = u + u**2 / 2 to 2**-60 relative.
    Rounded to fp32, the two differ only where the fp64 value lies within an ulp or two of an
    fp32 rounding boundary (~2**-28 of the draws, as libm's and SLEEF's do: module docstring)."""
    u = np.float64(_uniform(a, b))
    small = u + 0.5 * u * u
    return np.float32(-_log(1.0 - u) if u >= _TINY_U else small)


@njit(cache=True, error_model="numpy")
def _fill_exponentials(seed, offset, base, stream, e, n):
    """e[i] <- the race exponential of index i < n (n even): words (0, 1) of counter base + i // 2
    for even i, (2, 3) for odd i (rng.race_exponentials), in one loop LLVM vectorises."""
    for h in range(n // 2):
        w = _words(seed, offset, base + h, stream)
        e[2 * h] = _exponential_v(w[0], w[1])
        e[2 * h + 1] = _exponential_v(w[2], w[3])


@njit(cache=True)
def _pick_group(sums, seed, offset, base, stream, e):
    """Level 1 (rng.pick_group): argmax_g sums[g] / E1_g in fp64, ties to the lowest group; group
    g's exponential is words (0, 1) (even g) or (2, 3) (odd g) of counter base + LEVEL1 + g // 2
    (``e``: a buffer of >= G + 1 fp32)."""
    G = sums.shape[0]
    _fill_exponentials(seed, offset, base + _L1, stream, e, G + (G & 1))
    best = -1.0
    best_g = 0
    for g in range(G):
        key = sums[g] / np.float64(e[g])
        if key > best:
            best = key
            best_g = g
    return best_g


# The raced rows (residuals), one entry at a time: q = clean target row, p = clean draft row.
#: q itself
RES_Q = 0
#: rejection sampling: q - min(p, q) (reference._residual_)
RES_REJECT = 1
#: rejection sampling, point-mass draft x: q with q[x] = 0
RES_REJECT_POINT = 2
#: block verification: (rho q - p)+
RES_BLOCK = 3
#: block verification, point-mass draft x: rho q with (rho q[x] - 1)+ at x
RES_BLOCK_POINT = 4


@njit(cache=True, inline="always")
def _residual(q, p, v, mode, rho, skip):
    """fp32 entry v of the raced row ``mode`` (the RES_* constants) of rows q, p (fp32)."""
    qv = _clean(np.float32(q[v]))
    if mode == RES_REJECT:
        return qv - min(_clean(np.float32(p[v])), qv)
    if mode == RES_REJECT_POINT:
        return _F0 if v == skip else qv
    if mode == RES_BLOCK:
        r = rho * qv - _clean(np.float32(p[v]))
        return r if r > _F0 else _F0
    if mode == RES_BLOCK_POINT:
        s = rho * qv
        if v == skip:
            s = s - np.float32(1.0)
            return s if s > _F0 else _F0
        return s
    return qv


@njit(cache=True, fastmath={"reassoc"}, inline="always")
def _sum(q, p, lo, hi, mode, rho, skip):
    """fp64 sum of entries [lo, hi) of the raced row (_residual). "reassoc" lets LLVM vectorise
    the fp64 additions (its lanes fix an order, as torch.sum's do; the two differ by ~2**-53
    relative, module docstring); the selects and fp32 operations are single operations."""
    acc = 0.0
    for v in range(lo, hi):
        acc += np.float64(_residual(q, p, v, mode, rho, skip))
    return acc


@njit(cache=True, fastmath={"reassoc"})
def _group_sums(q, p, mode, rho, skip, sums):
    """sums [G] fp64 <- the group sums of the raced row (_residual). The common modes get a loop
    each with ``mode`` a constant (a branch per entry would keep LLVM from vectorising); the full
    groups end at lo + _G, a known trip count (module docstring), the last one at V."""
    V = q.shape[0]
    full = min(V // _G, sums.shape[0])
    for g in range(full):
        lo = g * _G
        if mode == RES_REJECT:
            sums[g] = _sum(q, p, lo, lo + _G, RES_REJECT, rho, skip)
        elif mode == RES_Q:
            sums[g] = _sum(q, p, lo, lo + _G, RES_Q, rho, skip)
        elif mode == RES_BLOCK:
            sums[g] = _sum(q, p, lo, lo + _G, RES_BLOCK, rho, skip)
        else:
            sums[g] = _sum(q, p, lo, lo + _G, mode, rho, skip)
    for g in range(full, sums.shape[0]):
        sums[g] = _sum(q, p, g * _G, min((g + 1) * _G, V), mode, rho, skip)


@njit(cache=True)
def _total(sums):
    """The sum of the group sums, in order (the mass tested against RESIDUAL_MASS_EPS)."""
    mass = 0.0
    for g in range(sums.shape[0]):
        mass += sums[g]
    return mass


@intrinsic
def _f32_bits(typingctx, x):
    """The bits of an fp32 as an int32 (an LLVM bitcast: a vector loop keeps it in its lanes)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


#: entries of a row per block of the argmax's first pass
_ARGMAX_BLOCK = 2048


@njit(cache=True, inline="always")
def _max_bits(q, lo, hi):
    """The largest bits of the clean fp32 entries q[lo:hi]: clean values are +0 or positive, and
    there the int32 order of the bits is the float order, so the reduction is an integer max,
    which LLVM vectorises (a float max needs fastmath flags, unsafe before the cleaning)."""
    m = np.int32(0)
    for v in range(lo, hi):
        b = _f32_bits(_clean(np.float32(q[v])))
        m = b if b > m else m
    return m


@njit(cache=True)
def _argmax_clean(q):
    """argmax of the clean row q (ties to the lowest index): the first block holding the largest
    value (vectorised per block), then the first entry of that block equal to it."""
    V = q.shape[0]
    best = np.int32(-1)
    best_lo = 0
    full = V - V % _ARGMAX_BLOCK
    for lo in range(0, full, _ARGMAX_BLOCK):
        m = _max_bits(q, lo, lo + _ARGMAX_BLOCK)  # (a known trip count: module docstring)
        if m > best:
            best = m
            best_lo = lo
    if full < V and _max_bits(q, full, V) > best:
        best = _max_bits(q, full, V)
        best_lo = full
    for v in range(best_lo, min(best_lo + _ARGMAX_BLOCK, V)):
        if _f32_bits(_clean(np.float32(q[v]))) == best:
            return v
    return 0  # (V = 0: never called so)


@njit(cache=True)
def _race(q, p, mode, rho, skip, sums, seed, offset, base, stream, e):
    """rng.two_level_race of the raced row (_residual) given its group sums: level 1 picks a
    group, level 2 races its entries, argmax (w * 2**32) / E_i in fp32 (-1 past the vocabulary),
    entry i's exponential from counter base + i // 2, words (0, 1) or (2, 3) (``e``: a buffer of
    >= max(G + 1, RACE_GROUP) fp32)."""
    V = q.shape[0]
    g = _pick_group(sums, seed, offset, base, stream, e)
    _fill_exponentials(seed, offset, base, stream, e, _G)
    best = np.float32(-np.inf)
    best_i = 0
    for i in range(_G):
        v = g * _G + i
        weight = _residual(q, p, v, mode, rho, skip) if v < V else np.float32(-1.0)
        key = (weight * _SCALE) / e[i]
        if key > best:
            best = key
            best_i = i
    return g * _G + best_i


@njit(cache=True)
def _recover(q, p, mode, rho, skip, greedy, seed, offset, j, stream):
    """reference._recover_from for one request: the race of position j over the raced row
    (_residual), over q when it has no mass; argmax q on greedy rows; -1 when q has no mass."""
    G = max(-(-q.shape[0] // _G), 1)
    sums = np.empty(G, dtype=np.float64)
    _group_sums(q, p, mode, rho, skip, sums)
    if not _total(sums) > _EPS:  # the residual has no mass: race q itself
        _group_sums(q, p, RES_Q, rho, skip, sums)
        if not _total(sums) > 0.0:
            return -1  # nor has q: no token
        mode = RES_Q
    if greedy:
        return _argmax_clean(q)
    e = np.empty(max(G + 1, _G), dtype=np.float32)
    return _race(q, p, mode, rho, skip, sums, seed, offset, np.int64(j) << 32, stream, e)


@njit(cache=True, inline="always")
def _final(recovered, has_draft, bonus, V):
    """reference._final_tokens: the recovered token at a rejection, else the bonus when in range,
    else the bonus row's token (``recovered``: -1 where the layout has no bonus row)."""
    if has_draft:
        return recovered
    if bonus >= 0 and bonus < V:
        return bonus
    return recovered


@njit(cache=True, inline="always")
def _write(out, b, draft_ids, n, final, kb):
    """build_output then _drop_malformed for request b: n drafts, the final token, then -1."""
    for i in range(out.shape[1]):
        out[b, i] = draft_ids[b, i] if i < n else (final if i == n else -1)
        if kb < 0:
            out[b, i] = -1


@njit(cache=True, inline="always")
def _count(out, b, counts):
    """cpu.count_on_host for row b of ``out``: counts [2 + >= K] int64 += (accepted, emitted,
    per position), so that a call runs no counting op after the kernel."""
    for i in range(out.shape[1]):
        if out[b, i] != -1:
            counts[1] += 1
            if i > 0:
                counts[0] += 1
                counts[1 + i] += 1


@njit(cache=True)
def rejection_kernel(
    target,  # [R, V] fp32 (R > 0)
    target_rows,  # [B, K+1] int64, -1 = none
    draft,  # [R', V] fp32 (R' > 0 when has_draft_probs)
    draft_rows,  # [B, K] int64
    has_draft_probs,  # bool: False for point-mass drafts
    draft_ids,  # [B, K] int64 (raw)
    num_draft,  # [B] int64
    bonus,  # [B] int64
    is_greedy,  # [B] bool
    has_greedy,  # bool
    seeds,  # [B] uint64
    offsets,  # [B] uint64
    out,  # [B, K+1] int64
    counts,  # [2 + >= K] int64: the sampler's counters (_count), when ``count``
    count,  # bool
):
    """reference._rejection_core then _drop_malformed, one request per iteration: the accept test
    on gathered scalars, then one race over the first rejected position's row."""
    B, K = draft_ids.shape
    V = target.shape[1]
    for b in range(B):
        seed, offset = seeds[b], offsets[b]
        greedy = has_greedy and is_greedy[b]
        kb = num_draft[b]
        n = 0
        for i in range(K):
            x = draft_ids[b, i]
            valid = x >= 0 and x < V and i < kb
            tr = target_rows[b, i]
            q_x = _clean(np.float32(target[tr, x])) if valid and tr >= 0 else _F0
            if greedy:
                ok = q_x > _F0 and _argmax_clean(target[tr]) == x
            else:
                p_x = np.float32(1.0)
                if has_draft_probs:
                    dr = draft_rows[b, i]
                    p_x = _clean(np.float32(draft[dr, x])) if valid and dr >= 0 else _F0
                w = _words(seed, offset, np.int64(i), _STREAM_ACCEPT)
                ok = valid and p_x > _F0 and _uniform(w[0], w[1]) < q_x / p_x
            if not ok:
                break
            n += 1
        has_draft = n < kb
        qr = target_rows[b, n]
        pr, mode, skip = 0, RES_Q, -1
        if has_draft:  # an out-of-range draft was never a sample of p: race q, not (q - p)+
            x = draft_ids[b, n]
            if x >= 0 and x < V:
                if has_draft_probs:
                    pr, mode = draft_rows[b, n], RES_REJECT
                else:
                    mode, skip = RES_REJECT_POINT, x
        recovered = -1
        if qr >= 0:
            recovered = _recover(target[qr], draft[pr], mode, _ONE32, skip, greedy, seed, offset, n, _STREAM_RECOVER)
        _write(out, b, draft_ids, n, _final(recovered, has_draft, bonus[b], V), kb)
        if count:
            _count(out, b, counts)


@njit(cache=True, fastmath={"reassoc"})
def _block_mass(q, p, rho):
    """Z = sum (rho q - p)+ of one position (reference._block_core), summed in fp64 (vectorised)
    and rounded to fp32: torch sums the fp32 terms in fp32, so the two agree to ~2**-24 relative
    and a token differs only when an accept uniform falls that close to its threshold."""
    acc = 0.0
    for v in range(q.shape[0]):
        acc += np.float64(_residual(q, p, v, RES_BLOCK, rho, -1))
    return np.float32(acc)


@njit(cache=True)
def block_kernel(
    target,  # [R, V] fp32 (R > 0)
    target_rows,  # [B, K+1] int64, -1 = none
    draft,  # [R', V] fp32 (R' > 0 when has_draft_probs)
    draft_rows,  # [B, K] int64
    has_draft_probs,  # bool: False for point-mass drafts
    draft_ids,  # [B, K] int64 (raw)
    num_draft,  # [B] int64
    bonus,  # [B] int64
    is_greedy,  # [B] bool
    has_greedy,  # bool
    seeds,  # [B] uint64
    offsets,  # [B] uint64
    out,  # [B, K+1] int64
    counts,  # [2 + >= K] int64: the sampler's counters (_count), when ``count``
    count,  # bool
):
    """reference._block_core then _drop_malformed, one request per iteration: running ratios
    from gathered scalars, the residual mass of each tested position, the longest accepted block,
    one race at its end."""
    B, K = draft_ids.shape
    V = target.shape[1]
    for b in range(B):
        seed, offset = seeds[b], offsets[b]
        kb = num_draft[b]
        rho = np.empty(K + 1, dtype=np.float32)
        q_x = np.zeros(max(K, 1), dtype=np.float32)
        valid = np.zeros(max(K, 1), dtype=np.bool_)
        rho[0] = _ONE32
        for m in range(K):
            x = draft_ids[b, m]
            valid[m] = x >= 0 and x < V and m < kb
            xc = min(max(x, 0), V - 1)
            tr = target_rows[b, m]
            q_x[m] = _clean(np.float32(target[tr, xc])) if tr >= 0 else _F0
            p_x = _ONE32
            if has_draft_probs:
                dr = draft_rows[b, m]
                p_x = _clean(np.float32(draft[dr, xc])) if dr >= 0 else _F0
            ratio = q_x[m] / p_x if valid[m] and p_x > _F0 else _F0
            prev = rho[m]
            rho[m + 1] = min(prev * ratio, _ONE32) if prev > _F0 else _F0
        if has_greedy and is_greedy[b] and K > 0:  # the greedy rule: leading argmax matches
            tau = 0
            for m in range(K):
                tr = target_rows[b, m]
                if not (valid[m] and q_x[m] > _F0 and _argmax_clean(target[tr]) == draft_ids[b, m]):
                    break
                tau += 1
        else:  # the largest m <= k_b with u_{m-1} < h_m
            tau = 0
            for m in range(1, min(K, max(kb, 0)) + 1):
                if m == K:
                    h = rho[K]
                elif valid[m]:
                    r = rho[m]
                    if r >= _ONE32:
                        h = _ONE32
                    else:
                        if has_draft_probs:
                            tr, dr = target_rows[b, m], draft_rows[b, m]
                            # (rho = 0: every term is (0 - p)+ = 0, the row need not be read)
                            present = tr >= 0 and dr >= 0 and r > _F0
                            z = _block_mass(target[max(tr, 0)], draft[max(dr, 0)], r) if present else _F0
                        else:
                            z = r * (_ONE32 - q_x[m])
                            z = z if z > _F0 else _F0
                        h = z / (z + (_ONE32 - r))
                else:
                    h = rho[m]
                w = _words(seed, offset, np.int64(m - 1), _STREAM_ACCEPT)
                if _uniform(w[0], w[1]) < h:
                    tau = m
        j = tau
        has_draft = j < kb
        jd = min(j, max(K - 1, 0))
        qr = target_rows[b, j]
        pr, mode, skip = 0, RES_Q, -1
        if K > 0 and has_draft and valid[jd]:
            if has_draft_probs:
                pr, mode = draft_rows[b, jd], RES_BLOCK
            else:
                mode, skip = RES_BLOCK_POINT, draft_ids[b, jd]
        recovered = -1
        if qr >= 0:
            greedy = has_greedy and is_greedy[b]
            recovered = _recover(target[qr], draft[pr], mode, rho[j], skip, greedy, seed, offset, j, _STREAM_RECOVER)
        _write(out, b, draft_ids, j, _final(recovered, has_draft, bonus[b], V), kb)
        if count:
            _count(out, b, counts)


@intrinsic
def _f64_bits(typingctx, x):
    """The bits of an fp64 as an int64 (an LLVM bitcast: a vector loop keeps it in its lanes)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def _bits_f64(typingctx, x):
    """The fp64 whose bits are the int64 ``x``."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


# fdlibm's e_log.c (Sun Microsystems, 1993): log(x) = k ln2 + log(1 + f), 1 + f in
# [sqrt(2)/2, sqrt(2)), log(1 + f) = 2s + s R(s^2) with s = f / (2 + f); error under 1 ulp.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01
_MANT = np.int64(0x000FFFFFFFFFFFFF)
_SQRT2_CARRY = np.int64(0x95F64 << 32)  # carries into bit 52 when the mantissa is >= sqrt(2)
_BIT52 = np.int64(1 << 52)
_EXP_ONE = np.int64(0x3FF << 52)
_TWO52_BITS = np.int64(0x4330000000000000)  # 2**52: its bits | n (n < 2**52) is 2**52 + n
_TWO52_PLUS_BIAS = 2.0**52 + 1023.0


@njit(cache=True, inline="always")
def _log(x):
    """fp64 log of a normal positive x without branches (fdlibm's kernel with its rare paths, x
    a power of two times 1 + f with |f| < 2**-20, taken by the general formula, which is within
    an ulp there too): LLVM vectorises a loop of it, where libm's log is a scalar call. It differs
    from libm's and SLEEF's (PyTorch's) log only in a last bit, at most (module docstring)."""
    bits = _f64_bits(x)
    m = bits & _MANT
    carry = (m + _SQRT2_CARRY) & _BIT52
    f = _bits_f64(m | (carry ^ _EXP_ONE)) - 1.0
    # k = exponent - 1023 + carry, exact in fp64 without an int64 -> fp64 conversion (no AVX2 op)
    dk = _bits_f64(_TWO52_BITS | ((bits >> np.int64(52)) + (carry >> np.int64(52)))) - _TWO52_PLUS_BIAS
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    r = t2 + t1
    hx = m >> np.int64(32)
    hfsq = 0.5 * f * f
    a = dk * _LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LN2_LO)) - f)
    b = dk * _LN2_HI - ((s * (f - r) - dk * _LN2_LO) - f)
    return a if (hx >= np.int64(0x6147A)) & (hx <= np.int64(0x6B851)) else b


@njit(cache=True, error_model="numpy")
def _entropy_terms(q, lo, hi, eps, terms):
    """terms[: hi - lo] <- log(x + eps) * x, x the clean fp32 q[lo:hi] in fp64 (the reference's
    operations, in its order). No fastmath here: _log's float order is its accuracy. The numpy
    error model drops the division's zero check (2 + f >= 1.7), a branch that stops LLVM's
    vectoriser."""
    row = q[lo:hi]  # (indices from 0, as in _approx_terms)
    for v in range(hi - lo):
        x = np.float64(_clean(np.float32(row[v])))
        terms[v] = _log(x + eps) * x


@njit(cache=True, fastmath={"reassoc"})
def _sum_terms(terms, n):
    """fp64 sum of terms[:n], vectorised (its lanes fix an order: module docstring)."""
    acc = 0.0
    for v in range(n):
        acc += terms[v]
    return acc


#: entries of a row whose entropy terms are made, then summed, at a time (a 16 KiB buffer)
_ENTROPY_BLOCK = 2048


@njit(cache=True)
def _typical_threshold(q, eps, threshold, alpha, terms):
    """reference.typical_threshold of one row: min(threshold, alpha * exp(-H)) in fp64, H = -sum
    q log(q + eps) over the clean fp32 row q, in fp64 (``terms``: an _ENTROPY_BLOCK buffer). The
    sum's order and _log's last bits differ from torch's: H moves by ~2**-52 relative, so the
    test differs only for q(x) that close to its threshold."""
    V = q.shape[0]
    h = 0.0
    for lo in range(0, V, _ENTROPY_BLOCK):
        hi = min(lo + _ENTROPY_BLOCK, V)
        _entropy_terms(q, lo, hi, eps, terms)
        h += _sum_terms(terms, hi - lo)
    return min(alpha * math.exp(h), threshold)


@intrinsic
def _bits_f32(typingctx, x):
    """The fp32 whose bits are the int32 ``x``."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


# The entropy's first pass (_entropy_bounds): fp32 log(y) = k ln2 + f P(f), 1 + f in
# [sqrt(2)/2, sqrt(2)), P the degree-6 polynomial of a Chebyshev fit of log1p(f) / f there
# (numpy.polynomial.chebyshev.chebfit at 4000 nodes, in the power basis): |error| < 2**-21 over
# every fp32 mantissa, evaluated in fp32 (tests/test_cpu_path.py checks the bound _LOG32_ERR).
_C1 = np.float32(1.0000009643975842)
_C2 = np.float32(-0.5000114503774584)
_C3 = np.float32(0.3331467380855004)
_C4 = np.float32(-0.24908289184723012)
_C5 = np.float32(0.20491759650007274)
_C6 = np.float32(-0.18680751427111542)
_C7 = np.float32(0.11931054435702354)
_LN2_32 = np.float32(math.log(2.0))
_MANT32 = np.int32(0x7FFFFF)
_SQRT2_CARRY32 = np.int32(0x800000 - 0x3504F3)  # carries into bit 23 when the mantissa is >= sqrt(2)
_BIT23 = np.int32(0x800000)
_EXP_ONE32 = np.int32(0x3F800000)
#: |_log32(y) - log(y)| <= _LOG32_ERR * (|log(y)| + 1) for every normal fp32 y (the fit's 2**-21,
#: the argument's and k ln2's fp32 roundings; the test measures 2**-21.6 at most: a 4x margin)
_LOG32_ERR = 2.0**-19.5
#: entries per fp32 block sum of the first pass: the sum of n fp32 terms in any order is within
#: (n - 1) 2**-24 of the sum of their magnitudes, 2**-15 here (the blocks are added in fp64)
_BOUNDS_BLOCK = 512


@njit(cache=True, inline="always")
def _log32(y):
    """fp32 log of a normal positive fp32 y, without branches or a division (vectorised)."""
    bits = _f32_bits(y)
    m = np.int32(bits & _MANT32)
    carry = np.int32((m + _SQRT2_CARRY32) & _BIT23)
    f = _bits_f32(np.int32(m | (carry ^ _EXP_ONE32))) - _ONE32
    k = np.float32(np.int32((bits >> np.int32(23)) - np.int32(127) + (carry >> np.int32(23))))
    p = _C6 + f * _C7
    p = _C5 + f * p
    p = _C4 + f * p
    p = _C3 + f * p
    p = _C2 + f * p
    p = _C1 + f * p
    return k * _LN2_32 + f * p


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _approx_terms(q, lo, hi, eps32, terms):
    """terms[: hi - lo] <- x log32(x + eps), x the clean fp32 q[lo:hi], all in fp32 (vectorised
    8 lanes wide; FMA contraction only makes each step more accurate)."""
    row = q[lo:hi]  # (indices from 0: LLVM then drops numba's negative-index wraparound, which
    # made this loop gather its entries one lane at a time)
    for v in range(hi - lo):
        x = _clean(np.float32(row[v]))
        terms[v] = x * _log32(x + eps32)


@njit(cache=True, fastmath={"reassoc"})
def _sum_bounds(q, lo, terms, n):
    """(sum terms, sum |terms|, sum x) over terms[:n] and the clean q[lo:lo + n], in fp32
    (vectorised; the block's size bounds their error, _BOUNDS_BLOCK)."""
    h = _F0
    a = _F0
    s = _F0
    row = q[lo : lo + n]  # (indices from 0, as in _approx_terms)
    for v in range(n):
        t = terms[v]
        h += t
        a += abs(t)
        s += _clean(np.float32(row[v]))
    return h, a, s


@njit(cache=True)
def _entropy_bounds(q, eps, terms):
    """(h, e): -H of the clean row q (reference.typical_threshold's sum q log(q + eps)) within
    +-e of the fp64 value _typical_threshold computes, from one fp32 pass (~4x cheaper than the
    fp64 log). Per entry |x log32(x + eps) - x log(x + eps)| <= _LOG32_ERR (|x log| + x) plus the
    product's and eps's fp32 roundings (2**-24 each, relative); the fp32 block sums add (n - 1)
    2**-24 of the magnitudes; e doubles the sum of those and adds 2**-30 of the magnitudes for the
    fp64 pass's own order and log (~2**-36 at V = 2**17)."""
    V = q.shape[0]
    eps32 = np.float32(eps)
    h = 0.0
    a = 0.0
    s = 0.0
    for lo in range(0, V, _BOUNDS_BLOCK):
        n = min(lo + _BOUNDS_BLOCK, V) - lo
        _approx_terms(q, lo, lo + n, eps32, terms)
        bh, ba, bs = _sum_bounds(q, lo, terms, n)
        h += np.float64(bh)
        a += np.float64(ba)
        s += np.float64(bs)
    gamma = (_BOUNDS_BLOCK - 1) * 2.0**-24
    a = a * (1.0 + 2.0 * gamma)
    s = s * (1.0 + 2.0 * gamma)
    u = 2.0**-24
    err = 2.0 * ((_LOG32_ERR + 2.0 * u + gamma) * (1.0 + _LOG32_ERR) * a + (_LOG32_ERR + 2.0 * u) * s)
    err += 2.0**-30 * (a + s)
    return h, err


@njit(cache=True)
def _typical_accepts(q, q_x, eps, threshold, alpha, terms, terms32):
    """q_x > reference.typical_threshold(q) (q_x in (0, threshold] when called): decided by the fp32
    pass's interval [h - e, h + e] when the threshold min(threshold, alpha exp(h')), increasing in
    h', puts q_x on one side for the whole interval; else by the fp64 pass (_typical_threshold),
    whose h the interval holds. Rows whose bounds are not finite (entries near fp32's overflow)
    take the fp64 pass."""
    h, e = _entropy_bounds(q, eps, terms32)
    top = alpha * math.exp(h + e)
    if top < np.inf and e < np.inf:
        if q_x > min(top, threshold):
            return True
        if not q_x > min(alpha * math.exp(h - e), threshold):
            return False
    return q_x > _typical_threshold(q, eps, threshold, alpha, terms)


@njit(cache=True)
def typical_kernel(
    target,  # [R, V] fp32 (R > 0)
    target_rows,  # [B, K+1] int64, -1 = none
    draft_ids,  # [B, K] int64 (raw)
    num_draft,  # [B] int64
    bonus,  # [B] int64
    eps,  # float: ENTROPY_EPS_FP32
    threshold,  # float: posterior_threshold rounded to fp32
    alpha,  # float: posterior_alpha rounded to fp32
    out,  # [B, K+1] int64
    counts,  # [2 + >= K] int64: the sampler's counters (_count), when ``count``
    count,  # bool
):
    """reference._typical_core then _drop_malformed, one request per iteration: the entropy test
    of each position until the first rejection (the rows of later positions are never read; a
    draft with q(x) above the threshold, or zero, needs no entropy), then the argmax of the first
    rejected position's row."""
    B, K = draft_ids.shape
    V = target.shape[1]
    terms = np.empty(_ENTROPY_BLOCK, dtype=np.float64)
    terms32 = np.empty(_BOUNDS_BLOCK, dtype=np.float32)
    for b in range(B):
        kb = num_draft[b]
        n = 0
        for i in range(K):
            x = draft_ids[b, i]
            tr = target_rows[b, i]
            if not (x >= 0 and x < V and i < kb and tr >= 0):
                break
            q = target[tr]
            q_x = np.float64(_clean(np.float32(q[x])))
            # min(threshold, alpha exp(-H)) lies in [0, threshold] (both >= 0, and alpha > 0 keeps
            # it a number where exp(-H) overflows): outside that interval q(x) decides the test
            # exactly, without the entropy pass over the row
            if not (q_x > threshold and alpha > 0.0):
                if not (q_x > 0.0 and _typical_accepts(q, q_x, eps, threshold, alpha, terms, terms32)):
                    break
            n += 1
        qr = target_rows[b, n]
        recovered = -1
        if qr >= 0:
            arg = _argmax_clean(target[qr])
            if _clean(np.float32(target[qr, arg])) > _F0:
                recovered = arg
        _write(out, b, draft_ids, n, _final(recovered, n < kb, bonus[b], V), kb)
        if count:
            _count(out, b, counts)


# --- Padded fp32 calls read in place ----------------------------------------------------------
# The common call (padded fp32 probabilities, spec_samplers.cpu._in_place) passes its tensors'
# addresses, not numpy views: ``Tensor.numpy()`` costs ~0.6 us a tensor (five a call) where
# ``data_ptr()`` costs ~0.05 us, and at B = 1 the host work around a ~25 us kernel is what the call
# costs beyond its read floor. The caller guarantees what a numpy view would: each address is that
# of a live, contiguous CPU tensor of the dtype read here, without a negative bit, holding the
# stated shape (B >= 1, and K >= 1 where there are draft rows); 0 marks an absent tensor.


@intrinsic
def _void_pointer(typingctx, address):
    """An int64 address as a ``void*`` (what ``numba.carray`` takes)."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return types.voidptr(types.int64), codegen


@njit(cache=True, inline="always")
def _padded_maps(B, K):
    """(target_rows [B, K+1], draft_rows [B, K], num_draft [B]) int64 of the padded layout
    (RowLayout.maps): request b's rows b (K+1) + i and b K + i, K drafts each."""
    target_rows = np.arange(B * (K + 1)).reshape(B, K + 1)
    draft_rows = np.arange(B * K).reshape(B, K)
    return target_rows, draft_rows, np.full(B, K, dtype=np.int64)


@njit(cache=True, inline="always")
def _padded_chain(kernel, target, draft, draft_ids, bonus, is_greedy, seeds, offsets, B, K, V, out, counts, count):
    """``kernel`` (rejection_kernel or block_kernel) on the padded call at these addresses:
    target [B (K+1), V] fp32, draft [B K, V] fp32 (0: point-mass drafts), draft_ids [B, K] int64,
    bonus [B] int64, is_greedy [B] bool (0: none), seeds [B] int64 (read as uint64), offsets
    [B] int64 (0: zeros)."""
    q = carray(_void_pointer(target), (B * (K + 1), V), np.float32)
    # point-mass drafts: a target row stands in for the draft rows (never read), as in _Rows
    p = carray(_void_pointer(draft if draft != 0 else target), (B * K if draft != 0 else 1, V), np.float32)
    ids = carray(_void_pointer(draft_ids), (B, K), np.int64)
    greedy = np.zeros(B, dtype=np.bool_)
    if is_greedy != 0:
        greedy = carray(_void_pointer(is_greedy), (B,), np.bool_)
    off = np.zeros(B, dtype=np.uint64)
    if offsets != 0:
        off = carray(_void_pointer(offsets), (B,), np.uint64)
    target_rows, draft_rows, num_draft = _padded_maps(B, K)
    kernel(
        q, target_rows, p, draft_rows, draft != 0, ids, num_draft, carray(_void_pointer(bonus), (B,), np.int64),
        greedy, is_greedy != 0, carray(_void_pointer(seeds), (B,), np.uint64), off, out, counts, count,
    )  # fmt: skip


@njit(cache=True)
def rejection_padded(target, draft, draft_ids, bonus, is_greedy, seeds, offsets, B, K, V, out, counts, count):
    """:func:`rejection_kernel` on a padded fp32 call's addresses (:func:`_padded_chain`)."""
    _padded_chain(
        rejection_kernel, target, draft, draft_ids, bonus, is_greedy, seeds, offsets, B, K, V, out, counts, count
    )


@njit(cache=True)
def block_padded(target, draft, draft_ids, bonus, is_greedy, seeds, offsets, B, K, V, out, counts, count):
    """:func:`block_kernel` on a padded fp32 call's addresses (:func:`_padded_chain`)."""
    _padded_chain(block_kernel, target, draft, draft_ids, bonus, is_greedy, seeds, offsets, B, K, V, out, counts, count)


@njit(cache=True)
def typical_padded(target, draft_ids, bonus, B, K, V, eps, threshold, alpha, out, counts, count):
    """:func:`typical_kernel` on a padded fp32 call's addresses: target [B (K+1), V] fp32,
    draft_ids [B, K] int64, bonus [B] int64."""
    q = carray(_void_pointer(target), (B * (K + 1), V), np.float32)
    ids = carray(_void_pointer(draft_ids), (B, K), np.int64)
    target_rows, _, num_draft = _padded_maps(B, K)
    typical_kernel(
        q, target_rows, ids, num_draft, carray(_void_pointer(bonus), (B,), np.int64), eps, threshold, alpha,
        out, counts, count,
    )  # fmt: skip
