"""The compiled CPU path (spec_samplers.cpu) against the PyTorch references, token for token.

Each twin must give the reference's tokens on the same batch: padded and ragged layouts,
probabilities and logits, fp32 / fp16 / bf16 rows, point-mass drafts, greedy and mixed batches,
out-of-range and -1 drafts and bonus ids, residuals without mass, ties, NaN rows, malformed ragged
requests. numba is in the test extra, so these run wherever the tests do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from kernel_cases import make_case, ragged_view

from spec_samplers import cpu
from spec_samplers.layout import VerifyBatch
from spec_samplers.reference import block_reference, rejection_reference, typical_reference

assert cpu.kernels() is not None, "numba must import for these tests (pip install -e '.[test]')"

SHAPES = [(1, 1, 7), (3, 2, 256), (5, 3, 300), (8, 4, 1000), (4, 0, 513), (16, 2, 2048)]


def _batches(B: int, K: int, V: int, seed: int, dtype: torch.dtype, **case_options: object):  # type: ignore[no-untyped-def]
    """(name, batch) pairs over one random case: padded and ragged, probabilities and logits,
    draft rows and point-mass drafts."""
    c = make_case(B, K, V, seed, dtype=dtype, **case_options)  # type: ignore[arg-type]
    common = dict(seeds=c.seeds, offsets=c.offsets)
    yield "probs", VerifyBatch.padded(c.target, c.bonus, c.draft, c.draft_ids, is_greedy=c.is_greedy, **common)
    yield "point-mass", VerifyBatch.padded(c.target, c.bonus, None, c.draft_ids, **common)
    yield (
        "logits",
        VerifyBatch.padded(
            c.target_logits.to(dtype),
            c.bonus,
            c.draft_logits.to(dtype),
            c.draft_ids,
            temperature=c.temperature,
            **common,
        ),
    )
    g = torch.Generator().manual_seed(seed)
    k_b = torch.randint(0, K + 1, (B,), generator=g)
    t, d, ids, cu = ragged_view(c.target, c.draft, c.draft_ids, k_b)
    yield "ragged", VerifyBatch.ragged(t, c.bonus, d, ids, cu, K, is_greedy=c.is_greedy, **common)
    yield "ragged-point-mass", VerifyBatch.ragged(t, c.bonus, None, ids, cu, K, **common)
    if B > 1 and K:  # a malformed request (its span reaches past T)
        bad = cu.clone()
        bad[-1] = t.shape[0] + 3
        yield "ragged-malformed", VerifyBatch.ragged(t, c.bonus, d, ids, bad, K, **common)


TYPICAL = {"posterior_threshold": 0.09, "posterior_alpha": 0.3}
TWINS = [(rejection_reference, cpu.rejection_cpu, {}), (block_reference, cpu.block_cpu, {})]
TWINS += [
    (typical_reference, cpu.typical_cpu, TYPICAL),
    (typical_reference, cpu.typical_cpu, {**TYPICAL, "posterior_threshold": 0.001}),
]


def _check(batch: VerifyBatch, name: str) -> None:
    for reference, twin, options in TWINS:
        if reference is not typical_reference and batch.seeds is None:
            continue
        want = reference(batch, **options)
        got = cpu.run_compiled(twin, batch, **options)
        assert torch.equal(got, want), f"{twin.__name__} {name}: compiled {got.tolist()} != reference {want.tolist()}"


@pytest.mark.quick
@pytest.mark.parametrize("B,K,V", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_twin_equals_reference(B: int, K: int, V: int, dtype: torch.dtype) -> None:
    for seed in range(2):
        for options in ({}, {"bad_ids": True}, {"zero_mass": True}, {"worst_case": True}, {"greedy": "all"}):
            for name, batch in _batches(B, K, V, seed * 31 + B, dtype, **options):
                _check(batch, f"{name} {options} seed {seed}")


def test_twin_many_seeds() -> None:
    """Far drafts (every request recovers from a full row) over many seeds: the race's tokens."""
    for seed in range(40):
        for name, batch in _batches(6, 3, 700, 1000 + seed, torch.float32, closeness=3.0, greedy="none"):
            _check(batch, f"{name} seed {seed}")


def test_twin_ties_nan_and_empty_rows() -> None:
    """Equal weights (level-2 ties go to the lowest index, greedy argmax too), NaN / Inf / negative
    entries (cleaned to 0), rows without mass (no token, -1)."""
    B, K, V = 6, 2, 600
    target = torch.zeros(B, K + 1, V)
    target[:, :, 10:20] = 0.1  # ten tied tokens
    target[1, :, 15] = float("nan")
    target[2, :, 300] = float("inf")
    target[3, :, 400] = -1.0
    target[4] = 0.0  # no mass anywhere
    draft = target[:, :K].clone()
    draft[5] = 0.0
    draft[5, :, 500] = 1.0  # drafts where the target has nothing
    ids = torch.tensor([[12, 13], [15, 11], [300, 12], [400, 10], [3, 4], [500, 500]])
    bonus = torch.tensor([[7], [V], [-1], [2], [5], [9]])
    seeds = torch.arange(B) * 11 - 3
    for greedy in (torch.zeros(B, dtype=torch.bool), torch.ones(B, dtype=torch.bool)):
        for d in (draft, None):
            batch = VerifyBatch.padded(target, bonus, d, ids, seeds=seeds, is_greedy=greedy)
            _check(batch, f"greedy={bool(greedy[0])} draft={d is not None}")


