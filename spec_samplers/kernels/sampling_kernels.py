"""Triton kernels of the FlashInfer-compatible sampling operations (:mod:`spec_samplers.sampling`).

Semantics are those of :mod:`spec_samplers.sampling.reference`, which sorts; these kernels never
sort. Every filter keeps the values >= a per-row threshold tau, and tau is found by a pivot search
that ends on the exact row value the reference picks:

* keys: fp32 values map to int keys monotonically (sign-flipped bit patterns), so the interval
  [lo, hi] of candidate thresholds can be cut evenly in key space whatever the scale;
* one pass evaluates PIVOTS pivots at once: for each, the count and the fixed-point mass of the
  values strictly above it, and the nearest row values on either side. The pivots' test is
  monotone, so the first pivot that passes brackets tau between two *row values*; lo and hi are
  always row values, and the search ends when they meet (at most MAX_PASSES passes: each pass
  divides the key width by PIVOTS + 1 and 17**8 > 2**32);
* masses are int64 fixed point (``constants.SAMPLING_MASS_BITS``), so a sum does not depend on
  the order the vocabulary is visited in: the kernel and the reference compare the same integers;
* only the first pass reads the row: it copies the values in [lo, hi] to a scratch row (when at
  most ``cap`` of them), and the later passes read those candidates plus the count and mass of
  the values above hi (the same sums, over a fraction of the row).

Kernels (launchers in :mod:`spec_samplers.kernels.sampling_launch`):

Tokens are drawn by the package's two-level race (:func:`spec_samplers.rng.two_level_race`) on
the Philox sampling stream, with the helpers the verification kernels use
(:mod:`spec_samplers.kernels.rng`).

``stats_kernel`` grid (B, NB): per vocabulary block, the max of the cleaned logits (and for
softmax the online sum of exp). ``thresholds_kernel`` grid (B,): one output row's threshold, its
row max and min, then the pivot search of each filter (top-k by count, top-p by mass) and min-p,
looping over its row; it normalises the per-request parameters as given (tensors of any real
dtype, or scalars) in its prologue. ``race_kernel``
grid (B, NB): per block, the fp64 race-group sums of the kept weights; ``race_finalize_kernel``
grid (B,): the race over those sums, then within the chosen group, and the row's validity.
``renorm_kernel``, ``mask_kernel``, ``softmax_kernel`` grid (B, NB): the elementwise outputs
(``softmax_kernel`` combines the row's statistics partials itself). NB > 1 splits the vocabulary
at small B; the kernels that read stats_kernel's block partials combine them themselves.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_samplers import rng
from spec_samplers.constants import FLOAT32_MAX, SAMPLING_MASS_BITS
from spec_samplers.kernels import rejection_kernels as rk
from spec_samplers.kernels import verify_kernels as vk
from spec_samplers.kernels.backend import MAX_VOCAB_BLOCKS
from spec_samplers.kernels.common import (
    clean,
    load_q,
    logits_rule,
    logits_scale,
    request_span,
    row_offset,
    rule_max,
    weights,
)
from spec_samplers.kernels.rng import group_tile, pick_group, precise_exp, race_in_group, random_words
from spec_samplers.kernels.softmax_kernels import row_partials
from spec_samplers.rng import STREAM_ROW_SEED, STREAM_SAMPLE

_MASS_SCALE = tl.constexpr(float(2**SAMPLING_MASS_BITS))
_FLOAT32_MAX = tl.constexpr(FLOAT32_MAX)
_STREAM_SAMPLE = tl.constexpr(STREAM_SAMPLE)
_STREAM_ROW_SEED = tl.constexpr(STREAM_ROW_SEED)
_RACE_GROUP = tl.constexpr(rng.RACE_GROUP)
#: the widest [NB] tile of block partials (one compiled width, whatever NB the batch size gives)
_MAX_NB = tl.constexpr(MAX_VOCAB_BLOCKS)
#: pivots evaluated per pass of the search (a power of two: one tile axis)
PIVOTS = 16
#: passes that always suffice: each divides the key width (< 2**32) by PIVOTS + 1
MAX_PASSES = 8
#: vector width of the search passes, whose tiles are [PIVOTS, SEARCH_BLOCK_V]
SEARCH_BLOCK_V = 256
#: candidates a search may copy to its scratch row (fp32 entries per row; pivot_search), and the
#: most scratch entries one launch allocates (a large batch gets shorter rows)
SEARCH_SCRATCH = 8192
SEARCH_SCRATCH_TOTAL = 2**22
#: warps of the search kernels: one program per row, whose pivot passes keep [PIVOTS,
#: SEARCH_BLOCK_V] per-lane sums (128 registers a thread at 8 warps, no spills on sm_90)
SEARCH_WARPS = 8
_PIVOTS = tl.constexpr(PIVOTS)
_MAX_PASSES = tl.constexpr(MAX_PASSES)
#: search modes: top-k (count of the values above < k) and top-p (mass above < top_p * total)
MODE_COUNT = 0
MODE_MASS = 1


def search_block(vocab_size: int) -> int:
    """BLOCK_V of the pivot-search kernels (a power of two in [16, SEARCH_BLOCK_V])."""
    return max(16, min(SEARCH_BLOCK_V, triton.next_power_of_2(vocab_size)))


def search_scratch(num_searches: int, vocab_size: int) -> int:
    """Scratch entries per search (``cap`` of :func:`pivot_search`): a row's candidates fit when
    there are at most this many; read at call time, so a test can shrink it."""
    return max(1, min(SEARCH_SCRATCH, vocab_size, SEARCH_SCRATCH_TOTAL // max(num_searches, 1)))


# ---------------------------------------------------------------------------------------------
# Element helpers (mirrors of spec_samplers.sampling.reference).


@triton.jit
def load_values(ptr, offs, mask, LOGITS: tl.constexpr):
    """Cleaned fp32 values: probabilities as ``common.clean``; logits with NaN -> -inf, +inf ->
    the largest finite fp32, -0.0 -> +0.0. Masked lanes are 0 (probs) or -inf (logits)."""
    if LOGITS:
        x = tl.load(ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
        x = tl.where(x == x, x, float("-inf"))
        return tl.minimum(x, _FLOAT32_MAX) + 0.0
    else:
        return clean(tl.load(ptr + offs, mask=mask, other=0.0))


@triton.jit
def load_row_values(ptr, offs, mask, s_max, s_scale, LOGITS: tl.constexpr, SCALED: tl.constexpr, PRECISE: tl.constexpr):
    """:func:`load_values`, or with SCALED the verification samplers' weights of logits,
    e = exp((x - max) / T) (``common.weights`` with the rule's m = ``s_max`` and c = ``s_scale``,
    1 at the row max; masked lanes 0): the values their per-request filters compare
    (``filtered_softmax_reference``)."""
    if SCALED:
        x = tl.load(ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
        x = tl.maximum(x, float("-inf"))  # NaN -> -inf; masked lanes read -inf and weigh 0
        return weights(x, s_max, s_scale, PRECISE)
    else:
        return load_values(ptr, offs, mask, LOGITS)


@triton.jit
def weights_of(v, m_ref, LOGITS: tl.constexpr, PRECISE: tl.constexpr):
    """Race and mass weights: the probabilities, or exp(x - row max) of logits."""
    if LOGITS:
        return precise_exp(v - m_ref, PRECISE)
    else:
        return v


@triton.jit
def fixed_mass(w):
    """int64 fixed-point units round(min(w, 1) * 2**SAMPLING_MASS_BITS) (w >= 0)."""
    return (tl.minimum(w, 1.0) * _MASS_SCALE + 0.5).to(tl.int64)


@triton.jit
def to_key(v):
    """Monotone int64 key of fp32 values (no NaN, no -0.0): a > b iff key(a) > key(b)."""
    bits = v.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def from_key(key):
    """Inverse of :func:`to_key`."""
    k = key.to(tl.int32)
    return tl.where(k >= 0, k, k ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def round_to_output(x, out_ptr):
    """fp32 -> the output's dtype, rounding to nearest even (as torch's .to()). bf16 is rounded on
    the bit pattern: the interpreter truncates a plain cast (finite x only)."""
    if out_ptr.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(out_ptr.dtype.element_ty)


@triton.jit
def output_row(rows_ptr, b, R):
    """(input row of output b, clamped into [0, R), whether it exists); without ``rows_ptr``
    (None: the outputs are the input rows) row b itself."""
    r = b.to(tl.int64)
    ok = r < R
    if rows_ptr is not None:
        r = tl.load(rows_ptr + b).to(tl.int64)
        ok = (r >= 0) & (r < R)
        r = tl.where(ok, r, 0)
    return r, ok


@triton.jit
def row_block(rows_ptr, R, V, chunk):
    """(output row b, its input row (clamped), vocab range [lo, hi) of this program's block; empty
    when the input row does not exist) of a (B, NB) grid."""
    b = tl.program_id(0)
    r, ok = output_row(rows_ptr, b, R)
    lo = tl.program_id(1) * chunk
    return b, r, lo, tl.where(ok, tl.minimum(lo + chunk, V), lo)


@triton.jit
def output_block(chunk, V):
    """(row b (int64), vocab range [lo, hi)) of this program of a (B, NB) elementwise grid."""
    lo = tl.program_id(1) * chunk
    return tl.program_id(0).to(tl.int64), lo, tl.minimum(lo + chunk, V)


@triton.jit
def row_max_ref(max_ptr, b, NB):
    """Row max for the logits' weights exp(x - max) (0 when the row is all -inf), combined from
    the row's NB partials ([B, NB]: stats_kernel's blocks, or NB = 1: thresholds_kernel's max)."""
    blocks = tl.arange(0, _MAX_NB)
    m = tl.max(tl.load(max_ptr + b * NB + blocks, mask=blocks < NB, other=float("-inf")), axis=0)
    return tl.where(m > float("-inf"), m, 0.0)


