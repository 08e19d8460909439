"""The compiled CPU path of the filtered sampling operations (``cpu.draw.sample_filtered_rows``,
``renorm_rows``, ``mask_logits_rows``: numba kernels in ``cpu._filter_kernels``) against the
PyTorch reference (``backend="torch"``), token for token and float for float.

``backend="auto"`` on CPU fp32 rows runs the kernels; other dtypes fall back to the reference (the
calls must still agree). The kernels find the reference's thresholds without sorting (a radix
select over the values' bits and fixed-point masses), so ties at a threshold, disabled filters
(k <= 0, k >= V, top_p >= 1, min_p 0), degenerate parameters (top_p 0, min_p 1) and non-finite
entries are the cases that tell a wrong threshold from the right one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import spec_samplers.sampling as S
from spec_samplers import cpu
from spec_samplers.cpu import draw as cpu_draw

assert cpu.kernels() is not None, "numba must import for these tests (pip install -e '.[test]')"

VOCABS = (1, 7, 256, 1000, 32000)
ORDERS = ("top_k_first", "joint")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The compiled entry points called during a test, in order."""
    seen: list[str] = []
    for name in ("sample_filtered_rows", "renorm_rows", "mask_logits_rows"):
        original = getattr(cpu_draw, name)

        def spy(*a: Any, _f: Callable[..., Any] = original, _n: str = name, **kw: Any) -> Any:
            seen.append(_n)
            return _f(*a, **kw)

        monkeypatch.setattr(cpu_draw, name, spy)
    return seen


def _probs_rows(B: int, V: int, gen: torch.Generator) -> torch.Tensor:
    """Rows of several shapes: peaked and flat softmaxes, powers of uniforms, quantised rows
    (ties everywhere, at every threshold), a row with a few large entries."""
    kinds = [
        torch.softmax(torch.randn(V, generator=gen) * 3, -1),
        torch.softmax(torch.randn(V, generator=gen) * 0.3, -1),
        torch.rand(V, generator=gen) ** 6,
        torch.randint(0, 4, (V,), generator=gen).float() / 8,
        torch.where(torch.rand(V, generator=gen) < 0.01, 1.0, 1e-6),
    ]
    return torch.stack([kinds[i % len(kinds)] for i in range(B)])


def _params(B: int, V: int, gen: torch.Generator) -> Iterator[dict[str, Any]]:
    """Per-row tensors covering the edges, and scalars."""
    ks = torch.tensor([0, -3, 1, 2, V - 1, V, V + 5, 50, 3, 7])
    ps = torch.tensor([0.0, 1e-30, 0.5, 0.9, 1.0, 1.5, float("nan"), 0.2, 0.99, 1e-7])
    mps = torch.tensor([0.0, 1.0, 0.1, 0.5, 2.0, -1.0, float("nan"), 0.9, 0.01, 0.3])
    idx = torch.randint(0, 10, (B,), generator=gen)
    yield dict(top_k=ks[idx], top_p=ps[idx], min_p=mps[idx])
    yield dict(
        top_k=torch.randint(-1, V + 2, (B,), generator=gen),
        top_p=torch.rand(B, generator=gen),
        min_p=torch.rand(B, generator=gen),
    )
    yield dict(top_k=5, top_p=0.9, min_p=0.1)
    yield dict(top_k=1, top_p=1.0, min_p=0.0)
    yield dict(top_k=V, top_p=1e-9, min_p=1.0)


def _seeds(B: int, gen: torch.Generator) -> Iterator[tuple[Any, Any]]:
    yield torch.randint(-(2**63), 2**63 - 1, (B,), generator=gen), torch.randint(0, 2**50, (B,), generator=gen)
    yield 11, 5