def test_compiled_op_dispatch() -> None:
    """ "auto" on CPU tensors runs the twin, "torch" the reference; both give the same tokens."""
    from spec_samplers import RejectionSampler

    assert cpu.compiled_op(rejection_reference, torch.device("cpu")) is cpu.rejection_cpu
    assert cpu.compiled_op(rejection_reference, torch.device("meta")) is None
    c = make_case(8, 3, 500, 5, closeness=2.0, greedy="none")
    auto = RejectionSampler()(c.target, c.bonus, c.draft, c.draft_ids, seeds=c.seeds)
    ref = RejectionSampler(backend="torch")(c.target, c.bonus, c.draft, c.draft_ids, seeds=c.seeds)
    assert torch.equal(auto, ref)


def _probs_spec(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """torch_ops.probs_from_logits as its docstring states it, one plain op at a time."""
    from spec_samplers.torch_ops import reciprocal_sum, scaled_exp

    x = torch.fmax(logits.to(torch.float32), torch.tensor(float("-inf")))
    row_max = x.amax(dim=-1, keepdim=True)
    t = torch.where(temperature > 0, temperature.to(torch.float32), 1.0)[:, None]
    e = scaled_exp(x, row_max, t)
    probs = e * reciprocal_sum(e.sum(dim=-1, keepdim=True))
    onehot = torch.nn.functional.one_hot(torch.argmax(x, dim=-1), x.shape[-1]).to(torch.float32)
    onehot = torch.where(row_max > float("-inf"), onehot, 0.0)
    return torch.where((temperature == 0)[:, None], onehot, probs)


@pytest.mark.quick
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_probs_from_logits_in_place_equals_its_rule(dtype: torch.dtype) -> None:
    """The in-place, row-chunked probs_from_logits gives the rule's floats bit for bit: finite
    temperatures, T = 0 (greedy), +inf and tiny T, NaN / +-inf logits, rows without mass, rows
    across several CPU chunks."""
    from spec_samplers.torch_ops import probs_from_logits

    g = torch.Generator().manual_seed(0)
    for N, V in ((7, 33), (3, 2**17 + 5), (40, 20000)):
        logits = (torch.randn(N, V, generator=g) * 8).to(dtype)
        logits[0, 3] = float("nan")
        logits[1, :] = float("-inf")
        logits[2, 5:9] = float("inf")
        logits[-1, : V // 2] = -1e38 if dtype != torch.float16 else -6e4
        temps = [torch.rand(N, generator=g) + 0.3]
        with_special = temps[0].clone()
        with_special[::3] = 0.0
        with_special[1::5] = float("inf")
        with_special[2::7] = 1e-40
        with_special[4::9] = float("nan")
        temps.append(with_special)
        for t in temps:
            got = probs_from_logits(logits, t)
            want = _probs_spec(logits, t)
            assert torch.equal(got, want), (N, V, dtype)


def test_compiled_chunks_of_logits_change_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logits batches run a chunk of requests at a time (their probabilities are the only
    temporaries): chunks of one, two and all requests give the same tokens."""
    c = make_case(7, 3, 400, 11, closeness=2.0)
    batch = VerifyBatch.padded(
        c.target_logits, c.bonus, c.draft_logits, c.draft_ids, temperature=c.temperature, seeds=c.seeds
    )
    whole = cpu.run_compiled(cpu.rejection_cpu, batch)
    for requests in (1, 2):
        monkeypatch.setattr(cpu, "COMPILED_CHUNK_ELEMENTS", requests * 4 * 400)
        assert torch.equal(cpu.run_compiled(cpu.rejection_cpu, batch), whole)


def test_without_numba_the_reference_runs_after_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import warnings

    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    monkeypatch.delitem(sys.modules, "spec_samplers.cpu._numba_kernels", raising=False)
    cpu._import_kernels.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cpu.compiled_op(rejection_reference, torch.device("cpu")) is None
            assert cpu.compiled_op(block_reference, torch.device("cpu")) is None
        assert len([w for w in caught if "numba" in str(w.message)]) == 1
        c = make_case(4, 2, 300, 3)
        batch = VerifyBatch.padded(c.target, c.bonus, c.draft, c.draft_ids, seeds=c.seeds)
        assert torch.equal(cpu.rejection_cpu(batch), rejection_reference(batch))
    finally:
        cpu._import_kernels.cache_clear()


_BACKGROUND_PROBE = """
import json, sys, time, torch
from spec_samplers import cpu
from spec_samplers.reference import rejection_reference
from spec_samplers.registry import get_sampler
from spec_samplers.layout import VerifyBatch
g = torch.Generator().manual_seed(0)
q = torch.softmax(torch.randn(3, 3, 500, generator=g), -1)
p = torch.softmax(torch.randn(3, 2, 500, generator=g), -1)
ids, bonus, seeds = torch.randint(0, 500, (3, 2), generator=g), torch.zeros(3, 1, dtype=torch.int64), torch.arange(3)
want = rejection_reference(VerifyBatch.padded(q, bonus, p, ids, seeds=seeds))
sampler = get_sampler("rejection_sampler")
first = sampler(q, bonus, p, ids, seeds=seeds)
ready_at_first = cpu.kernels() is not None
deadline = time.monotonic() + float(sys.argv[1])
while cpu.kernels() is None and time.monotonic() < deadline:
    time.sleep(0.5)
later = sampler(q, bonus, p, ids, seeds=seeds)
print(json.dumps(dict(ready_at_first=ready_at_first, ready=cpu.kernels() is not None,
                      equal=bool(torch.equal(first, want) and torch.equal(later, want)),
                      marker=cpu._marker().exists())))
"""


def test_cold_cache_compiles_in_the_background(tmp_path: Any) -> None:
    """A process on a machine without cached kernels (a fresh NUMBA_CACHE_DIR) runs the reference
    at its first call while a child process compiles (no call waits for the compiler), then the
    kernels once the child has marked the cache, with the reference's tokens both times; the next
    process finds the mark and runs the kernels from its first call. A planted fault (the marker
    not written) fails it."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), SPEC_SAMPLERS_CPU_COMPILE="background")
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _BACKGROUND_PROBE, "900"], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0] == dict(ready_at_first=False, ready=True, equal=True, marker=True), runs[0]
    assert runs[1] == dict(ready_at_first=True, ready=True, equal=True, marker=True), runs[1]


