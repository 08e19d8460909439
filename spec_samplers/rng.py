"""Counter-based random numbers: Philox4x32-10 with the request seed as its 64-bit key.

This is the one generator every PyTorch path and every kernel of spec_samplers mirrors bit for
bit (``spec_samplers.kernels.rng`` is the Triton twin), so third-party kernels can reproduce our
streams: every random word is a pure function of (seed, offset, counter, stream), never of the
row index, batch neighbours or launch configuration.

Generator
---------
Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11;
the generator of cuRAND's ``curand_init(seed, subsequence, offset)`` family and of Triton's
``tl.rand``), checked against the published Random123 known-answer vectors. One call maps a
128-bit counter and a 64-bit key to four 32-bit words. :func:`random_words` fills them as::

    key     = (seed lo32, seed hi32)                          # the request seed, all 64 bits
    counter = (counter lo32,                                  # e.g. vocab index // 2
               (counter >> 32) & 0xFFFFFF | stream << 24,     # e.g. position, and the stream
               offset lo32, offset hi32)                      # the request's step offset

Nothing is XOR-folded: distinct (seed, offset, counter, stream) give distinct Philox inputs, and
Philox is a bijection of the counter for each key, so two requests share a word only if they
share the seed, the offset, the counter and the stream. ``counter`` must lie in [0, 2**56) and
``stream`` in [0, 256).

The streams (docs/design.md section 4), all numbered here so that no two uses share one:

* ``STREAM_ACCEPT``: counter = position i; words (0, 1) give the accept uniform of position i.
* ``STREAM_RECOVER``: the two-level race (below) of the recovery and bonus draws, counter base
  position * 2**32.
* ``STREAM_SAMPLE`` / ``STREAM_ROW_SEED``: the sampling operations (:func:`sample_race`,
  :func:`derive_row_seeds`, below).
* ``STREAM_DECODE_DRAFT`` / ``STREAM_DECODE_BONUS`` / ``STREAM_DECODE_STEP``: the decoding loop's
  draft tokens, bonus tokens and plain autoregressive steps (:mod:`spec_samplers.decoding`), laid
  out as ``STREAM_RECOVER`` (:func:`recovery_race` with ``stream=``).

Words become fp32 numbers through :func:`uniform_from_words` (64 bits, all that matter in fp32)
and :func:`exponential_from_words` (``-log1p(-u)``).

PyTorch has no uint32 arithmetic on every device, so words live in int64 tensors; each 32x32-bit
product is one int64 product whose low 64 bits are the exact unsigned product (two's complement
wrap, what PyTorch's CPU and CUDA integer kernels compute), split by an arithmetic shift and a
mask (:func:`_mulhilo`; tests compare it with :func:`mulhilo_split`, which never leaves
[0, 2**49)). The Triton mirror uses uint32 with ``tl.umulhi``.

Precision (stated as module constants below, checked by exact counting in tests/test_rng.py)
-----------------------------------------------------------------------------------------------
``u = uniform_from_words(a, b)`` is the 64-bit fixed-point number n * 2**-64 (n = a * 2**32 +
(b | 1)) rounded to fp32: three exactly representable pieces (24 + 24 + 16 bits) added smallest
first, so u is a monotone function of n, lies in [UNIFORM_MIN, UNIFORM_MAX] = [2**-64, 1 - 2**-24]
(clamped below 1) and for every fp32 x in (0, 1]::

    |P(u < x) - x| <= UNIFORM_CDF_REL_ERR * x + 2**-64          (UNIFORM_CDF_REL_ERR = 2**-23)

* Accept test: accept x_i iff u < q/p (fp32, correctly rounded division). P(accept) equals
  min(1, q/p) within 2**-22 relative + 2**-64 absolute, down to q/p = 1e-18 (the old 24-bit
  uniforms accepted q/p = 1e-9 58x too often). q >= p always accepts (u < 1 <= q/p), subnormal
  p included.
* Race: E = -log1p(-u) in [EXP_MIN, EXP_MAX] = [2**-64, 24 ln 2 = 16.64]. A token of weight w
  among competitors of total weight W' wins with probability E_M[P(E < w M)], M ~ Exp(W')
  (the competitors' min of E_j / w_j), so the race is exact up to (i) the CDF error of E at
  small arguments: P(E < x) = x (1 +- 2**-21) + 2**-64 for x >= 2**-40, i.e. relative error
  < RACE_TAIL_REL_ERR = 1e-6 for relative weights w / (w + W') >= 1e-12 (the issue's bar is 1%);
  (ii) the cap EXP_MAX, which moves P(E > 16.64) = 6e-8 of an exponential's mass and changes win
  probabilities by < 1e-6 relative; (iii) one rounding of each key (2**-24 relative).
  The old 24-bit exponentials capped at 16.6 and bottomed at 6e-8, so tokens below 3.6e-9 of
  the largest weight never won.
* Keys are w * (RACE_SCALE / E) with RACE_SCALE = 2**32 (one correctly rounded division per
  element, shared by every race over that element): every positive fp32 weight, subnormal
  ones included (2**-149 * 2**32 / 16.64 > 2**-126), gives a positive normal key, so a row
  whose only mass is subnormal still emits its supported token, and zero weights never win
  against positive ones. Keys stay finite for weights <= 2**31 (probabilities are <= 1).

The race: one rule for every draw
---------------------------------
:func:`two_level_race` samples a row of weights w (>= 0) in two levels (docs/design.md section 4):

1. level 1: the fp64 sums S_g of groups of RACE_GROUP consecutive entries race with keys
   S_g / E1_g (fp64), E1_g from counter base + LEVEL1_COUNTER + g // 2 (words (0, 1) for an even g,
   (2, 3) for an odd one): group g* wins with probability S_g / sum S;
2. level 2: the entries of group g* race with keys (w * RACE_SCALE) / E2_i, E2_i from counter
   base + i // 2 (i the index in the group, words as above), the same for every group: only one
   group is ever raced, and both levels come from ONE Philox evaluation (:func:`race_exponentials`)
   that needs no knowledge of g*.

Exact in law: level 2's numbers are independent of level 1's, so P(token) = S_g / sum S *
w / S_g. Precision: level 1 has the race's CDF error at fp64 keys (tail groups of relative weight
>= 1e-12 within RACE_TAIL_REL_ERR), level 2 the single-level race's inside the group.

Cost
----
One Philox call = 10 rounds x 2 (32 x 32 -> 64-bit) products = 40 32-bit multiplies and 20 XORs
for 4 words. A draw spends ceil(G1 / 2) + RACE_GROUP / 2 calls (G1 = ceil(V / RACE_GROUP)): 191
for V = 32000, 379 for V = 128256, against V / 2 for the single-level race of 0.2.

GPU: the kernels' vocabulary pass draws no random number at all (it stores fp64 group sums), so
it is bound by its bytes; the finalize spends the Philox calls above per request (one program).

CPU (PyTorch path, no compilation): Philox as int64 tensor ops over [N, ceil(G1 / 2) + 128]
(each 32 x 32-bit product is one int64 product, whose low 64 bits are exact in two's complement,
:func:`_mulhilo`; both multiply lanes of a round in one op, 6 ops a round, :func:`_philox_pairs`),
the group-sum reductions in cache-sized row chunks (:func:`row_chunk`) and one [N, RACE_GROUP]
gather; first call well under a second (``benchmarks/recovery_floor.py``).
"""