# The per-request parameters as the caller gave them (a [B] tensor of any real dtype, read as
# FlashInfer reads it, or a Python scalar already canonical): normalised here, in the kernels'
# prologue, so that a call runs no eager op on them (validation documents the rules).


@triton.jit
def top_k_param(k_ptr, k_val, b, V):
    """Row b's top_k as int64, 0 = off (<= 0 or >= V); a floating tensor truncates toward zero
    with NaN -> 0 and +-inf clamped (``checks.canonical_top_k``)."""
    k = tl.zeros([], tl.int64) + k_val
    if k_ptr is not None:
        raw = tl.load(k_ptr + b)
        if raw.dtype.is_floating():
            kf = raw.to(tl.float64)
            kf = tl.minimum(tl.maximum(tl.where(kf == kf, kf, 0.0), -1.0), V + 0.0)
            k = kf.to(tl.int64)
        else:
            k = raw.to(tl.int64)
    return tl.where((k <= 0) | (k >= V), 0, k)


@triton.jit
def top_p_param(p_ptr, p_val, b):
    """Row b's top_p as fp32; NaN and values > 1 keep every token (``checks.canonical_top_p``)."""
    p = tl.zeros([], tl.float32) + p_val
    if p_ptr is not None:
        p = tl.load(p_ptr + b).to(tl.float32)
    return tl.where(p <= 1.0, p, 1.0)


@triton.jit
def min_p_param(m_ptr, m_val, b):
    """Row b's min_p as fp32; NaN counts as 0 (``checks.canonical_min_p``)."""
    m = tl.zeros([], tl.float32) + m_val
    if m_ptr is not None:
        m = tl.load(m_ptr + b).to(tl.float32)
    return tl.where(m == m, m, 0.0)


@triton.jit
def temperature_param(t_ptr, t_val, b):
    """Row b's temperature as fp32; values not finite or negative act as 1
    (``checks.canonical_temperature``; 0 stays 0: the one-hot of the argmax)."""
    t = tl.zeros([], tl.float32) + t_val
    if t_ptr is not None:
        t = tl.load(t_ptr + b).to(tl.float32)
    return tl.where((t >= 0.0) & (t < float("inf")), t, 1.0)