@pytest.mark.quick
def test_vectorised_log_within_an_ulp() -> None:
    """The typical kernel's branch-free fp64 log (fdlibm's kernel) against libm's on the entropy's
    domain, q + eps for q in [0, 1], near 1 and at powers of two: at most one ulp apart."""
    import math

    import numpy as np
    from numba import njit

    from spec_samplers.cpu._numba_kernels import _log

    log_of = njit(lambda x: _log(x))
    g = np.random.default_rng(0)
    eps = float(np.float32(1e-5))
    xs = [eps, 0.5, 1.0, 1.0 + eps, 2.0**-10, math.sqrt(0.5), math.sqrt(2.0) - 1e-12]
    xs += list(g.random(3000).astype(np.float32).astype(np.float64) + eps)
    xs += list(np.exp(g.uniform(-11.6, 0.0, 3000))) + list(1.0 + g.uniform(-1e-6, 1e-6, 500))
    ulps = [abs(int(np.float64(log_of(x)).view(np.int64)) - int(np.float64(math.log(x)).view(np.int64))) for x in xs]
    assert max(ulps) <= 1, max(ulps)


@pytest.mark.quick
def test_race_exponentials_and_clean_equal_their_rules() -> None:
    """The kernels' vectorised race exponentials (-_log(1 - u), no libm call) equal
    rng.race_exponentials (PyTorch's fp64 log1p, rounded to fp32) on 256 keys' level-1 and level-2
    draws (~1.3e5 draws; the two can differ only where an fp64 value lies within an ulp or two of
    an fp32 rounding boundary, ~2**-28 of the draws: a false failure every ~2000 such seeds, and
    these are fixed), and the fp64 rule on uniforms under 2**-30 (the series branch), which no
    random key reaches; ``_clean`` (an int32 range test) equals its float rule on the special
    values and 2**20 random bit patterns of every sign and exponent."""
    import numpy as np
    from numba import njit

    from spec_samplers import rng
    from spec_samplers.cpu import _numba_kernels as nk

    fill = njit(lambda seed, offset, base, stream, e, n: nk._fill_exponentials(seed, offset, base, stream, e, n))
    g = torch.Generator().manual_seed(3)
    N, G = 256, 127
    seeds = torch.randint(-(2**62), 2**62, (N,), generator=g)
    offsets = torch.randint(0, 2**40, (N,), generator=g)
    base = torch.randint(0, 8, (N,), generator=g) << 32
    level1, level2 = rng.race_exponentials(seeds, offsets, base, G, rng.STREAM_RECOVER)
    e = np.empty(max(G + 1, rng.RACE_GROUP), dtype=np.float32)
    stream = np.uint64(rng.STREAM_RECOVER)
    for n in range(N):
        seed, offset = np.uint64(int(seeds[n]) % 2**64), np.uint64(int(offsets[n]))
        fill(seed, offset, np.int64(int(base[n]) + rng.LEVEL1_COUNTER), stream, e, G + 1)
        assert torch.equal(torch.from_numpy(e[:G]), level1[n]), n
        fill(seed, offset, np.int64(int(base[n])), stream, e, rng.RACE_GROUP)
        assert torch.equal(torch.from_numpy(e[: rng.RACE_GROUP]), level2[n]), n
    exp_of = njit(lambda a, b: nk._exponential_v(a, b))
    for a, b in [(0, 0), (0, 1), (0, 2**32 - 1), (1, 0), (2**10, 2**31), (2**13, 5)]:  # u in [2**-64, 2**-19]
        u = float(rng.uniform_from_words(torch.tensor(a), torch.tensor(b)))
        want = np.float32(-np.log1p(-np.float64(u)))
        assert exp_of(np.uint64(a), np.uint64(b)) == want, (a, b, u)

    @njit
    def clean_all(xs, out):  # type: ignore[no-untyped-def]
        for i in range(xs.shape[0]):
            out[i] = nk._clean(xs[i])

    bits = np.random.default_rng(0).integers(0, 2**32, 2**20, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38], np.float32)
    xs = np.concatenate([specials, bits.view(np.float32)])
    got = np.empty_like(xs)
    clean_all(xs, got)
    keep = (xs > 0) & (xs < np.inf)
    assert np.array_equal(got.view(np.uint32), np.where(keep, xs, np.float32(0.0)).view(np.uint32))