from __future__ import annotations

import math

import torch

from spec_samplers.constants import SEED_HIGH, input_error
from spec_samplers.validation import check_seed_tensor

MASK32 = 0xFFFFFFFF

#: Philox4x32 multipliers and Weyl key increments (Random123)
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10

#: counters lie in [0, 2**COUNTER_BITS); the stream takes the top 8 bits of counter word 1
COUNTER_BITS = 56
STREAM_BITS = 8

#: stream of the accept/reject uniforms (counter = position)
STREAM_ACCEPT = 0
#: stream of the exponentials of the recovery race (counter = position * 2**32 + vocab // 2)
STREAM_RECOVER = 1

#: the sampling operations' race (counter = vocab index // 2) and per-row seeds (counter = row)
STREAM_SAMPLE = 2
STREAM_ROW_SEED = 3
#: the decoding loop's draws (counters as STREAM_RECOVER)
STREAM_DECODE_DRAFT = 4
STREAM_DECODE_BONUS = 5
STREAM_DECODE_STEP = 6


# --- precision constants (see the module docstring; tests/test_rng.py checks each) -------------
#: random bits per accept uniform and per race exponential
ACCEPT_BITS = 64
RACE_BITS = 64
#: smallest and largest uniform
UNIFORM_MIN = 2.0**-64
UNIFORM_MAX = 1.0 - 2.0**-24
#: |P(u < x) - x| <= UNIFORM_CDF_REL_ERR * x + UNIFORM_MIN for fp32 x in (0, 1]
UNIFORM_CDF_REL_ERR = 2.0**-23
#: smallest and largest exponential (E = -log1p(-u))
EXP_MIN = 2.0**-64
EXP_MAX = 24 * math.log(2.0)
#: keys are weight * (RACE_SCALE / E): subnormal weights give normal keys
RACE_SCALE = 2.0**32
#: bound on the relative error of a race win probability, relative weights >= 1e-12
RACE_TAIL_REL_ERR = 1e-6