def _check_sample(
    op: Callable[..., Any], x: torch.Tensor, args: tuple[Any, ...], valid: bool = True, **kw: Any
) -> None:
    """The op's tokens (and valid flags) under "auto" equal the reference's."""
    extra = dict(return_valid=True) if valid else {}
    auto = op(x, *args, **kw, **extra)
    ref = op(x, *args, **kw, **extra, backend="torch")
    if valid:
        assert torch.equal(auto[0], ref[0]), (op.__name__, auto[0], ref[0])
        assert torch.equal(auto[1], ref[1]), (op.__name__, auto[1], ref[1])
    else:
        assert torch.equal(auto, ref), (op.__name__, auto, ref)


def _all_ops(x: torch.Tensor, logits: torch.Tensor, prm: dict[str, Any], **kw: Any) -> None:
    _check_sample(S.top_k_sampling_from_probs, x, (prm["top_k"],), **kw)
    _check_sample(S.top_p_sampling_from_probs, x, (prm["top_p"],), **kw)
    _check_sample(S.min_p_sampling_from_probs, x, (prm["min_p"],), **kw)
    for order in ORDERS:
        args = (prm["top_k"], prm["top_p"])
        _check_sample(S.top_k_top_p_sampling_from_probs, x, args, filter_apply_order=order, **kw)
        _check_sample(S.top_k_top_p_sampling_from_logits, logits, args, valid=False, filter_apply_order=order, **kw)


@pytest.mark.parametrize("V", VOCABS)
def test_filtered_sampling_equals_the_reference(V: int, calls: list[str]) -> None:
    """Random rows of every shape, every filter and order, per-row and scalar parameters and
    seeds: the reference's tokens and valid flags."""
    gen = torch.Generator().manual_seed(V)
    B = 5 if V == 32000 else 12
    probs = _probs_rows(B, V, gen)
    logits = torch.randn(B, V, generator=gen) * 4
    logits[::3] = torch.round(logits[::3])  # ties among logits
    for prm in _params(B, V, gen):
        for seed, offset in _seeds(B, gen):
            _all_ops(probs, logits, prm, seed=seed, offset=offset)
    assert calls and set(calls) == {"sample_filtered_rows"}