def test_typical_at_a_large_vocabulary() -> None:
    """Typical acceptance at V = 32000 (many entropy blocks) with peaked rows that accept some
    drafts and reject others, over seeds: the twin's tokens are the reference's."""
    for seed in range(6):
        c = make_case(4, 3, 32000, seed, closeness=0.5, greedy="none")  # type: ignore[arg-type]
        batch = VerifyBatch.padded(c.target, c.bonus, c.draft, c.draft_ids, seeds=c.seeds, offsets=c.offsets)
        for threshold in (0.09, 0.3):
            options = {**TYPICAL, "posterior_threshold": threshold}
            want = typical_reference(batch, **options)
            got = cpu.run_compiled(cpu.typical_cpu, batch, **options)
            assert torch.equal(got, want), f"seed {seed}: {got.tolist()} != {want.tolist()}"


@pytest.mark.quick
def test_typical_decided_without_the_entropy() -> None:
    """The typical kernel skips the entropy pass where q(x) alone decides (q(x) above the
    threshold with alpha > 0, or q(x) = 0): drafts at zero, at, just above and below the
    threshold, and rows whose exp(-H) under- or overflows (huge unnormalised entries: with alpha
    = 0 the reference's threshold is NaN and rejects even above the threshold)."""
    B, K, V = 6, 3, 64
    g = torch.Generator().manual_seed(3)
    target = torch.softmax(torch.randn(B, K + 1, V, generator=g), -1)
    target[:, :, 0] = 0.0
    target[:, :, 1] = 0.09  # exactly the threshold (fp32)
    target[:, :, 2] = torch.nextafter(torch.tensor(0.09), torch.tensor(1.0))
    target[:, :, 3] = 0.5
    target[4, :, 5] = 1e30  # H very negative: exp(-H) = inf
    target[5, :, 5] = 1e-30
    ids = torch.tensor([[3, 2, 1], [3, 0, 3], [2, 3, 4], [1, 1, 1], [3, 3, 3], [3, 5, 2]])
    bonus = torch.zeros(B, 1, dtype=torch.int64)
    batch = VerifyBatch.padded(target, bonus, None, ids)
    for alpha in (0.0, 0.3, 1e-30):
        for threshold in (0.09, 0.0):
            options = {"posterior_threshold": threshold, "posterior_alpha": alpha}
            want = typical_reference(batch, **options)
            got = cpu.run_compiled(cpu.typical_cpu, batch, **options)
            assert torch.equal(got, want), f"{options}: {got.tolist()} != {want.tolist()}"


@pytest.mark.quick
def test_blocked_argmax_is_the_first_largest_clean_entry() -> None:
    """The kernels' argmax (blocks of 2048, integer max of the clean values' bits) against
    torch.argmax of the clean row (ties to the lowest index), with ties across blocks, NaN, Inf,
    negative and all-zero rows."""
    from spec_samplers.cpu._numba_kernels import _argmax_clean

    g = torch.Generator().manual_seed(5)
    for t in range(60):
        V = int(torch.randint(1, 9000, (1,), generator=g))
        q = torch.rand(V, generator=g)
        if t % 3 == 0:
            q = (q * 4).round() / 4  # ties, some across blocks
        if t % 4 == 0:
            q[torch.randint(0, V, (3,), generator=g)] = float("nan")
        if t % 5 == 0:
            q[torch.randint(0, V, (2,), generator=g)] = float("inf")
        if t % 7 == 0:
            q = -q
        if t % 11 == 0:
            q.zero_()
        clean = torch.where((q > 0) & (q < float("inf")), q, torch.zeros(()))
        assert _argmax_clean(q.numpy()) == int(torch.argmax(clean)), t