@triton.jit
def row_seed(seed, offset, r):
    """Row r's seed derived from a batch's (seed, offset): words (0, 1) of (seed, offset,
    counter r) on STREAM_ROW_SEED, as one int64 (:func:`spec_samplers.rng.derive_row_seeds`)."""
    w0, w1, _, _ = random_words(seed, offset, r.to(tl.int64), _STREAM_ROW_SEED)
    return ((w1.to(tl.uint64) << 32) | w0.to(tl.uint64)).to(tl.int64, bitcast=True)


@triton.jit
def row_randomness(
    seed_ptr,
    seed_val,
    offset_ptr,
    offset_val,
    r,
    SEED_STRIDE: tl.constexpr,
    OFFSET_STRIDE: tl.constexpr,
    DERIVE: tl.constexpr,
):
    """(seed, offset) int64 of row r from a call's randomness as ``validation.kernel_seeds`` gives
    it: [B] tensors (stride 1) or one value for the batch ([1] tensor, stride 0, or ``*_val``
    without a pointer); with DERIVE the seed is the batch's, row r's own derives from it, at
    offset 0 when the offsets are per row (``validation.resolve_seeds``)."""
    seed = tl.zeros(r.shape, tl.int64) + seed_val
    if seed_ptr is not None:
        seed = tl.load(seed_ptr + r * SEED_STRIDE).to(tl.int64)
    offset = tl.zeros(r.shape, tl.int64) + offset_val
    if offset_ptr is not None:
        offset = tl.load(offset_ptr + r * OFFSET_STRIDE).to(tl.int64)
    if DERIVE:
        seed = row_seed(seed, offset * (1 - OFFSET_STRIDE), r)
    return seed, offset


# ---------------------------------------------------------------------------------------------
# Row statistics.