_TWO_POW_M24 = 2.0**-24
_TWO_POW_M48 = 2.0**-48
_TWO_POW_M64 = 2.0**-64


def split64(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) uint32 words of an int64 tensor (two's complement for negatives)."""
    v = v.to(torch.int64)
    return v & MASK32, (v >> 32) & MASK32


def _mulhilo(x: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit halves of m * x for x in [0, 2**32) held in int64, m a uint32 constant.

    One int64 product, whose low 64 bits are m * x (< 2**64) in two's complement: an arithmetic
    shift and a mask recover both halves (4 tensor ops, vectorised on every PyTorch backend).
    :func:`mulhilo_split` gives the same words without ever leaving [0, 2**63) (tests compare)."""
    p = x * m
    return (p >> 32) & MASK32, p & MASK32


def mulhilo_split(x: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_mulhilo` with m = mh * 2**16 + ml: m * x = (x * mh) * 2**16 + x * ml, each
    product < 2**48 (no intermediate overflows; 9 tensor ops)."""
    p_lo = x * (m & 0xFFFF)
    p_hi = x * (m >> 16)
    hi = (p_hi + (p_lo >> 16)) >> 16
    lo = (p_lo + ((p_hi & 0xFFFF) << 16)) & MASK32
    return hi, lo


def philox4x32(
    c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 on int64 tensors holding uint32 words (broadcastable).

    Returns the four output words (int64 in [0, 2**32)). Example (Random123 known answer)::

        >>> z = torch.zeros((), dtype=torch.int64)
        >>> [hex(int(w)) for w in philox4x32(z, z, z, z, z, z)]
        ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
    even, odd = _philox_pairs(c0, c1, c2, c3, k0, k1)
    return even[0], odd[0], even[1], odd[1]


def _philox_pairs(
    c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`philox4x32` as two stacked tensors [2, *shape]: (words 0 and 2, words 1 and 3).

    The two multiply lanes of a round run as ONE tensor op each (6 ops a round instead of 12:
    on the CPU a call over [N, ~200] counters costs its op count, not its arithmetic). Lane order
    alternates: even rounds hold (c0, c2) and multiply by (M0, M1), odd rounds (c2, c0) by
    (M1, M0), so a round is hi(P) ^ (previous P, lanes swapped) ^ round key, never a gather. The words that
    only feed an XOR (the previous products) keep their high 32 bits until the final mask: a
    product's low 32 bits are exact whatever a factor's high bits, and the multiplied words are
    masked every round."""
    # expanded views (torch.broadcast_shapes would import sympy on first use: 0.3 s)
    c0, c1, c2, c3, _, _ = torch.broadcast_tensors(*(t.to(torch.int64) for t in (c0, c1, c2, c3)), k0, k1)
    shape = c0.shape
    k0, k1 = (k.to(torch.int64).reshape((1,) * (len(shape) - k.dim()) + k.shape) for k in (k0, k1))
    x = torch.stack((c0, c2))  # the multiplied lanes, updated in place
    x_lanes = x.unbind(0)
    # the products, ping-ponged: a round's lane i is XORed into the next round's lane 1 - i
    prods = (torch.stack((c1, c3)), torch.empty_like(x))
    prod_lanes = tuple(p.unbind(0) for p in prods)
    # round keys: the Weyl sequence k + r * W (mod 2**32) for all rounds at once, stacked as
    # (k1, k0, k1): even rounds take lanes (k1, k0), odd rounds (k0, k1), both views
    mult_even, mult_odd, weyl = _philox_constants(c0.device)
    keys = (torch.stack((k1, k0, k1))[..., None] + weyl.view((3,) + (1,) * len(shape) + (PHILOX_ROUNDS,))) & MASK32
    round_keys = (keys[:2].unbind(-1), keys[1:].unbind(-1))  # [2, *key shape] per round
    lanes = (2,) + (1,) * len(shape)
    mult = (mult_even.view(lanes), mult_odd.view(lanes))
    for r in range(PHILOX_ROUNDS):  # six tensor ops a round, no allocation
        prev, cur = prod_lanes[r % 2], prods[(r + 1) % 2]
        torch.mul(x, mult[r % 2], out=cur)  # low 64 bits of the exact 32 x 32-bit products
        torch.bitwise_right_shift(cur, 32, out=x)
        x_lanes[0].bitwise_xor_(prev[1])  # two half ops: a flip would copy
        x_lanes[1].bitwise_xor_(prev[0])
        x.bitwise_xor_(round_keys[r % 2][r]).bitwise_and_(MASK32)
    # after an even number of rounds x = (c0, c2); the last (odd) round's products are
    # (lo p1, lo p0) = (c1, c3)
    return x, prods[PHILOX_ROUNDS % 2].bitwise_and_(MASK32)


def _philox_constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The multipliers of even rounds (M0, M1) and odd rounds (M1, M0), and the Weyl increments
    r * (W1, W0, W1) of rounds r = 0..9 ([3, 10]): made once on the CPU (where a call costs its
    op count), by kernels elsewhere (capturable in a CUDA graph; nothing cached across graphs)."""
    return _cpu_philox_constants() if device.type == "cpu" else _make_philox_constants(device)


def _make_philox_constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rounds = torch.arange(PHILOX_ROUNDS, dtype=torch.int64, device=device)
    weyl = torch.stack((rounds * PHILOX_W1, rounds * PHILOX_W0, rounds * PHILOX_W1))
    # (M0, M1; M1, M0) by fills: setting elements from Python ints would copy from the host
    mult = torch.full((2, 2), PHILOX_M1, dtype=torch.int64, device=device).fill_diagonal_(PHILOX_M0)
    return mult[0], mult[1], weyl


_CPU_PHILOX: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def _cpu_philox_constants() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    global _CPU_PHILOX
    if _CPU_PHILOX is not None:
        return _CPU_PHILOX
    consts = _make_philox_constants(torch.device("cpu"))
    # Made under a fake-tensor mode (the launch counters plan calls on fake tensors), they hold no
    # values: kept, they would give every later call garbage words. Keep only plain tensors.
    if all(type(c) is torch.Tensor for c in consts):
        _CPU_PHILOX = consts
    return consts


def _check_stream(stream: int) -> None:
    if not isinstance(stream, int) or not 0 <= stream < 2**STREAM_BITS:
        raise ValueError(f"stream: expected an int in [0, {2**STREAM_BITS}), got {stream!r}")


def philox_words(
    seed: torch.Tensor, offset: torch.Tensor, counter: torch.Tensor, stream: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`random_words` as a tuple of four int64 tensors (no stacking copy)."""
    even, odd = _philox_word_pairs(seed, offset, counter, stream)
    return even[0], odd[0], even[1], odd[1]


def _philox_word_pairs(
    seed: torch.Tensor, offset: torch.Tensor, counter: torch.Tensor, stream: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`random_words` as (words 0 and 2, words 1 and 3), each [2, *broadcast shape]."""
    _check_stream(stream)
    k0, k1 = split64(seed)
    o0, o1 = split64(offset)
    counter = counter.to(torch.int64)
    c0 = counter & MASK32
    c1 = ((counter >> 32) & ((1 << (COUNTER_BITS - 32)) - 1)) | (stream << (COUNTER_BITS - 32))
    return _philox_pairs(c0, c1, o0, o1, k0, k1)


def random_words(seed: torch.Tensor, offset: torch.Tensor, counter: torch.Tensor, stream: int) -> torch.Tensor:
    """The four 32-bit Philox4x32-10 words of (seed, offset, counter, stream).

    seed, offset: int64 tensors (all 64 bits used; seed is the Philox key), broadcast against
    counter: int64 tensor in [0, 2**56); stream: int in [0, 256). Philox counter words are
    (counter lo32, (counter >> 32) | stream << 24, offset lo32, offset hi32), key words
    (seed lo32, seed hi32). Returns int64 [*broadcast shape, 4] holding uint32 values. Every
    PyTorch path and kernel of the package draws its randomness from this function (or its
    Triton mirror ``spec_samplers.kernels.rng.random_words``), bit for bit.

    Example::

        >>> w = random_words(torch.tensor([7]), torch.tensor([0]), torch.arange(3), STREAM_RECOVER)
        >>> w.shape, w.dtype
        (torch.Size([3, 4]), torch.int64)
    """
    return torch.stack(philox_words(seed, offset, counter, stream), dim=-1)


def uniform_from_words(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 uniform from two words (int64 tensors holding uint32): (a * 2**32 + (b | 1)) * 2**-64
    rounded to fp32, clamped to [2**-64, 1 - 2**-24] (see the module docstring for its CDF).

    The three pieces are exact in fp32 (24, 24 and 16 bits) and added smallest first, so the
    result is monotone in the 64-bit integer and identical wherever IEEE fp32 addition is (an
    FMA-contracted ``x * 2**-k + y`` rounds the same, the product being exact)."""
    hi = (a >> 8).to(torch.float32) * _TWO_POW_M24
    mid = (((a & 0xFF) << 16) | (b >> 16)).to(torch.float32) * _TWO_POW_M48
    low = ((b | 1) & 0xFFFF).to(torch.float32) * _TWO_POW_M64
    return torch.clamp_max(hi + (mid + low), UNIFORM_MAX)


def exponential_from_words(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 Exp(1) sample -log1p(-u) from two words, in [EXP_MIN, EXP_MAX]: fine resolution near 0,
    which is where the race decides whether a small-weight token wins. ``out``: written there
    when given (any strides, e.g. an interleaving view), saving a copy.

    On the CPU the log1p runs in fp64 and is rounded to fp32 (the correctly rounded fp32 value,
    within the 1 ulp of any fp32 log1p): PyTorch's fp32 log1p is not vectorised there and took 10x
    the fp64 one (230 us against 33 us for a B = 64 race's 24k exponentials). Elsewhere it is the
    fp32 log1p, CUDA's log1pf, which the kernels call (bit-equal tokens on CUDA)."""
    u = uniform_from_words(a, b).neg_()
    if u.device.type == "cpu":
        e = torch.log1p(u.to(torch.float64)).neg_()
        return e.to(torch.float32) if out is None else out.copy_(e)
    return torch.neg(torch.log1p(u), out=out)


def accept_uniforms(seeds: torch.Tensor, offsets: torch.Tensor, k: int) -> torch.Tensor:
    """Uniforms of the accept test (64 random bits each).

    seeds, offsets: [B] int64. Returns [B, k] fp32; entry (b, i) is the uniform of position i
    (stream STREAM_ACCEPT, counter i, words 0 and 1).

    Example::

        >>> accept_uniforms(torch.tensor([1, 2]), torch.tensor([0, 0]), 3).shape
        torch.Size([2, 3])
    """
    pos = torch.arange(k, device=seeds.device, dtype=torch.int64)
    w0, w1, _, _ = philox_words(seeds[:, None], offsets[:, None], pos[None, :], STREAM_ACCEPT)
    return uniform_from_words(w0, w1)


def recover_exponentials(
    seeds: torch.Tensor, offsets: torch.Tensor, positions: torch.Tensor, vocab_size: int, stream: int = STREAM_RECOVER
) -> torch.Tensor:
    """Exponentials of the recovery race (64 random bits each).

    seeds, offsets, positions: [N] int64 (positions in [0, 2**24)). Returns [N, vocab_size] fp32;
    element v of row r uses counter positions[r] * 2**32 + v // 2 of stream STREAM_RECOVER,
    words (0, 1) for even v and (2, 3) for odd v.

    Example::

        >>> one = torch.tensor([5])
        >>> recover_exponentials(one, one * 0, one * 0, 7).shape
        torch.Size([1, 7])
    """
    n = seeds.shape[0]
    half = (vocab_size + 1) // 2
    pairs = torch.arange(half, device=seeds.device, dtype=torch.int64)
    counter = (positions.to(torch.int64)[:, None] << 32) + pairs[None, :]
    w0, w1, w2, w3 = philox_words(seeds[:, None], offsets[:, None], counter, stream)
    exps = torch.stack((exponential_from_words(w0, w1), exponential_from_words(w2, w3)), dim=-1)
    return exps.reshape(n, 2 * half)[:, :vocab_size]


# ---------------------------------------------------------------------------------------------
# The two-level race: the one sampling rule of the package (module docstring, "Race").

#: vocabulary entries per race group (a power of two: kernels' vector steps divide or tile it)
RACE_GROUP = 256
#: level-1 counters sit at counter_base + LEVEL1_COUNTER + group // 2 (level 2 uses counter_base
#: + index in group // 2 < RACE_GROUP / 2), so the two levels never share a Philox block
LEVEL1_COUNTER = 2**31


def chunk_alignment(block_v: int) -> int:
    """What the vocabulary chunk of one program of a kernel's vocabulary pass is a multiple of,
    for vector steps of ``block_v`` entries (a power of two): whole race groups, so that each
    group's fp64 sum (level 1's input, :func:`race_group_sums`) is taken by one program, over one
    group's contiguous entries, and whole vector steps. RACE_GROUP is a power of two too, so one
    divides the other and the larger is the alignment; a vector step wider than a group covers
    whole groups (``kernels.rng.group_tile``), a narrower one tiles a group. The planner
    (``kernels.backend.plan_vocab_split``) sizes every chunk with it."""
    if block_v <= 0 or block_v & (block_v - 1):
        raise ValueError(f"block_v: expected a power of two, got {block_v}")
    return max(block_v, RACE_GROUP)


def race_num_groups(vocab_size: int) -> int:
    """Number of race groups of a vocabulary, ceil(V / RACE_GROUP)."""
    return -(-vocab_size // RACE_GROUP)


#: CPU: a chunk of rows holds about this many entries (1 MiB of fp32, 2 MiB as fp64), so that a
#: chunk's passes (cleaning, residual, fp64 conversion and sums) run in cache instead of [N, V]
#: round trips through memory (the fp64 sums alone: twice as fast)
CPU_CHUNK_ENTRIES = 2**18


def row_chunk(num_rows: int, vocab_size: int, device: torch.device) -> int:
    """Rows per chunk of an [N, V] pass: about CPU_CHUNK_ENTRIES entries on the CPU (a loop over
    ceil(N * V / 2**18) chunks, never over single rows unless V >= 2**18); all rows elsewhere."""
    if device.type != "cpu":
        return max(num_rows, 1)
    return max(1, CPU_CHUNK_ENTRIES // max(vocab_size, 1))


def race_group_sums(weights: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[N, ceil(V / RACE_GROUP)] fp64 sums of consecutive groups of RACE_GROUP entries of
    ``weights`` ([N, V] fp32 >= 0; the last group may be partial), written into ``out`` when given.
    fp64 keeps a group of tail weights (each >= 2**-149) at full relative precision, and makes the
    sum of a group nearly independent of the order it is added in (rounding 2**-53 relative: a
    kernel summing in another order can only flip a level-1 race whose two best keys agree to
    ~1e-16, a tie in practice).

    Each group is converted to fp64 and reduced by one sum over its RACE_GROUP contiguous entries
    (the same additions whatever the chunking: the sums are identical bit for bit); on the CPU in
    chunks of rows (:func:`row_chunk`) that keep the fp64 copy in cache."""
    N, V = weights.shape
    full = V // RACE_GROUP
    tail = V % RACE_GROUP > 0 or full == 0  # a partial last group (an empty row has one empty group)
    if out is None:
        out = torch.empty(N, full + int(tail), dtype=torch.float64, device=weights.device)
    step = row_chunk(N, V, weights.device)
    for r in range(0, N, step):
        group_sums_into(weights[r : r + step], out[r : r + step])
    return out


def group_sums_into(weights: torch.Tensor, out: torch.Tensor) -> None:
    """out [N, G1] fp64 <- :func:`race_group_sums` of weights [N, V], in one chunk (no loop)."""
    n, V = weights.shape
    full = V // RACE_GROUP
    if full:
        head = weights[:, : full * RACE_GROUP].reshape(n, full, RACE_GROUP)
        torch.sum(head.to(torch.float64), dim=-1, out=out[:, :full])
    if V % RACE_GROUP or not full:
        torch.sum(weights[:, full * RACE_GROUP :].to(torch.float64), dim=-1, out=out[:, full])


def race_exponentials(
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
    counter_base: torch.Tensor,  # [N] int64: position * 2**32 (recovery, decoding), 0 (sampling)
    num_groups: int,
    stream: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exponentials of one two-level race, from ONE Philox evaluation over [N, ceil(G1 / 2) +
    RACE_GROUP / 2] counters: (level 1 [N, num_groups], level 2 [N, RACE_GROUP]) fp32.

    Level 1, group g: counter base + LEVEL1_COUNTER + g // 2, words (0, 1) for an even g, (2, 3)
    for an odd one. Level 2, entry i of the chosen group (vocab index g * RACE_GROUP + i): counter
    base + i // 2, words as level 1's; the same for every group (only one group is ever raced),
    and equal to the single-level race's exponentials of entries 0..RACE_GROUP-1
    (:func:`recover_exponentials`)."""
    n = seeds.shape[0]
    n1 = (num_groups + 1) // 2
    device = seeds.device
    cols = torch.cat(
        (
            torch.arange(LEVEL1_COUNTER, LEVEL1_COUNTER + n1, device=device, dtype=torch.int64),
            torch.arange(RACE_GROUP // 2, device=device, dtype=torch.int64),
        )
    )
    counter = counter_base.to(torch.int64)[:, None] + cols[None, :]
    even, odd = _philox_word_pairs(seeds[:, None], offsets[:, None], counter, stream)
    # one conversion for both word pairs: [2, N, cols] (words (0, 1), words (2, 3)) written
    # interleaved into [N, cols, 2] = [N, 2 * cols] (even entry, odd entry)
    e = torch.empty(n, cols.shape[0], 2, dtype=torch.float32, device=device)
    exponential_from_words(even, odd, out=e.permute(2, 0, 1))
    e = e.view(n, 2 * cols.shape[0])
    return e[:, :num_groups], e[:, 2 * n1 :]


def pick_group(sums: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """Level 1: argmax_g sums[g] / E[g] in fp64 (ties to the lowest group), a sample of the groups
    by their sums. sums [N, G1] fp64 >= 0, exponentials [N, G1] fp32. Returns [N] int64."""
    return torch.argmax(sums / exponentials.to(torch.float64), dim=-1)


def group_weights(weights: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """[N, RACE_GROUP] fp32 entries of group ``group`` ([N] int64) of each row of ``weights``
    ([N, V]); -1 (never a winner) past the vocabulary."""
    V = weights.shape[1]
    idx = group[:, None] * RACE_GROUP + torch.arange(RACE_GROUP, device=weights.device)
    if V % RACE_GROUP == 0 and V > 0:  # no group is partial (group < V / RACE_GROUP)
        return weights.gather(1, idx).to(torch.float32)
    inside = idx < V
    w = weights.gather(1, idx.clamp_(max=max(V - 1, 0))).to(torch.float32)
    return torch.where(inside, w, -1.0)


def race(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """Single-level exponential race (level 2 of :func:`two_level_race`): argmax_x
    (weights[x] * RACE_SCALE) / E[x], a sample of weights / sum. weights: [N, M] fp32 (>= 0 for
    candidates, < 0 never wins against them); exponentials: [N, M] fp32 in [EXP_MIN, EXP_MAX].
    The scale keeps subnormal weights' keys normal (so they win at their rate, and beat zeros).
    Ties go to the lowest index. Returns [N] int64.

    Example::

        >>> race(torch.tensor([[0.0, 1.4e-45, 0.0]]), torch.ones(1, 3)).tolist()
        [1]
    """
    # (w * 2**32) is exact: one rounding per key, the division (as the kernels' div_rn)
    return torch.argmax((weights * RACE_SCALE) / exponentials, dim=-1)


def two_level_race(
    weights: torch.Tensor,  # [N, V] fp32 >= 0
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
    counter_base: torch.Tensor,  # [N] int64
    stream: int,
    sums: torch.Tensor | None = None,  # [N, G1] fp64: race_group_sums(weights), when the caller has it
) -> torch.Tensor:
    """A sample of each row of ``weights`` (need not be normalised) by the two-level race: level 1
    picks group g with probability sums[g] / sum (:func:`pick_group`), level 2 races the entries
    of group g (:func:`race`). Returns [N] int64 in [0, V) (an all-zero row gives some index:
    callers mark it). No host synchronisation; about V / 2 / RACE_GROUP + RACE_GROUP / 2 Philox
    blocks per row instead of V / 2.

    Example::

        >>> w = torch.tensor([[0.0, 0.25, 0.75]])
        >>> one = torch.tensor([3])
        >>> int(two_level_race(w, one, one * 0, one * 0, STREAM_RECOVER)) in (1, 2)
        True
    """
    if sums is None:
        sums = race_group_sums(weights)
    e1, e2 = race_exponentials(seeds, offsets, counter_base, sums.shape[1], stream)
    group = pick_group(sums, e1)
    return group * RACE_GROUP + race(group_weights(weights, group), e2)


def recovery_race(
    weights: torch.Tensor,  # [N, V] fp32 >= 0
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
    positions: torch.Tensor,  # [N] int64 in [0, 2**24)
    stream: int = STREAM_RECOVER,
) -> torch.Tensor:
    """The recovery (and bonus, and decoding) draw of position ``positions`` of each row:
    :func:`two_level_race` with counter base position * 2**32 on ``stream``. Returns [N] int64.

    Example::

        >>> w = torch.tensor([[0.0, 0.25, 0.75]])
        >>> one = torch.tensor([3])
        >>> int(recovery_race(w, one, one * 0, one * 0)) in (1, 2)
        True
    """
    return two_level_race(weights, seeds, offsets, positions.to(torch.int64) << 32, stream)


# --- Trees (spec_samplers.tree) -----------------------------------------------------------------
# Tree verification has no stream of its own; it calls the public functions above, so it follows
# whatever rule they implement. Sibling tests: node j (1..N) tests accept_uniforms(seeds, offsets,
# N)[:, j - 1] (STREAM_ACCEPT, counter j - 1; a node is tested at most once per call). Final
# draw: recovery_race(residual, seeds, offsets, depth of the stop node) (STREAM_RECOVER, position =
# that depth; one race per request per call). A chain given as a tree therefore uses the chain
# sampler's numbers. The Triton tree kernel draws the same uniforms (kernels.rng.random_words /
# uniform_from_words) and leaves the final race to recovery_race. The decoding loop draws node
# j's draft token with strategy.draw on STREAM_DECODE_DRAFT at position j (offset = the round).
# Traversal Verification (tree.traversal, BlockVerificationSampler's tree rule) uses the same two:
# node j's post-order test is accept_uniforms(seeds, offsets, N)[:, j - 1] (each node tested at
# most once), its final draw the recovery race at the stop node's depth; on a chain these are
# block verification's numbers (its h_m tests u_{m-1}).


# --- The sampling operations (spec_samplers.sampling) ----------------------------------------------
# The counter RNG as the FlashInfer-compatible sampling
# operations use it (PyTorch side).
#
# Every token of :mod:`spec_samplers.sampling` is drawn by the package's one rule, the two-level
# race (:func:`two_level_race`), keyed by (output row's seed, output row's offset)
# on its own stream, STREAM_SAMPLE, with counter base 0, so sampling never reuses the verification
# samplers' streams (STREAM_ACCEPT, STREAM_RECOVER), a row's token never depends on its batch
# neighbours or on its row index, and the Triton kernels (``race_kernel`` and its finalize in
# :mod:`spec_samplers.kernels.sampling_kernels`) reproduce it bit for bit.
#
# Seeds given as one scalar for the whole batch (FlashInfer's form) become per-row seeds here
# (:func:`derive_row_seeds`): row r's seed is words (0, 1) of (seed, offset, counter r) on
# STREAM_ROW_SEED, so rows sharing a scalar seed still draw independent streams, as FlashInfer's
# per-row Philox subsequences do.


def sample_race(
    weights: torch.Tensor,  # [N, V] fp32: >= 0 for the kept tokens, 0 for the others
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
) -> torch.Tensor:
    """[N] int64: a sample of each row of ``weights`` by the two-level race
    (:func:`two_level_race`) on STREAM_SAMPLE with counter base 0 (level 1 at
    counters LEVEL1_COUNTER + group // 2, level 2 at index-in-group // 2)."""
    return two_level_race(weights, seeds, offsets, torch.zeros_like(seeds), STREAM_SAMPLE)


def derive_row_seeds(seed: torch.Tensor, offset: torch.Tensor, num_rows: int) -> torch.Tensor:
    """[num_rows] int64 seeds of rows sharing one scalar ``seed`` and ``offset`` (0-d or [1] int64
    tensors): row r's seed is words (0, 1) of (seed, offset, counter r) on STREAM_ROW_SEED."""
    seeds = seed.reshape(1).to(torch.int64)
    offsets = offset.reshape(1).to(torch.int64)
    r = torch.arange(num_rows, device=seeds.device, dtype=torch.int64)
    return derive_seeds(seeds, offsets, r, STREAM_ROW_SEED)


def derive_seeds(seeds: torch.Tensor, offsets: torch.Tensor, counters: torch.Tensor, stream: int) -> torch.Tensor:
    """int64 seeds (broadcast shape) made of words (0, 1) of (seed, offset, counter) on ``stream``."""
    w0, w1, _, _ = philox_words(seeds, offsets, counters, stream)
    hi = w1 - ((w1 >> 31) << 32)  # as a signed 32-bit value, so the product cannot overflow
    return (hi * 2**32) | w0


# --- Per-request seeds of the samplers (docs/design.md section 4) ------------------------------------
def row_seeds(
    batch_size: int,
    device: torch.device,
    seeded_seqs: dict[int, torch.Generator] | None = None,
    seeds: torch.Tensor | None = None,  # [B] int64 on device
) -> torch.Tensor:
    """[B] int64 seeds: ``seeds`` if given, else drawn from torch's default generator; rows in
    ``seeded_seqs`` draw theirs from their own generator, so re-seeding it reproduces the row.
    No host synchronisation (the loop runs over the seeded rows, not the batch)."""
    check_seed_tensor("seeds", seeds, batch_size, device)
    if seeds is None:
        out = torch.randint(0, SEED_HIGH, (batch_size,), dtype=torch.int64, device=device)
    else:
        out = seeds.to(torch.int64)
    if not seeded_seqs:
        return out
    if seeds is not None:
        out = out.clone()
    rows, drawn = [], []
    for row, gen in seeded_seqs.items():
        if not isinstance(row, int) or not 0 <= row < batch_size:
            raise input_error("seeded_seqs", f"row indices in [0, {batch_size})", repr(row))
        if not isinstance(gen, torch.Generator):
            raise input_error(f"seeded_seqs[{row}]", "a torch.Generator", type(gen).__name__)
        rows.append(row)
        drawn.append(torch.randint(0, SEED_HIGH, (1,), dtype=torch.int64, generator=gen, device=gen.device))
    out[torch.tensor(rows, device=device)] = torch.cat([d.to(device) for d in drawn])
    return out