@pytest.mark.quick
def test_fp32_log_within_its_stated_bound() -> None:
    """The entropy's first pass (_log32: fp32, no division) on every fp32 mantissa of the binades
    the entropy meets (q + eps in [1e-5, 2)) and of a few far ones: within _LOG32_ERR (|log| + 1)
    of the fp64 log, the bound _entropy_bounds relies on (measured 2**-21.6: a 4x margin)."""
    import numpy as np
    from numba import njit

    from spec_samplers.cpu._numba_kernels import _LOG32_ERR, _log32

    @njit(cache=False)
    def logs(ys, out):  # type: ignore[no-untyped-def]
        for i in range(ys.shape[0]):
            out[i] = _log32(ys[i])

    lo, hi = np.float32(np.sqrt(0.5)).view(np.int32), np.float32(np.sqrt(2.0)).view(np.int32)
    mantissas = np.arange(lo, hi, dtype=np.int32).view(np.float32)
    worst = 0.0
    for e in (-17, -9, -1, 0, 1, 60, -120):
        ys = mantissas * np.float32(2.0**e)
        out = np.empty_like(ys)
        logs(ys, out)
        exact = np.log(ys.astype(np.float64))
        worst = max(worst, float((np.abs(out - exact) / (np.abs(exact) + 1.0)).max()))
    assert worst <= _LOG32_ERR / 2, (np.log2(worst), np.log2(_LOG32_ERR))


@pytest.mark.quick
def test_vectorised_exp2_is_the_correctly_rounded_one() -> None:
    """The draws' weights (_draw_kernels._exp2: fp64 polynomial, rounded to fp32) on every fp32 z
    of three binades, random z down to -130 (the subnormal weights) and the limits: equal to the
    correctly rounded 2**z (numpy's fp64 exp2, rounded) on each. A planted fault (the polynomial's
    terms from f**8 on dropped, ~2**-27 relative) fails it."""
    import numpy as np
    from numba import njit

    from spec_samplers.cpu._draw_kernels import _exp2

    @njit(cache=False)
    def exps(zs, out):  # type: ignore[no-untyped-def]
        for i in range(zs.shape[0]):
            out[i] = _exp2(zs[i])

    ones = np.float32(1.0).view(np.int32)
    mantissas = np.arange(ones, ones + 2**23, dtype=np.int32).view(np.float32)
    binades = [mantissas * np.float32(-(2.0**e)) for e in (-3, 0, 4)]
    rand = -np.random.default_rng(0).random(2**20).astype(np.float32) * np.float32(130.0)
    limits = np.array([0.0, -0.0, -0.5, -126.0, -149.0, -149.5, -150.0, -151.0, -3e38], dtype=np.float32)
    zs = np.concatenate([*binades, rand, limits])
    out = np.empty_like(zs)
    exps(zs, out)
    exact = np.exp2(zs.astype(np.float64)).astype(np.float32)
    assert np.array_equal(out, exact), int((out != exact).sum())
    assert exps is not None and _exp2(np.float32(-np.inf)) == 0.0


@pytest.mark.quick
def test_row_max_is_fmax_then_amax() -> None:
    """_draw_kernels._row_max (an integer max of order keys) against torch.fmax(x, -inf).amax() on
    rows with NaN, +-inf, -0.0, all-NaN and all-negative entries."""
    import numpy as np

    from spec_samplers.cpu._draw_kernels import _row_max

    g = torch.Generator().manual_seed(3)
    nan, inf = float("nan"), float("inf")
    rows = [torch.randn(1000, generator=g), -torch.rand(37, generator=g) - 1.0, torch.tensor([-0.0, -1.0])]
    rows += [torch.tensor([nan, nan]), torch.tensor([nan, -inf]), torch.tensor([-inf, 5.0, nan, inf])]
    rows.append(torch.tensor([-3e38]))
    with_nan = torch.randn(513, generator=g)
    with_nan[::7] = nan
    rows.append(with_nan)
    for x in rows:
        want = float(torch.fmax(x, torch.tensor(-inf)).amax())
        got = float(_row_max(x.numpy()))
        assert got == want and (np.signbit(got) == np.signbit(want) or got != 0.0), (x, got, want)


def test_compiled_softmax_is_the_logits_rule() -> None:
    """sampling.softmax on CPU fp32 (cpu.draw.softmax_rows) against torch_ops.probs_from_logits:
    equal on greedy, all -inf, NaN and +inf rows, within the summation order's rounding elsewhere;
    and SampleStrategy.probs (its shortcut past the pipe) equal to process_logits, which calls it."""
    from spec_samplers import sampling
    from spec_samplers.decoding.strategy import SampleStrategy
    from spec_samplers.sampling_params import SamplingParams, process_logits
    from spec_samplers.torch_ops import probs_from_logits

    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, 1000, generator=g) * 3
    x[1] = float("-inf")
    x[2, 5] = float("inf")
    x[3, ::3] = float("nan")
    x[4] = float("nan")
    t = torch.tensor([0.8, 1.0, 1.0, 0.0, 0.0, -1.0, 2.5])
    got, want = sampling.softmax(x, t), probs_from_logits(x, t)
    assert torch.equal(got[1:5], want[1:5])
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-9)
    assert torch.equal(sampling.softmax(x.T.contiguous().T, t), got)  # strided input
    params = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.0), SamplingParams(temperature=1.3)]
    strategy = SampleStrategy(params)
    logits = torch.randn(3, 4, 1000, generator=g)
    assert torch.equal(
        strategy.probs(logits),
        process_logits(logits.reshape(12, 1000), strategy.tensors.repeat_rows(4)).view(3, 4, 1000),
    )
    assert torch.equal(strategy.probs(logits[:, 0]), process_logits(logits[:, 0], strategy.tensors))
    for wrong in (logits[:2, 0], logits.reshape(6, 2, 1000)[:, 0]):  # 2 or 6 rows for 3 requests
        with pytest.raises(ValueError, match="sampling_params"):
            strategy.probs(wrong)
    filtered = SampleStrategy([SamplingParams(temperature=0.7, top_k=5)] * 3)
    assert int((filtered.probs(logits[:, 0]) > 0).sum(-1).max()) == 5  # (filters: the pipe)