# R (number of input rows) and chunk / NB (vocabulary split, chosen from B) change from one
# engine step to the next: not specialising on them keeps the compiled variants bounded.
@triton.jit(do_not_specialize=["R", "chunk", "NB", "temp_val"])
def stats_kernel(
    x_ptr,
    stride_r,  # [R, V] fp32/fp16/bf16, vocab stride 1
    rows_ptr,  # [B] int32/int64 input row of each output (None: row b)
    temp_ptr,  # [B] softmax temperature (SOFTMAX only; <= 0 acts as 1), any real dtype
    temp_val,  # the temperature of every row when temp_ptr is None
    max_ptr,
    sum_ptr,  # [B, NB] fp32 partials (sum: SOFTMAX only)
    amax_ptr,  # [B, NB] int32 partial argmax of the values (SOFTMAX only: the T = 0 one-hot)
    R,
    V,
    chunk,
    NB,
    SOFTMAX: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    b, r, lo, hi = row_block(rows_ptr, R, V, chunk)
    slot = b * NB + tl.program_id(1)
    if SOFTMAX:
        # the verification samplers' softmax (one rule for the package): max of x, sum of exp((x - max) / T)
        t = temperature_param(temp_ptr, temp_val, b)
        m, s, _, best_idx = row_partials(x_ptr, r * stride_r, lo, hi, tl.where(t > 0.0, t, 1.0), BLOCK_V)
        tl.store(max_ptr + slot, m)
        tl.store(sum_ptr + slot, s)
        tl.store(amax_ptr + slot, best_idx.to(tl.int32))
    else:
        # the race's reference max of unfiltered logits (filters: thresholds_kernel's)
        vmax = float("-inf")
        for start in range(lo, hi, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            v = load_values(x_ptr + r * stride_r, offs, offs < hi, True)
            vmax = tl.maximum(vmax, tl.max(tl.where(offs < hi, v, float("-inf")), axis=0))
        tl.store(max_ptr + slot, vmax)


# ---------------------------------------------------------------------------------------------
# Pivot search.


@triton.jit
def _pick(vec, lanes, idx):
    """vec[idx] for a scalar idx (0 when idx is outside the lanes)."""
    return tl.sum(tl.where(lanes == idx, vec, 0), axis=0)


@triton.jit
def _compact(
    base,
    V,
    lo,
    hi,
    scratch,
    cap,
    m_ref,
    s_max,
    s_scale,
    LOGITS: tl.constexpr,
    SCALED: tl.constexpr,
    TRACK_MASS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """One pass over the row that copies its values in [lo, hi] to ``scratch`` (in row order,
    while they fit in ``cap``). Returns (n: how many there are, count and mass of the values
    > hi, mass of the values >= lo): the constants that let a pivot pass read the n candidates
    in place of the row."""
    tl.debug_barrier()  # the previous pass's reads of the scratch row are done
    # wider steps than the pivot passes': the prefix sum across the program's warps is paid per step
    STEP: tl.constexpr = 4 * BLOCK_V
    n = tl.zeros([], tl.int32)  # the one total needed every step (where the next copies go)
    c_above = tl.zeros([STEP], tl.int32)  # per-lane sums, reduced after the loop
    m_above = tl.zeros([STEP], tl.int64)
    m_lo = tl.zeros([STEP], tl.int64)
    for start in range(0, V, STEP):
        offs = start + tl.arange(0, STEP)
        mask = offs < V
        v = load_row_values(base, offs, mask, s_max, s_scale, LOGITS, SCALED, PRECISE)
        above = mask & (v > hi)
        inside = mask & (v >= lo) & (v <= hi)
        rank = tl.cumsum(inside.to(tl.int32), axis=0)
        pos = n + rank - 1
        tl.store(scratch + pos, v, mask=inside & (pos < cap))
        n += tl.max(rank, axis=0)
        c_above += above.to(tl.int32)
        if TRACK_MASS:
            units = fixed_mass(weights_of(v, m_ref, LOGITS, PRECISE))
            m_above += tl.where(above, units, 0)
            m_lo += tl.where(mask & (v >= lo), units, 0)  # (also when lo > hi: a missing row's +inf)
    tl.debug_barrier()  # the candidates are visible to every thread of the program
    return n, tl.sum(c_above, axis=0), tl.sum(m_above, axis=0), tl.sum(m_lo, axis=0)


@triton.jit
def _pivot_pass(
    src,
    n,
    piv,
    c0,
    m0,
    m_ref,
    s_max,
    s_scale,
    FROM_ROW: tl.constexpr,
    MODE: tl.constexpr,
    LOGITS: tl.constexpr,
    SCALED: tl.constexpr,
    TRACK_MASS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Per pivot: count and mass of the values > it, the largest value <= it and the smallest
    value > it, over src[0:n]: the row (FROM_ROW), or the scratch candidates, whose values
    above the interval are the constants c0 (count) and m0 (mass)."""
    # Per-lane accumulators, reduced once after the loop: a reduction per step (four across the
    # program's warps) cost more than the comparisons. A quarter of BLOCK_V a step keeps them in
    # registers.
    STEP: tl.constexpr = BLOCK_V
    count = tl.zeros([_PIVOTS, STEP], tl.int32)
    mass = tl.zeros([_PIVOTS, STEP], tl.int64)
    below = tl.full([_PIVOTS, STEP], float("-inf"), tl.float32)  # max value <= pivot
    above = tl.full([_PIVOTS, STEP], float("inf"), tl.float32)  # min value > pivot
    for start in range(0, n, STEP):
        offs = start + tl.arange(0, STEP)
        mask = offs < n
        if FROM_ROW:
            v = load_row_values(src, offs, mask, s_max, s_scale, LOGITS, SCALED, PRECISE)
        else:
            v = tl.load(src + offs, mask=mask, other=0.0)
        gt = (v[None, :] > piv[:, None]) & mask[None, :]  # [PIVOTS, STEP]
        le = (v[None, :] <= piv[:, None]) & mask[None, :]
        if MODE == 0:
            count += gt.to(tl.int32)
        if TRACK_MASS:
            units = fixed_mass(weights_of(v, m_ref, LOGITS, PRECISE))
            mass += tl.where(gt, units[None, :], 0)
        below = tl.maximum(below, tl.where(le, v[None, :], float("-inf")))
        above = tl.minimum(above, tl.where(gt, v[None, :], float("inf")))
    count_gt = tl.sum(count, axis=1) + c0
    mass_gt = tl.sum(mass, axis=1) + m0
    return count_gt, mass_gt, tl.max(below, axis=1), tl.min(above, axis=1)


@triton.jit
def pivot_search(
    base,
    V,
    lo,
    hi,
    k,
    top_p,
    m_ref,
    s_max,
    s_scale,
    scratch,
    cap,
    MODE: tl.constexpr,
    LOGITS: tl.constexpr,
    SCALED: tl.constexpr,
    TRACK_MASS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """tau of one filter on the row at ``base``: the smallest row value v >= lo with
    MODE_COUNT: #(values > v) < k; MODE_MASS: M(> v) < top_p * M(>= lo) or M(> v) = 0.
    Returns (lo, hi, mass of the values >= lo (TRACK_MASS)): the search ends with lo >= hi and
    lo = tau (a row value, or the starting lo when every value >= it is kept: the same kept set).
    hi starts at the row max (hi = lo: the filter is off).

    A first pass copies the row's values in [lo, hi] to ``scratch`` ([cap] fp32); when they fit,
    every pivot pass reads them (plus the count and mass of the values above hi) instead of the
    row: the result is the same, for a fraction of the work. When they do not, a pass reads the
    row and the candidates of the narrower interval are copied again."""
    if MODE == 1:
        hi = tl.where(top_p >= 1.0, lo, hi)
    n = tl.zeros([], tl.int32) + V
    c_above = tl.zeros([], tl.int32)
    m_above = tl.zeros([], tl.int64)
    m_lo = tl.zeros([], tl.int64)
    if TRACK_MASS:
        # (a missing row has lo = +inf: mass 0, and the loop below never runs)
        n, c_above, m_above, m_lo = _compact(
            base, V, lo, hi, scratch, cap, m_ref, s_max, s_scale, LOGITS, SCALED, TRACK_MASS, BLOCK_V, PRECISE
        )
    elif (lo < hi) & (V <= cap):
        # (without the mass, a count search starts with a pass over the row when the row may not
        # fit: its lo is the row's smallest value, so every value is a candidate)
        n, c_above, m_above, m_lo = _compact(
            base, V, lo, hi, scratch, cap, m_ref, s_max, s_scale, LOGITS, SCALED, TRACK_MASS, BLOCK_V, PRECISE
        )
    thr = tl.zeros([], tl.float64)
    if MODE == 1:
        thr = top_p.to(tl.float64) * m_lo.to(tl.float64)
    lanes = tl.arange(0, _PIVOTS)
    for _ in range(_MAX_PASSES):
        if lo < hi:
            key_lo = to_key(lo)
            width = to_key(hi) - key_lo
            piv = from_key(key_lo + ((lanes + 1).to(tl.int64) * width) // (_PIVOTS + 1))  # [PIVOTS] ascending
            fits = n <= cap
            if fits:
                count, mass, below, above = _pivot_pass(
                    scratch, n, piv, c_above, m_above, m_ref, s_max, s_scale, False,
                    MODE, LOGITS, SCALED, TRACK_MASS, BLOCK_V, PRECISE,
                )  # fmt: skip
            else:
                count, mass, below, above = _pivot_pass(
                    base, V, piv, 0, 0, m_ref, s_max, s_scale, True,
                    MODE, LOGITS, SCALED, TRACK_MASS, BLOCK_V, PRECISE,
                )  # fmt: skip
            if MODE == 0:
                passes = count < k
            else:
                passes = (mass == 0) | (mass.to(tl.float64) < thr)
            # The test is monotone in the pivot: the first pivot that passes brackets tau.
            first = tl.min(tl.where(passes, lanes, _PIVOTS), axis=0)
            hi = tl.where(first < _PIVOTS, _pick(below, lanes, first), hi)
            if TRACK_MASS:
                m_lo = tl.where(first > 0, _pick(mass, lanes, first - 1), m_lo)
            lo = tl.where(first > 0, _pick(above, lanes, first - 1), lo)
            if n > cap:
                if lo < hi:
                    n, c_above, m_above, m_recount = _compact(
                        base, V, lo, hi, scratch, cap, m_ref, s_max, s_scale, LOGITS, SCALED, TRACK_MASS, BLOCK_V,
                        PRECISE,
                    )  # fmt: skip
    return lo, hi, m_lo


# R (input rows) and cap follow the batch; the scalar parameters change per call: none is
# specialised on, so a serving engine compiles one variant per filter set.
@triton.jit(do_not_specialize=["R", "cap", "k_val", "p_val", "m_val"])
def thresholds_kernel(
    x_ptr,
    stride_r,  # [R, V] fp32/fp16/bf16, vocab stride 1
    rows_ptr,  # [B] int32/int64 input row of each output (None: row b)
    k_ptr,  # [B] top_k, any real dtype (TOP_K; None: k_val, canonical, for every row)
    k_val,
    p_ptr,  # [B] top_p, any real dtype (TOP_P; None: p_val)
    p_val,
    m_ptr,  # [B] min_p, any real dtype (MIN_P; None: m_val)
    m_val,
    tau_ptr,  # [B] fp32 out: keep the values >= tau
    max_ptr,  # [B] fp32 out: the row max (-inf for a missing row)
    mass_ptr,  # [B] int64 out (TRACK_MASS): mass of the values >= tau
    scratch_ptr,  # [B, cap] fp32: the searches' candidates (pivot_search)
    R,
    V,
    cap,
    TOP_K: tl.constexpr,
    TOP_P: tl.constexpr,
    MIN_P: tl.constexpr,
    JOINT: tl.constexpr,  # top-p searches from the row min, not from top-k's tau
    LOGITS: tl.constexpr,
    TRACK_MASS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Output row b's threshold tau: its row max and min (one pass over the row), then the
    filters in order, each a :func:`pivot_search` from the row's [min, max]: top-k (by count),
    top-p (by mass; from top-k's tau unless JOINT), tau = the largest of theirs and of min-p's
    min(min_p * max, max). The kept mass is exact when top-p is the last filter or top-k the
    only one."""
    b = tl.program_id(0)
    r, ok = output_row(rows_ptr, b, R)
    base = x_ptr + r * stride_r
    # the row's max and min: a missing row reads nothing (max -inf, min +inf: nothing is kept)
    STEP: tl.constexpr = 4 * BLOCK_V
    vmax = tl.full([STEP], float("-inf"), tl.float32)
    vmin = tl.full([STEP], float("inf"), tl.float32)
    n_row = tl.where(ok, V, 0)
    for start in range(0, n_row, STEP):
        offs = start + tl.arange(0, STEP)
        v = load_values(base, offs, offs < n_row, LOGITS)
        vmax = tl.maximum(vmax, tl.where(offs < n_row, v, float("-inf")))
        vmin = tl.minimum(vmin, tl.where(offs < n_row, v, float("inf")))
    row_max = tl.max(vmax, axis=0)
    row_min = tl.min(vmin, axis=0)
    m_ref = 0.0
    if LOGITS:
        m_ref = tl.where(row_max > float("-inf"), row_max, 0.0)
    scratch = scratch_ptr + b.to(tl.int64) * cap
    tau = row_min  # every value is kept
    kept = tl.zeros([], tl.int64)
    if TOP_K:
        k = top_k_param(k_ptr, k_val, b, V)
        tau, _, kept = pivot_search(
            base, V, row_min, tl.where(k > 0, row_max, row_min), k, 1.0, m_ref, 0.0, 1.0, scratch, cap,
            0, LOGITS, False, TRACK_MASS and not TOP_P, BLOCK_V, PRECISE,
        )  # fmt: skip
    if TOP_P:
        lo = tau
        if JOINT:
            lo = row_min
        tau_p, _, kept = pivot_search(
            base, V, lo, row_max, 0, top_p_param(p_ptr, p_val, b), m_ref, 0.0, 1.0, scratch, cap,
            1, LOGITS, False, True, BLOCK_V, PRECISE,
        )  # fmt: skip
        tau = tl.maximum(tau, tau_p, propagate_nan=tl.PropagateNan.ALL)
    if MIN_P:
        floor = tl.minimum(min_p_param(m_ptr, m_val, b) * row_max, row_max, propagate_nan=tl.PropagateNan.ALL)
        tau = tl.maximum(tau, floor, propagate_nan=tl.PropagateNan.ALL)
    tl.store(tau_ptr + b, tau)
    tl.store(max_ptr + b, row_max)
    if TRACK_MASS:
        tl.store(mass_ptr + b, kept)


@triton.jit
def row_filter_cut(
    base, s_max, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b, scratch, cap, V,
    BLOCK_V: tl.constexpr, PRECISE: tl.constexpr,
):  # fmt: skip
    """(kept sum, cut) of the logits row at ``base`` (row max ``s_max``) under request b's
    temperature and filters: ``filtered_softmax_reference``'s threshold and fixed-point mass."""
    t = tl.load(temp_ptr + b).to(tl.float32)
    # the rule's per-row constants (common.logits_rule), once: no division per element
    c = logits_scale(tl.where(t > 0.0, t, 1.0))
    m_rule = rule_max(s_max)
    hi = tl.where(s_max > float("-inf"), 1.0, 0.0)  # e = 1 at the max; no mass: nothing to keep
    lo = hi * 0.0
    floor = tl.minimum(tl.load(min_p_ptr + b).to(tl.float32) * hi, hi)
    top_k = tl.load(top_k_ptr + b).to(tl.int64)
    tau_k, _, _ = pivot_search(
        base, V, lo, tl.where(top_k > 0, hi, lo), top_k, 1.0, 0.0, m_rule, c, scratch, cap,
        0, False, True, False, BLOCK_V, PRECISE,
    )  # fmt: skip
    cut, _, kept = pivot_search(
        base, V, tl.maximum(floor, tau_k), hi, top_k, tl.load(top_p_ptr + b).to(tl.float32), 0.0, m_rule, c,
        scratch, cap, 1, False, True, True, BLOCK_V, PRECISE,
    )  # fmt: skip
    return kept.to(tl.float32) * (1.0 / _MASS_SCALE), cut


@triton.jit
def _cut_row(
    x_ptr,
    stride_b,
    stride_k,
    cu_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    stats_ptr,
    scratch,  # this row's [cap] scratch
    b,
    i,
    K,
    num_rows,
    V,
    cap,
    RAGGED: tl.constexpr,
    BONUS_ROW: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Row (b, i) of one input (target or draft) of :func:`filter_cut_kernel`."""
    start, n = request_span(cu_ptr, b, K, num_rows, RAGGED)
    off, ok = row_offset(b, i, start, n, num_rows, stride_b, stride_k, RAGGED)
    if BONUS_ROW:
        exists = ok & (i <= n)
    else:
        exists = ok & (i < n)
    if exists:
        slot = (b * (K + 1) + i) * 3
        kept_sum, cut = row_filter_cut(
            x_ptr + off, tl.load(stats_ptr + slot), temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b, scratch, cap, V,
            BLOCK_V, PRECISE,
        )  # fmt: skip
        tl.store(stats_ptr + slot + 1, kept_sum)
        tl.store(stats_ptr + slot + 2, cut)


# num_rows (T) follows the batch size, which changes every engine step: not specialised, so a new
# batch size reuses the compiled variant.
@triton.jit(do_not_specialize=["num_rows", "cap"])
def filter_cut_kernel(
    x_ptr,
    stride_b,
    stride_k,  # target logits [B, K+1, V] padded or [T, V] ragged, vocab stride 1
    d_ptr,
    d_stride_b,
    d_stride_k,  # draft logits [B, K, V] padded or [T, V] ragged (None: no draft rows)
    cu_ptr,  # [B] inclusive cumsum of k_b (ragged only)
    temp_ptr,  # [B] float, <= 0 acts as 1 (greedy requests are decided by the argmax)
    top_k_ptr,  # [B] int, 0 = off
    top_p_ptr,  # [B] float, 1 = off
    min_p_ptr,  # [B] float, 0 = off
    stats_ptr,  # [B, K+1, 3] fp32 (max, sum, cut) of the target rows: reads max, writes sum and cut
    d_stats_ptr,  # [B, K+1, 3] fp32 of the draft rows (with d_ptr)
    scratch_ptr,  # [2 or 1, B, K+1, cap] fp32: the searches' candidates (pivot_search)
    K,
    num_rows,
    V,
    cap,
    RAGGED: tl.constexpr,
    BONUS_ROW: tl.constexpr,  # the target has a bonus row (padded layout)
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Per-request filters of row (b, i) on the weights e = exp((x - max) / T): the cut (keep
    e >= cut; vLLM's order: min-p, top-k, top-p on the survivors) and the kept weights' sum,
    exactly ``filtered_softmax_reference``'s (fixed-point mass, so the sum is the same float).
    Grid (B, K+1, 2 with draft rows else 1): axis 2 picks the target's rows or the draft's, so
    one launch cuts both."""
    b = tl.program_id(0)
    i = tl.program_id(1)
    side = tl.program_id(2)
    scratch = scratch_ptr + ((side * tl.num_programs(0) + b) * (K + 1) + i).to(tl.int64) * cap
    if side == 0:
        _cut_row(
            x_ptr, stride_b, stride_k, cu_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, stats_ptr, scratch,
            b, i, K, num_rows, V, cap, RAGGED, BONUS_ROW, BLOCK_V, PRECISE,
        )  # fmt: skip
    else:
        if d_ptr is not None:
            _cut_row(
                d_ptr, d_stride_b, d_stride_k, cu_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, d_stats_ptr,
                scratch, b, i, K, num_rows, V, cap, RAGGED, False, BLOCK_V, PRECISE,
            )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Outputs.


@triton.jit
def kept_weights(base, offs, hi, tau, m_ref, LOGITS: tl.constexpr, PRECISE: tl.constexpr):
    """fp32 race weights at ``offs``: w of the kept values (>= tau) below ``hi``, else 0."""
    mask = offs < hi
    v = load_values(base, offs, mask, LOGITS)
    return tl.where(mask & (v >= tau), weights_of(v, m_ref, LOGITS, PRECISE), 0.0)


@triton.jit
def race_row(tau_ptr, max_ptr, max_nb, sums_ptr, b, V, LOGITS: tl.constexpr):
    """Output row b's threshold (-inf without ``tau_ptr``: unfiltered probabilities keep every
    token), reference max (logits, from its ``max_nb`` partials; 0 for probabilities), number of
    race groups and its row of fp64 group sums: what race_kernel and race_finalize_kernel both
    read."""
    tau = float("-inf")
    if tau_ptr is not None:
        tau = tl.load(tau_ptr + b)
    m_ref = 0.0
    if LOGITS:
        m_ref = row_max_ref(max_ptr, b, max_nb)
    num_groups = (V + _RACE_GROUP - 1) // _RACE_GROUP
    return tau, m_ref, num_groups, sums_ptr + b * num_groups


@triton.jit(do_not_specialize=["R", "chunk", "NB", "max_nb"])
def race_kernel(
    x_ptr,
    stride_r,  # [R, V] fp32/fp16/bf16
    rows_ptr,  # [B] int32/int64
    max_ptr,  # [B, max_nb] fp32 row max partials (LOGITS)
    max_nb,
    tau_ptr,  # [B] fp32: the kept tokens are the values >= tau (None: every token, probabilities)
    sums_ptr,  # [B, G1] fp64 race-group sums of the kept weights
    R,
    V,
    chunk,
    NB,
    LOGITS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Program (b, blk): the fp64 sums of the kept weights of each race group in vocab block
    blk (chunk a multiple of RACE_GROUP): level 1's input. No random numbers here."""
    b, r, lo, hi = row_block(rows_ptr, R, V, chunk)
    lo = tl.multiple_of(lo, _RACE_GROUP)  # chunk holds whole race groups: aligned, wide loads
    base = x_ptr + r * stride_r
    tau, m_ref, num_groups, row = race_row(tau_ptr, max_ptr, max_nb, sums_ptr, b, V, LOGITS)
    g_lo = lo // _RACE_GROUP
    # a missing input row (hi == lo) still writes zeros over its block's groups
    g_hi = tl.minimum((lo + chunk) // _RACE_GROUP, num_groups)
    if BLOCK_V >= _RACE_GROUP:
        tile = group_tile(BLOCK_V)
        for start in range(g_lo * _RACE_GROUP, g_hi * _RACE_GROUP, BLOCK_V):
            w = kept_weights(base, start + tile, hi, tau, m_ref, LOGITS, PRECISE)
            g = start // _RACE_GROUP + tl.arange(0, BLOCK_V // _RACE_GROUP)
            tl.store(row + g, tl.sum(w.to(tl.float64), axis=1), mask=g < g_hi)
    else:
        for g0 in range(g_lo, g_hi):
            acc = tl.zeros([BLOCK_V], tl.float64)
            for start in range(g0 * _RACE_GROUP, (g0 + 1) * _RACE_GROUP, BLOCK_V):
                acc += kept_weights(base, start + tl.arange(0, BLOCK_V), hi, tau, m_ref, LOGITS, PRECISE).to(tl.float64)
            tl.store(row + g0, tl.sum(acc, axis=0))


@triton.jit(do_not_specialize=["R", "max_nb", "seed_val", "offset_val"])
def race_finalize_kernel(
    x_ptr,
    stride_r,  # [R, V] fp32/fp16/bf16
    rows_ptr,  # [B] int32/int64
    max_ptr,  # [B, max_nb] fp32 row max partials (LOGITS)
    max_nb,
    tau_ptr,  # [B] fp32
    seed_ptr,  # [B] (SEED_STRIDE 1) or [1] int32/int64; None: seed_val
    seed_val,
    offset_ptr,  # [B] (OFFSET_STRIDE 1) or [1] int32/int64; None: offset_val
    offset_val,
    sums_ptr,  # [B, G1] fp64 from race_kernel
    out_ptr,  # [B] int32/int64 token, -1 where not valid
    valid_ptr,  # [B] bool: the input row exists and its kept weights have mass
    R,
    V,
    SEED_STRIDE: tl.constexpr,
    OFFSET_STRIDE: tl.constexpr,
    DERIVE: tl.constexpr,  # one seed for the batch: row b's own is derived from it (row_seed)
    LOGITS: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Program b: the two-level race (:func:`spec_samplers.rng.two_level_race`, stream
    STREAM_SAMPLE, counter base 0): level 1 over the group sums, level 2 over the chosen group,
    re-read, with the same helpers as the verification finalize. A row is valid when its kept
    mass is > 0: the row max is always kept, so this is the reference's test (a probability > 0,
    or a logit > -inf, whose weight is 1)."""
    b = tl.program_id(0)
    r, ok = output_row(rows_ptr, b, R)
    base = x_ptr + r * stride_r
    seed, offset = row_randomness(seed_ptr, seed_val, offset_ptr, offset_val, b, SEED_STRIDE, OFFSET_STRIDE, DERIVE)
    tau, m_ref, num_groups, row = race_row(tau_ptr, max_ptr, max_nb, sums_ptr, b, V, LOGITS)
    counter_base = seed * 0
    group, _, mass, _ = pick_group(row, row, num_groups, ok, seed, offset, counter_base, _STREAM_SAMPLE, PRECISE, 256)
    offs = group * _RACE_GROUP + tl.arange(0, _RACE_GROUP)
    w = kept_weights(base, offs, tl.where(ok, V, 0), tau, m_ref, LOGITS, PRECISE)
    idx = race_in_group(w, offs < V, seed, offset, counter_base, _STREAM_SAMPLE, PRECISE)
    valid = ok & (mass > 0.0)
    tl.store(out_ptr + b, tl.where(valid, group * _RACE_GROUP + idx, -1))
    tl.store(valid_ptr + b, valid)


@triton.jit(do_not_specialize=["chunk"])
def renorm_kernel(
    x_ptr,
    stride_r,  # [B, V] fp32/fp16/bf16 probabilities
    tau_ptr,  # [B] fp32
    mass_ptr,  # [B] int64 kept mass
    out_ptr,
    stride_o,  # [B, V] output dtype
    V,
    chunk,
    BLOCK_V: tl.constexpr,
):
    b, lo, hi = output_block(chunk, V)
    tau = tl.load(tau_ptr + b)
    denom = tl.load(mass_ptr + b).to(tl.float32) * (1.0 / _MASS_SCALE)
    safe = tl.where(denom > 0.0, denom, 1.0)
    for start in range(lo, hi, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < hi
        v = load_values(x_ptr + b * stride_r, offs, mask, False)
        # (a scalar & vector mask trips the interpreter: the row test folds into tau)
        out = tl.where(v >= tl.where(denom > 0.0, tau, float("inf")), tl.math.div_rn(v, safe), 0.0)
        tl.store(out_ptr + b * stride_o + offs, round_to_output(out, out_ptr), mask=mask)


@triton.jit(do_not_specialize=["chunk"])
def mask_kernel(
    x_ptr,
    stride_r,  # [B, V] fp32/fp16/bf16 logits
    tau_ptr,  # [B] fp32
    out_ptr,
    stride_o,  # [B, V] dtype of the logits
    V,
    chunk,
    BLOCK_V: tl.constexpr,
):
    b, lo, hi = output_block(chunk, V)
    tau = tl.load(tau_ptr + b)
    for start in range(lo, hi, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < hi
        x = tl.load(x_ptr + b * stride_r + offs, mask=mask, other=0.0)
        v = load_values(x_ptr + b * stride_r, offs, mask, True)
        # select in fp32 (exact for fp16/bf16 and back): Triton 3.8's interpreter cannot make a bf16
        # -inf constant (InterpreterBuilder has no get_bf16)
        out = tl.where((v >= tau) & (x == x), x.to(tl.float32), float("-inf"))
        tl.store(out_ptr + b * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["chunk", "NB", "temp_val"])
def softmax_kernel(
    x_ptr,
    stride_r,  # [B, V] fp32/fp16/bf16 logits
    temp_ptr,  # [B] any real dtype (0: one-hot of the argmax; see temperature_param); None: temp_val
    temp_val,
    max_ptr,
    sum_ptr,  # [B, NB] fp32 stats_kernel's block partials: max of x and sum of exp((x - max) / T)
    amax_ptr,  # [B, NB] int32 the blocks' argmax of the logits (used where T == 0)
    out_ptr,  # [B, V] fp32, contiguous
    V,
    chunk,
    NB,
    BLOCK_V: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Combines row b's NB block partials (each program of the row does, in block order: no
    launch between), then writes its block of softmax(x / T)."""
    b, lo, hi = output_block(chunk, V)
    t_raw = temperature_param(temp_ptr, temp_val, b)
    t = tl.where(t_raw > 0.0, t_raw, 1.0)
    blocks = tl.arange(0, _MAX_NB)
    inside = blocks < NB
    m = tl.load(max_ptr + b * NB + blocks, mask=inside, other=float("-inf"))
    row_max = tl.max(m, axis=0)
    # each block's sum weighs the rule's weight of its max (empty blocks and rows all -inf give 0)
    s = tl.load(sum_ptr + b * NB + blocks, mask=inside, other=0.0)
    s = tl.sum(tl.where(inside, s * weights(m, rule_max(row_max), logits_scale(t), PRECISE), 0.0), axis=0)
    # the argmax of the lowest block holding the max (torch.argmax's tie rule)
    first = tl.min(tl.where(inside & (m == row_max), blocks, _MAX_NB), axis=0)
    amax = tl.sum(tl.where(blocks == first, tl.load(amax_ptr + b * NB + blocks, mask=inside, other=0), 0), axis=0)
    rule = logits_rule(row_max, t, s, 0.0)
    for start in range(lo, hi, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < hi
        p = load_q(x_ptr + b * stride_r, offs, mask, rule, True, PRECISE)
        # (a row without mass has no argmax: -1 matches no lane; scalar & vector masks trip the interpreter)
        onehot = tl.where(offs == tl.where(s > 0.0, amax, -1), 1.0, 0.0)
        p = tl.where(t_raw == 0.0, onehot, p)
        tl.store(out_ptr + b * V + offs, p, mask=mask)


# num_rows and the scalar values follow the call: not specialised on.
@triton.jit(do_not_specialize=["num_rows", "seed_val", "offset_val"])
def row_seeds_kernel(
    seed_ptr,  # [B] (SEED_STRIDE 1) or [1] int32/int64; None: seed_val
    seed_val,
    offset_ptr,  # [B] (OFFSET_STRIDE 1) or [1] int32/int64; None: offset_val
    offset_val,
    out_ptr,  # [num_rows] int64 seeds
    offsets_out_ptr,  # [num_rows] int64 offsets, or None
    num_rows,
    SEED_STRIDE: tl.constexpr,
    OFFSET_STRIDE: tl.constexpr,
    DERIVE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Row r's (seed, offset) as the race's finalize reads them (:func:`row_randomness`; with
    DERIVE the seed is words (0, 1) of (seed, offset, counter r) on STREAM_ROW_SEED, as one int64:
    :func:`spec_samplers.rng.derive_row_seeds`), stored for kernels that read [B] tensors."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = r < num_rows
    safe = tl.where(mask, r, 0)
    seed, offset = row_randomness(seed_ptr, seed_val, offset_ptr, offset_val, safe, SEED_STRIDE, OFFSET_STRIDE, DERIVE)
    tl.store(out_ptr + r, seed, mask=mask)
    if offsets_out_ptr is not None:
        tl.store(offsets_out_ptr + r, offset, mask=mask)


# num_rows follows the batch size: not specialised on.
@triton.jit(do_not_specialize=["num_rows"])
def chain_counts_kernel(
    seqs,  # the rejection kernel's (kernels.abi.Seqs: target, draft, ids; padded)
    req,  # the rejection kernel's (kernels.abi.Request: seeds, offsets)
    out_ptr,  # [B, K+1] int64: the rejection kernel's output
    tokens_ptr,  # [B, K+1] int32: out_ptr converted
    accepted_ptr,  # [B] (stride_accepted) any numeric dtype: + (ADD_ACCEPTED) or = the independent accepts
    stride_accepted,
    emitted_ptr,  # [B] (stride_emitted): + (ADD_EMITTED) or = the emitted drafts
    stride_emitted,
    K,
    V,
    num_rows,
    BLOCK_K: tl.constexpr,  # >= K + 1
    ADD_ACCEPTED: tl.constexpr,
    ADD_EMITTED: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Program b: FlashInfer's counters of chain speculative sampling after the rejection kernel
    wrote row b: the drafts that pass the accept test each on its own (the rejection kernel's
    :func:`~spec_samplers.kernels.rejection_kernels.random_accepts`, the same random numbers:
    ``reference.rejection_accepts_reference``), and the emitted drafts (tokens in the row, less
    the final one); the row as int32."""
    rq = vk.open_request(req, K, V, num_rows)
    b = rq.b
    pos = tl.arange(0, BLOCK_K)
    accepted, _, _ = rk.random_accepts(rq, pos, seqs, False, PRECISE)
    num_accepted = tl.sum((accepted & (pos < K)).to(tl.int32), axis=0)
    in_row = pos < K + 1
    row = tl.load(out_ptr + b * (K + 1) + pos, mask=in_row, other=-1)
    tl.store(tokens_ptr + b * (K + 1) + pos, row.to(tl.int32), mask=in_row)
    num_emitted = tl.sum((row != -1).to(tl.int32), axis=0) - 1
    # one after the other: the two counters may be one tensor (each is then added)
    _count(accepted_ptr + b * stride_accepted, num_accepted, ADD_ACCEPTED)
    _count(emitted_ptr + b * stride_emitted, num_emitted, ADD_EMITTED)


@triton.jit
def _count(ptr, n, ADD: tl.constexpr):
    """*ptr += n (ADD) or *ptr = n, in the pointer's dtype."""
    if ADD:
        tl.store(ptr, tl.load(ptr) + n.to(ptr.dtype.element_ty))
    else:
        tl.store(ptr, n.to(ptr.dtype.element_ty))