@pytest.mark.parametrize("V", (7, 256, 1000))
def test_filtered_sampling_edge_rows(V: int, calls: list[str]) -> None:
    """NaN, inf and negative probabilities, rows without mass (all zero, all NaN; all -inf
    logits), a lone subnormal, +inf / -inf / NaN logits, huge logits."""
    gen = torch.Generator().manual_seed(100 + V)
    p = torch.rand(8, V, generator=gen) ** 4
    p[0] = 0.0
    p[1, ::2] = float("nan")
    p[1, -1] = float("inf")
    p[2, 0] = -1.0
    p[2, 1::3] = -0.0
    p[3] = float("nan")
    p[4] = 0.0
    p[4, -1] = 1e-40
    p[5, :3] = float("inf")
    p[6] = 1e-38
    logits = torch.randn(8, V, generator=gen) * 3
    logits[0] = float("-inf")
    logits[1, ::2] = float("nan")
    logits[2, 0] = float("inf")
    logits[3, 1] = float("inf")
    logits[3, 2] = float("-inf")
    logits[4] = float("nan")
    logits[5] = 3.0e38
    logits[5, 0] = -3.0e38
    logits[6, : V // 2] = float("-inf")
    for prm in _params(8, V, gen):
        for seed, offset in _seeds(8, gen):
            _all_ops(p, logits, prm, seed=seed, offset=offset)
    assert calls and set(calls) == {"sample_filtered_rows"}


def test_filtered_sampling_layouts(calls: list[str]) -> None:
    """``indices`` (rows repeated, out of range), non-contiguous and expanded inputs, B = 0."""
    gen = torch.Generator().manual_seed(3)
    V = 300
    base = _probs_rows(6, 2 * V, gen)
    strided = base[:, ::2]  # non-contiguous rows
    transposed = _probs_rows(V, 6, gen).t()  # [6, V], column-major
    expanded = base[:1, :V].expand(6, V)
    logits = torch.randn(6, 2 * V, generator=gen)[:, 1::2]
    rows = torch.tensor([0, 5, 5, 2, 0, 4, 1, 3, 5])
    prm = dict(
        top_k=torch.randint(0, 40, (9,), generator=gen),
        top_p=torch.rand(9, generator=gen),
        min_p=torch.rand(9, generator=gen) / 2,
    )
    for x in (strided, transposed, expanded):
        assert not x.is_contiguous()
        _all_ops(x, logits, prm, indices=rows, seed=torch.arange(9), offset=torch.zeros(9, dtype=torch.int64))
        _all_ops(x, logits, dict(top_k=7, top_p=0.8, min_p=0.2), seed=3, offset=1)
    empty = torch.zeros(0, dtype=torch.int64)
    prm0 = dict(top_k=torch.zeros(0, dtype=torch.int64), top_p=torch.zeros(0), min_p=torch.zeros(0))
    _all_ops(base, logits, prm0, indices=empty, seed=empty, offset=empty)
    _all_ops(base, logits, dict(top_k=3, top_p=0.5, min_p=0.5), indices=empty, seed=1, offset=0)
    assert calls and set(calls) == {"sample_filtered_rows"}


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_half_inputs_fall_back_and_agree(dtype: torch.dtype, calls: list[str]) -> None:
    """fp16 / bf16 rows run the reference under "auto" (the kernels read fp32): the same tokens."""
    gen = torch.Generator().manual_seed(4)
    p = _probs_rows(6, 500, gen).to(dtype)
    logits = (torch.randn(6, 500, generator=gen) * 3).to(dtype)
    _all_ops(p, logits, dict(top_k=torch.tensor([1, 5, 0, 499, 500, 20]), top_p=0.7, min_p=0.05), seed=2, offset=9)
    for k in (3, torch.tensor([0, 1, 2, 3, 499, 600])):
        assert torch.equal(S.top_k_renorm_probs(p, k), S.top_k_renorm_probs(p, k, backend="torch"))
        assert torch.equal(S.top_k_mask_logits(logits, k), S.top_k_mask_logits(logits, k, backend="torch"))
    assert torch.equal(S.top_p_renorm_probs(p, 0.6), S.top_p_renorm_probs(p, 0.6, backend="torch"))
    assert calls == []


def test_infinite_min_p_falls_back(calls: list[str]) -> None:
    """An infinite min_p (unchecked tensor) can make the reference's threshold NaN: the
    reference runs, and the calls agree."""
    p = _probs_rows(4, 64, torch.Generator().manual_seed(6))
    p[1] = 0.0
    min_p = torch.tensor([float("inf"), float("inf"), float("-inf"), 0.5])
    _check_sample(S.min_p_sampling_from_probs, p, (min_p,), seed=1, offset=2)
    assert calls == []


@pytest.mark.parametrize("V", VOCABS)
def test_renorm_and_mask_equal_the_reference(V: int, calls: list[str]) -> None:
    """top_k_renorm_probs, top_p_renorm_probs and top_k_mask_logits on fp32 rows: bit for bit the
    reference's output (ties, disabled filters, non-finite entries, rows without mass)."""
    gen = torch.Generator().manual_seed(7 + V)
    B = 5 if V == 32000 else 12
    p = _probs_rows(B, V, gen)
    p[0, ::3] = float("nan")
    p[1, 0] = float("inf")
    p[2] = 0.0
    p[3, 1:] = -1.0
    logits = torch.randn(B, V, generator=gen) * 3
    logits[1::3] = torch.round(logits[1::3])
    logits[0, ::2] = float("nan")
    logits[2] = float("-inf")
    logits[3, 0] = float("inf")
    logits[4] = float("nan")
    g = torch.randint(0, 10, (B,), generator=gen)
    ks = torch.tensor([0, -3, 1, 2, V - 1, V, V + 5, 50, 3, 7])[g]
    ps = torch.tensor([0.0, 1e-30, 0.5, 0.9, 1.0, 1.5, float("nan"), 0.2, 0.99, 1e-7])[g]
    for k in (ks, 1, 10, V):
        assert torch.equal(S.top_k_renorm_probs(p, k), S.top_k_renorm_probs(p, k, backend="torch"))
        assert torch.equal(S.top_k_mask_logits(logits, k), S.top_k_mask_logits(logits, k, backend="torch"))
    for tp in (ps, 0.9, 0.5, 1.0, 1e-6):
        assert torch.equal(S.top_p_renorm_probs(p, tp), S.top_p_renorm_probs(p, tp, backend="torch"))
    for x in (p[:, :: max(V // 2, 1)], p[:1].expand(3, V)):  # non-contiguous, expanded
        assert torch.equal(S.top_k_renorm_probs(x, 2), S.top_k_renorm_probs(x, 2, backend="torch"))
        assert torch.equal(S.top_p_renorm_probs(x, 0.5), S.top_p_renorm_probs(x, 0.5, backend="torch"))
    empty = torch.zeros(0, V)
    assert S.top_k_renorm_probs(empty, 3).shape == (0, V)
    assert S.top_k_mask_logits(empty, 3).shape == (0, V)
    assert set(calls) == {"renorm_rows", "mask_logits_rows"}


def test_thresholds_without_a_sort_keep_ties() -> None:
    """The kept set at a tie: top-k with k inside a run of equal values keeps the whole run, and
    top-p's cut inside a run keeps it too (the renormalised rows show the kept set)."""
    p = torch.tensor([[0.1, 0.3, 0.3, 0.3, 0.0, 0.0]])
    kept = S.top_k_renorm_probs(p, 2) > 0
    assert kept.tolist() == [[False, True, True, True, False, False]]
    kept = S.top_p_renorm_probs(p, 0.4) > 0
    assert kept.tolist() == [[False, True, True, True, False, False]]
    kept = S.top_p_renorm_probs(p, 0.95) > 0  # M(> 0.1) = 0.9 < 0.95: 0.1 is kept, zeros are not
    assert kept.tolist() == [[True, True, True, True, False, False]]
    assert torch.equal(S.top_p_renorm_probs(p, 0.95), S.top_p_renorm_probs(p, 0.95, backend="torch"))


def test_top_p_at_its_exact_boundary(calls: list[str]) -> None:
    """Dyadic rows whose mass above a value equals top_p * total exactly: the value is cut
    (M(> v) < top_p * M is strict), on the compiled path as in the reference; peaked rows whose
    largest entries alone pass top_p (the block maxima's floor decides there)."""
    p = torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.25, 0.25, 0.25, 0.25], [0.125, 0.5, 0.125, 0.25]])
    kept = S.top_p_renorm_probs(p, 0.5) > 0
    assert kept.tolist() == [[True, False, False, False], [True] * 4, [False, True, False, False]]
    kept = S.top_p_renorm_probs(p, 0.75) > 0
    assert kept.tolist() == [[True, True, False, False], [True] * 4, [False, True, False, True]]
    gen = torch.Generator().manual_seed(9)
    for V in (1000, 32000):
        peaked = torch.softmax(torch.randn(6, V, generator=gen) * 8, -1)
        peaked[1] = torch.rand(V, generator=gen) ** 40  # unnormalised
        peaked[2, 7::256] = 0.5  # every block's maximum tied
        for tp in (torch.tensor([0.1, 0.5, 0.9, 0.99, 1e-6, 0.999]), 0.5, 0.95):
            assert torch.equal(S.top_p_renorm_probs(peaked, tp), S.top_p_renorm_probs(peaked, tp, backend="torch"))
            _check_sample(S.top_p_sampling_from_probs, peaked, (tp,), seed=4, offset=1)
            for order in ORDERS:
                args = (torch.tensor([0, 3, 100, 1, 5000, 2]), tp)
                _check_sample(
                    S.top_k_top_p_sampling_from_probs, peaked, args, filter_apply_order=order, seed=1, offset=0
                )
    assert set(calls) == {"renorm_rows", "sample_filtered_rows"}