def _entropy_rows(V: int):  # type: ignore[no-untyped-def]
    """Rows the entropy meets: peaked, flat, with zeros, unnormalised, NaN / Inf entries."""
    g = torch.Generator().manual_seed(V)
    rows = [torch.softmax(s * torch.randn(V, generator=g), -1) for s in (0.1, 1.0, 4.0, 12.0)]
    sparse = torch.softmax(torch.randn(V, generator=g), -1)
    sparse[: V // 2] = 0.0
    bad = rows[1].clone()
    bad[:3] = torch.tensor([float("nan"), float("inf"), -1.0])
    return rows + [sparse, 3.0 * rows[2], bad, torch.full((V,), 1.0 / V)]


@pytest.mark.quick
@pytest.mark.parametrize("V", [7, 513, 32000])
def test_typical_first_pass_holds_the_entropy_and_decides_as_the_fp64_pass(V: int) -> None:
    """_entropy_bounds's interval [h - e, h + e] holds the fp64 pass's h (e small: the fp32 pass
    decides all but q(x) that close to the threshold), and _typical_accepts decides as the fp64
    test for drafts at, one ulp and 1e-7 .. 1e-1 (relative) around the threshold. Power: deciding
    by the fp32 h alone (e = 0) differs from the fp64 test on some of those drafts, so the
    interval's fall-back pass is what keeps them exact."""
    import math

    import numpy as np

    from spec_samplers.constants import ENTROPY_EPS_FP32
    from spec_samplers.cpu._numba_kernels import (
        _BOUNDS_BLOCK,
        _ENTROPY_BLOCK,
        _entropy_bounds,
        _typical_accepts,
        _typical_threshold,
    )

    eps = float(ENTROPY_EPS_FP32)
    terms, terms32 = np.empty(_ENTROPY_BLOCK), np.empty(_BOUNDS_BLOCK, dtype=np.float32)
    alpha, threshold = float(np.float32(0.3)), 1.0
    alone_differs = 0
    for row in _entropy_rows(V):
        q = row.numpy()
        h64 = math.log(_typical_threshold(q, eps, math.inf, 1.0, terms))  # alpha = 1: exp(h) itself
        h, e = _entropy_bounds(q, eps, terms32)
        assert abs(h - h64) <= e <= 2.0**-12 * (abs(h64) + 1.0), (h, e, h64)
        exact_threshold = min(alpha * math.exp(h64), threshold)
        for rel in (0.0, 1e-7, -1e-7, 1e-5, -1e-5, 1e-3, -1e-3, 0.1, -0.1, 1e-4, -1e-4):
            for q_x in {exact_threshold * (1.0 + rel), float(np.nextafter(exact_threshold, 2.0))}:
                if not 0.0 < q_x <= threshold:
                    continue
                want = q_x > _typical_threshold(q, eps, threshold, alpha, terms)
                assert _typical_accepts(q, q_x, eps, threshold, alpha, terms, terms32) == want, (rel, q_x)
                alone_differs += (q_x > min(alpha * math.exp(h), threshold)) != want
    assert alone_differs > 0


def test_kernels_count_as_the_pipeline_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled twins add the sampler's counters in their kernels (no counting op after the
    call): padded and ragged calls (a malformed request included), and logits a chunk of requests
    at a time, leave the counters the reference path (counting after the call) leaves."""
    from spec_samplers.registry import get_sampler

    monkeypatch.setattr(cpu, "COMPILED_CHUNK_ELEMENTS", 2 * 4 * 300)  # logits: chunks of two requests
    c = make_case(5, 3, 300, 4, closeness=0.05, greedy="none")
    k_b = torch.tensor([3, 0, 2, 1, 3])
    t, d, ids, cu = ragged_view(c.target, c.draft, c.draft_ids, k_b)
    bad = cu.clone()
    bad[-1] = t.shape[0] + 2
    for name in ("rejection_sampler", "block_verification", "typical_acceptance_sampler"):
        samplers = {b: get_sampler(name, backend=b) for b in ("auto", "torch")}
        for s in samplers.values():
            rnd = {} if name.startswith("typical") else {"seeds": c.seeds}
            s(c.target, c.bonus, c.draft, c.draft_ids, **rnd)
            s.forward_ragged(t, c.bonus, d, ids, cu, 3, **rnd)
            s.forward_ragged(t, c.bonus, d, ids, bad, 3, **rnd)
            s.forward_from_logits(c.target_logits, c.bonus, c.draft_logits, c.draft_ids, c.temperature, **rnd)
        auto, ref = samplers["auto"], samplers["torch"]
        assert next(iter(auto._prepared.values())).kernel_counts  # (the twin counts)
        assert torch.equal(auto._counts, ref._counts) and auto._counts[0] > 0, (name, auto._counts, ref._counts)
        assert auto.num_draft_tokens == ref.num_draft_tokens


@pytest.mark.quick
def test_sampling_draws_equal_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """sampling_from_probs and sampling_from_logits without filters on CPU fp32 rows
    (``cpu.draw.sample_rows``) and the decoding loop's draw (``cpu.draw.decode_rows``: its per-draw
    seed derived in the kernel) give the reference's tokens and valid flags: rows with NaN, inf
    and negative entries, rows without mass (all -inf logits), a lone subnormal, output rows
    outside the input, extreme seeds and offsets, a scalar seed."""
    from spec_samplers.cpu import draw as cpu_draw
    from spec_samplers.decoding import strategy
    from spec_samplers.rng import derive_seeds
    from spec_samplers.sampling import sampling_from_logits, sampling_from_probs

    calls: list[str] = []
    for name in ("sample_rows", "decode_rows"):
        original = getattr(cpu_draw, name)
        monkeypatch.setattr(cpu_draw, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    gen = torch.Generator().manual_seed(5)
    for V in (1, 9, 3000):
        p = torch.rand(6, V, generator=gen) ** 6
        p[1] = 0.0
        p[2, ::2] = float("nan")
        p[2, -1] = float("inf")
        p[3, 0] = -1.0
        p[4] = 0.0
        p[4, -1] = 1e-40
        for _ in range(8):
            seeds = torch.randint(-(2**63), 2**63 - 1, (6,), generator=gen)
            offsets = torch.randint(0, 2**50, (6,), generator=gen)
            rows = torch.tensor([0, 5, -1, 2, 6, 4, 1, 3])
            row_seeds = torch.randint(-(2**63), 2**63 - 1, (8,), generator=gen)
            zeros = torch.zeros(8, dtype=torch.int64)
            for indices, s, o in ((None, seeds, offsets), (rows, row_seeds, zeros), (None, 11, 5)):
                auto = sampling_from_probs(p, indices, seed=s, offset=o, return_valid=True)
                ref = sampling_from_probs(p, indices, seed=s, offset=o, return_valid=True, backend="torch")
                assert torch.equal(auto[0], ref[0]) and torch.equal(auto[1], ref[1])
                logits = torch.where(p > 0, p.log() * 4, float("-inf"))  # NaN and inf rows stay as they are
                logits[2] = p[2]
                auto = sampling_from_logits(logits, indices, seed=s, offset=o)
                assert torch.equal(auto, sampling_from_logits(logits, indices, seed=s, offset=o, backend="torch"))
            streams = ((0, strategy.DRAFT_STREAM), (7, strategy.BONUS_STREAM), (2**20, strategy.STEP_STREAM))
            for position, stream in streams:
                drawn = strategy.draw(p, seeds, offsets, position, stream)
                ds = derive_seeds(seeds, offsets, torch.full((6,), position), stream)
                ref = sampling_from_probs(p, seed=ds, offset=torch.zeros_like(ds), backend="torch")
                assert torch.equal(drawn, ref.to(torch.int64))
    # strided and expanded rows: the compiled path reads them as the reference does
    base = torch.rand(3000, 4, generator=gen) ** 6
    seeds = torch.randint(-(2**63), 2**63 - 1, (4,), generator=gen)
    zeros = torch.zeros(4, dtype=torch.int64)
    for probs in (base.T, base.T[:1].expand(4, -1)):  # [4, 3000]: strided, then expanded (stride 0)
        assert not probs.is_contiguous()
        auto = sampling_from_probs(probs, seed=seeds, offset=zeros, return_valid=True)
        ref = sampling_from_probs(probs, seed=seeds, offset=zeros, return_valid=True, backend="torch")
        assert torch.equal(auto[0], ref[0]) and torch.equal(auto[1], ref[1])
        logits = probs.log()
        ref = sampling_from_logits(logits, seed=seeds, offset=zeros, backend="torch")
        assert torch.equal(sampling_from_logits(logits, seed=seeds, offset=zeros), ref)
        drawn = strategy.draw(probs, seeds, zeros, 3, strategy.DRAFT_STREAM)
        ds = derive_seeds(seeds, zeros, torch.full((4,), 3), strategy.DRAFT_STREAM)
        ref = sampling_from_probs(probs, seed=ds, offset=torch.zeros_like(ds), backend="torch")
        assert torch.equal(drawn, ref.to(torch.int64))
    assert calls.count("sample_rows") == 148 and calls.count("decode_rows") == 74


def test_kernels_count_into_each_samplers_own_buffer() -> None:
    """The twins keep the numpy view of the last counters buffer (cpu._counts): two samplers called
    in turn, and a counter a caller assigns between calls (a new buffer), each leave the counts
    of the reference path."""
    from spec_samplers.registry import get_sampler

    c = make_case(3, 2, 64, 7, closeness=0.05, greedy="none")
    samplers = {(i, b): get_sampler("rejection_sampler", backend=b) for i in (0, 1) for b in ("auto", "torch")}
    for step in range(3):
        for (i, _), s in samplers.items():
            s(c.target, c.bonus, c.draft, c.draft_ids, seeds=c.seeds + i + 10 * step)
            if step == 1 and i == 0:
                s.num_accepted_tokens = torch.tensor(5)  # folded into a new buffer at the next call
    for i in (0, 1):
        auto, ref = samplers[(i, "auto")], samplers[(i, "torch")]
        assert torch.equal(auto._counts, ref._counts) and auto._counts[1] > 0, (i, auto._counts, ref._counts)
    assert samplers[(0, "auto")].num_accepted_tokens >= 5


def test_verify_batch_init_is_its_fields() -> None:
    """VerifyBatch's written-out __init__ (layout.py: cheaper than the generated frozen one) takes
    exactly its dataclass fields, with their defaults; the instance stays frozen, and strided [B]
    fields are made contiguous."""
    import dataclasses
    import inspect

    params = list(inspect.signature(VerifyBatch.__init__).parameters.values())[1:]
    fields = dataclasses.fields(VerifyBatch)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        assert p.default == (inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default), p.name
    c = make_case(3, 2, 50, 1)
    seeds = torch.arange(6)[::2]
    batch = VerifyBatch.padded(c.target, c.bonus, c.draft, c.draft_ids, seeds=seeds, is_greedy=c.is_greedy)
    assert batch.seeds is not None and batch.seeds.is_contiguous() and torch.equal(batch.seeds, seeds)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.seeds = None  # type: ignore[misc]
    assert dataclasses.replace(batch, seeds=c.seeds).seeds is c.seeds


@pytest.mark.parametrize("sampler", ["rejection", "block", "typical"])
def test_in_place_reads_every_tensor_as_the_reference(sampler: str) -> None:
    """The padded fp32 path passes addresses (cpu._in_place): strided and negative-bit rows,
    int32 ids and bonus, strided [B] tensors, rows that require grad, offsets, greedy rows and
    point-mass drafts all give the reference's tokens (each tensor read as its values)."""
    B, K, V = 4, 3, 97
    twins: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor], dict[str, float]]] = {
        "rejection": (rejection_reference, cpu.rejection_cpu, {}),
        "block": (block_reference, cpu.block_cpu, {}),
        "typical": (typical_reference, cpu.typical_cpu, TYPICAL),
    }
    reference, twin, options = twins[sampler]
    for seed in range(4):
        c = make_case(B, K, V, seed, closeness=2.0)
        wide = torch.zeros(B, K + 1, 2 * V)
        wide[..., ::2] = c.target
        # the draft's values behind a negative bit: a strided view, and a contiguous one
        strided_neg = torch.view_as_complex(torch.stack([torch.zeros_like(c.draft), -c.draft], -1)).conj().imag
        contiguous_neg = torch._neg_view(-c.draft)
        for t in (strided_neg, contiguous_neg):
            assert t.is_neg() and torch.equal(t, c.draft)
        assert contiguous_neg.is_contiguous()
        variants: dict[str, dict[str, Any]] = {
            "strided target": dict(target=wide[..., ::2]),
            "strided negative-bit draft": dict(draft=strided_neg),
            "negative-bit draft": dict(draft=contiguous_neg),
            "int32 ids": dict(draft_token_ids=c.draft_ids.to(torch.int32), bonus_token_ids=c.bonus.to(torch.int32)),
            "grad target": dict(target=c.target.clone().requires_grad_()),
            "strided seeds": dict(seeds=torch.stack([c.seeds, c.seeds], 1)[:, 0]),
            "offsets": dict(offsets=torch.arange(B) * 7),
            "greedy": dict(is_greedy=c.is_greedy),
            "point-mass": dict(draft=None),
        }
        for name, change in variants.items():
            args: dict[str, Any] = dict(target=c.target, bonus_token_ids=c.bonus, draft=c.draft, seeds=c.seeds)
            args["draft_token_ids"] = c.draft_ids
            args.update(change)
            batch = VerifyBatch.padded(**args)
            assert cpu._in_place(batch, None if sampler == "typical" else "x") is not None, name
            want = reference(_detached(batch), **options)
            got = cpu.run_compiled(twin, batch, **options)
            assert torch.equal(got, want), f"{sampler} {name} seed {seed}: {got.tolist()} != {want.tolist()}"


def _detached(batch: VerifyBatch) -> VerifyBatch:
    """``batch`` with its rows detached (the references' torch ops need no grad)."""
    import dataclasses

    draft = None if batch.draft is None else batch.draft.detach()
    return dataclasses.replace(batch, target=batch.target.detach(), draft=draft)
