"""Sampling kernels (spec_samplers.kernels.sampling_launch) vs the PyTorch reference.

Tokens, validity flags, kept sets, renormalised probabilities and masked logits must be equal
(torch.equal), not close: the kernels' pivot search must end on the exact threshold the
reference's sort finds. Softmax is compared with a tolerance (its row sums are accumulated in a
different order). On CPU the kernels run through TRITON_INTERPRET=1 (tests/conftest.py), so the
shapes stay tiny; ``split`` forces several vocabulary blocks and short vector steps.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from conftest import run_compile_check
from sampling_cases import FILTERS, filter_kwargs

import spec_samplers.sampling as sampling
from spec_samplers.kernels import sampling_kernels as sk
from spec_samplers.kernels import sampling_launch as sl
from spec_samplers.kernels.backend import vocab_split
from spec_samplers.sampling import reference as ref

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SPLITS = [dict(block_v=16, num_blocks=3), dict(block_v=64, num_blocks=1)]


def _split(V: int, B: int, kw: dict) -> object:
    return vocab_split(V, B, DEVICE, **kw)


def _rows(kind: str, B: int, V: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """[B, V] probabilities with ties, zeros, wide ranges (or logits with -inf / NaN / +inf)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.3, 8.0, B)[:, None]
    x = torch.softmax(torch.randn(B, V, generator=g) * scale, -1)
    x[0, : V // 4] = x[0, V // 4]  # a long tie
    x[1 % B, V // 2 :] = 0.0  # zeros
    if B > 2:
        x[2, :] = torch.rand(V, generator=g) ** 8  # unnormalised, values over many octaves
    if B > 3:
        x[3, :] = (torch.randint(0, 4, (V,), generator=g).float() + 1) / (2.5 * V)  # few distinct values
    if kind == "logits":
        x = torch.log(x)
        x[B - 1, 1] = float("nan")
        x[B - 1, 2] = float("inf") if B > 1 else x[B - 1, 2]
    return x.to(dtype).to(DEVICE)


def _params(B: int, V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    top_k = torch.tensor([1, 3, 0, V - 1, V, 7, -2, 2][:B], dtype=torch.int64).to(DEVICE)
    top_p = (torch.tensor([0.5, 0.9, 1.0, 0.3, 0.99, 1e-3, 0.7, 0.8][:B])).to(DEVICE)
    min_p = (torch.rand(B, generator=g) * 0.5).to(DEVICE)
    seeds = torch.randint(0, 2**62, (B,), generator=g).to(DEVICE)
    offsets = torch.randint(0, 2**40, (B,), generator=g).to(DEVICE)
    return top_k, top_p, min_p, seeds, offsets


@pytest.mark.parametrize("split", SPLITS, ids=["split3", "split1"])
@pytest.mark.parametrize("logits", [False, True], ids=["probs", "logits"])
@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: "+".join(f) or "plain")
def test_sample_kernel_equals_reference(filters, logits, split):
    B, V = 4, 40
    x = _rows("logits" if logits else "probs", B, V, seed=len(filters) + 10 * logits)
    top_k, top_p, min_p, seeds, offsets = _params(B, V, seed=3)
    rows = torch.tensor([0, 3, 1, 2], device=DEVICE)
    kw = filter_kwargs(filters, top_k, top_p, min_p)
    want = ref.sample_reference(x, rows, seeds, offsets, logits, **kw, fast=False)
    got = sl.sample_triton(x=x, rows=rows, seeds=seeds, offsets=offsets, logits=logits, split=_split(V, B, split), **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"kernel {got}\nreference {want}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sample_kernel_half_precision_and_indices(dtype):
    B, V = 3, 33
    x = _rows("probs", B, V, seed=5, dtype=dtype)
    top_k, top_p, _, seeds, offsets = _params(4, V, seed=4)
    rows = torch.tensor([2, 0, 7, -1], device=DEVICE)  # out-of-range rows read nothing
    want = ref.sample_reference(x, rows, seeds, offsets, False, top_k=top_k, top_p=top_p, fast=False)
    got = sl.sample_triton(
        x=x, rows=rows, seeds=seeds, offsets=offsets, top_k=top_k, top_p=top_p, split=_split(V, 4, SPLITS[0])
    )
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[0][2:].tolist() == [-1, -1]


@pytest.mark.parametrize("scratch", [None, 3], ids=["candidates-fit", "scratch-3"])
@pytest.mark.parametrize("kind", ["wide", "ties", "subnormal", "logits"])
def test_pivot_search_finds_the_exact_threshold(kind, scratch, monkeypatch):
    """Every k in 1..V and a ladder of top_p: the kernels' tau equals the sorted reference's,
    whether a search's candidates fit in its scratch row at once or only after passes over the
    whole row (a scratch row of 3 entries)."""
    if scratch is not None:
        monkeypatch.setattr(sk, "SEARCH_SCRATCH", scratch)
    g = torch.Generator().manual_seed(zlib.crc32(kind.encode()))
    V = 24
    if kind == "wide":
        x = torch.exp(torch.rand(V, generator=g) * -80)  # 1e-35 .. 1
    elif kind == "ties":
        x = torch.randint(0, 3, (V,), generator=g).float() / 8
    elif kind == "subnormal":
        x = torch.rand(V, generator=g) * 1e-39
        x[:3] = torch.tensor([1e-45, 0.0, 3e-38])
    else:
        x = torch.randn(V, generator=g) * 30
        x[:4] = torch.tensor([float("-inf"), -1e30, 1e30, 0.0])
    logits = kind == "logits"
    B = V + 1
    xs = x[None].expand(B, V).contiguous().to(DEVICE)
    rows = torch.arange(B, device=DEVICE)
    top_k = torch.arange(B, device=DEVICE)  # 0 (off) .. V (off)
    top_p = torch.linspace(0.0, 1.0, B, device=DEVICE).float()
    values, weights = ref.values_and_weights(xs, logits)
    for kw in (dict(top_k=top_k), dict(top_p=top_p), dict(top_k=top_k, top_p=top_p)):
        want, want_mass = ref.filter_threshold(values, weights, kw.get("top_k"), kw.get("top_p"), None, fast=False)
        got, _, got_mass = sl.thresholds_triton(
            xs,
            rows,
            logits,
            kw.get("top_k"),
            kw.get("top_p"),
            None,
            False,
            need_kept_mass=len(kw) == 1,
        )
        assert torch.equal(got, want), (kw.keys(), got, want)
        if len(kw) == 1:
            assert torch.equal(got_mass, want_mass)


def test_search_needs_at_most_max_passes():
    """The widest key interval (the -inf logit to the largest finite one) closes in MAX_PASSES."""
    assert (sk.PIVOTS + 1) ** sk.MAX_PASSES >= 2**32
    V = 64
    x = torch.full((1, V), -3.0e38)
    x[0, 0], x[0, 1] = float("-inf"), 3.0e38
    x[0, 2:] = -torch.logspace(-30, 38, V - 2)  # spread over the whole key range
    x = x.to(DEVICE)
    values, weights = ref.values_and_weights(x, True)
    for k in range(1, V + 1):
        top_k = torch.tensor([k], device=DEVICE)
        want, _ = ref.filter_threshold(values, weights, top_k, None, None)
        got, _, _ = sl.thresholds_triton(
            x, torch.zeros(1, dtype=torch.int64, device=DEVICE), True, top_k, None, None, False
        )
        assert torch.equal(got, want), k


@pytest.mark.parametrize("split", SPLITS, ids=["split3", "split1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_renorm_and_mask_kernels_are_exact(dtype, split):
    B, V = 4, 40
    probs = _rows("probs", B, V, seed=7, dtype=dtype)
    logits = _rows("logits", B, V, seed=8, dtype=dtype)
    top_k, top_p, _, _, _ = _params(B, V, seed=5)
    s = _split(V, B, split)
    assert torch.equal(
        sl.renorm_triton(probs=probs, top_k=top_k, out_dtype=dtype, split=s),
        ref.renorm_reference(probs, top_k, None, dtype),
    )
    assert torch.equal(sl.renorm_triton(probs=probs, top_p=top_p, split=s), ref.renorm_reference(probs, None, top_p))
    assert torch.equal(
        sl.mask_logits_triton(logits=logits, top_k=top_k, split=s), ref.mask_logits_reference(logits, top_k)
    )


@pytest.mark.parametrize("split", SPLITS, ids=["split3", "split1"])
def test_softmax_kernel(split):
    B, V = 4, 40
    logits = _rows("logits", B, V, seed=9)
    logits[2] = float("-inf")
    temperature = torch.tensor([1.0, 0.0, 0.7, 2.0], device=DEVICE)
    got = sl.softmax_triton(logits=logits, temperature=temperature, split=_split(V, B, split))
    want = ref.softmax_reference(logits, temperature, fast=False)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], torch.zeros(V, device=DEVICE))


def test_public_api_backends_agree():
    """Every public op on backend="triton" equals backend="torch" (tokens, validity, outputs)."""
    B, V = 3, 24
    probs = _rows("probs", B, V, seed=11)
    logits = _rows("logits", B, V, seed=12)
    seeds, offsets = _params(B, V, seed=6)[3:]
    idx = torch.tensor([2, 2, 0, 1], device=DEVICE, dtype=torch.int32)
    s4, o4 = _params(4, V, seed=7)[3:]
    calls = [
        lambda **b: sampling.sampling_from_probs(probs, seed=seeds, offset=offsets, return_valid=True, **b),
        lambda **b: sampling.sampling_from_logits(logits, indices=idx, seed=s4, offset=o4, **b),
        lambda **b: sampling.top_k_sampling_from_probs(
            probs, torch.tensor([1, 5, 0], device=DEVICE), seed=7, offset=3, **b
        ),
        lambda **b: sampling.top_p_sampling_from_probs(probs, 0.8, indices=idx, seed=s4, offset=o4, **b),
        lambda **b: sampling.min_p_sampling_from_probs(probs, 0.2, seed=seeds, offset=offsets, **b),
        lambda **b: sampling.top_k_top_p_sampling_from_logits(logits, 5, 0.9, seed=seeds, offset=offsets, **b),
        lambda **b: sampling.top_k_top_p_sampling_from_probs(
            probs, 4, 0.6, filter_apply_order="joint", seed=seeds, offset=offsets, **b
        ),
        lambda **b: sampling.top_k_renorm_probs(probs, 3, **b),
        lambda **b: sampling.top_p_renorm_probs(probs, 0.7, **b),
        lambda **b: sampling.top_k_mask_logits(logits, 4, **b),
    ]
    for i, call in enumerate(calls):
        a, b = call(backend="triton"), call(backend="torch")
        a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), i
    d = torch.softmax(torch.randn(B, 2, V), -1).to(DEVICE)
    t = torch.softmax(torch.randn(B, 3, V), -1).to(DEVICE)
    ids = torch.randint(0, V, (B, 2), device=DEVICE)
    a = sampling.chain_speculative_sampling(d, ids, t, seed=seeds, offset=offsets, backend="triton")
    b = sampling.chain_speculative_sampling(d, ids, t, seed=seeds, offset=offsets, backend="torch")
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_chain_speculative_sampling_kernels_equal_reference_in_every_seed_form():
    """The kernels' path (rows' randomness, rejection kernel, counters kernel) gives the
    reference's tokens and counters, in every seed form and with given counters (added to)."""
    g = torch.Generator().manual_seed(4)
    B, n, V = 3, 3, 300
    d = torch.softmax(torch.randn(B, n, V, generator=g), -1).to(DEVICE)
    t = torch.softmax(torch.randn(B, n + 1, V, generator=g) * 0.3, -1).to(DEVICE)
    ids = torch.multinomial(d.view(-1, V).cpu(), 1, generator=g).view(B, n).to(DEVICE)
    i64 = dict(dtype=torch.int64, device=DEVICE)
    forms = [
        dict(seed=torch.tensor([5, 6, 7], **i64), offset=torch.tensor([0, 3, 1], **i64)),
        dict(seed=5, offset=3),
        dict(seed=torch.tensor([5], **i64), offset=torch.tensor([1, 2, 3], **i64)),
        dict(seed=torch.tensor([5, 6, 7], dtype=torch.int32, device=DEVICE), offset=9),
        dict(generator="3"),
    ]
    for form in forms:
        for counters in (False, True):
            outs = []
            for backend in ("triton", "torch"):
                kw = dict(form)
                if "generator" in kw:  # a fresh generator per backend, same state
                    kw["generator"] = torch.Generator(device=DEVICE).manual_seed(3)
                given = (torch.tensor([1, 2, 3], **i64), torch.tensor([4, 5, 6], dtype=torch.int32, device=DEVICE))
                args = (d, ids, t, *(given if counters else ()))
                outs.append(sampling.chain_speculative_sampling(*args, **kw, backend=backend))
            a, b = outs
            assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True)), (form, counters)


def test_gpu_check_hook_runs():
    """bench.sampling_ops.check_backends_agree (what gpu_check can call at real sizes) on a tiny shape."""
    from spec_samplers.bench.sampling_ops import check_backends_agree

    assert check_backends_agree(DEVICE, 2, 64) == []


def test_every_sampling_kernel_variant_compiles_for_sm90(tmp_path):
    """The interpreter accepts programs the compiler rejects: compile every reachable variant
    (no GPU needed: Triton ships ptxas)."""
    assert "compiled all sampling kernel variants" in run_compile_check("sampling_compile_check.py", tmp_path)


@pytest.mark.parametrize("seed", [0, 7, -(2**63), 2**63 - 1])
def test_row_seeds_kernel_equals_pytorch_philox(seed):
    """derive_row_seeds on CUDA runs one kernel; its seeds are the PyTorch Philox's, bit for bit."""
    from spec_samplers.rng import STREAM_ROW_SEED, derive_seeds

    s = torch.tensor([seed], dtype=torch.int64)
    o = torch.tensor([(seed * 31 + 5) % 2**62], dtype=torch.int64)
    n = 300  # two programs of the kernel, the second one partial
    want = derive_seeds(s, o, torch.arange(n), STREAM_ROW_SEED)
    got = sl.row_seeds_triton(s.to(DEVICE), o.to(DEVICE), n)
    assert torch.equal(got.cpu(), want)
    assert sl.row_seeds_triton(s.to(DEVICE), o.to(DEVICE), 0).shape == (0,)


PARAM_DTYPES = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.bfloat16, torch.float64]


@pytest.mark.parametrize("dtype", PARAM_DTYPES, ids=str)
def test_kernels_normalise_parameters_as_given_like_the_reference(dtype):
    """The kernels read per-request parameters as the caller gave them (any real dtype, NaN,
    +-inf, out of range) and normalise them in their prologue: the same outputs as the reference,
    which reads the canonical tensors (validation.canonical_*)."""
    B, V = 5, 24
    probs = _rows("probs", B, V, seed=21)
    logits = _rows("logits", B, V, seed=22)
    floating = dtype.is_floating_point
    k = [2.9, float("nan"), float("inf"), -1.5, 30.0] if floating else [2, 0, 1, 7, 1]
    p = [0.5, float("nan"), 2.0, 0.25, 1.0] if floating else [1, 0, 1, 1, 0]
    m = [0.1, float("nan"), 0.0, 0.5, 1.0] if floating else [0, 1, 0, 0, 1]
    t = [0.7, float("nan"), float("inf"), -1.0, 0.0] if floating else [1, 0, 2, 1, 0]
    k, p, m, t = (torch.tensor(v, dtype=torch.float64).to(dtype).to(DEVICE) for v in (k, p, m, t))
    if dtype == torch.bool:
        k, p, m, t = (v.to(torch.bool) for v in (k, p, m, t))
    seeds, offsets = _params(B, V, seed=9)[3:]
    rnd = dict(seed=seeds, offset=offsets)
    calls = [
        lambda **b: sampling.top_k_sampling_from_probs(probs, k, **rnd, return_valid=True, **b),
        lambda **b: sampling.top_p_sampling_from_probs(probs, p, **rnd, **b),
        lambda **b: sampling.min_p_sampling_from_probs(probs, m, **rnd, **b),
        lambda **b: sampling.top_k_top_p_sampling_from_logits(logits, k, p, **rnd, **b),
        lambda **b: sampling.top_k_renorm_probs(probs, k, **b),
        lambda **b: sampling.top_p_renorm_probs(probs, p, **b),
        lambda **b: sampling.top_k_mask_logits(logits, k, **b),
    ]
    for i, call in enumerate(calls):
        a, b = call(backend="triton"), call(backend="torch")
        a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), (dtype, i)
    a, b = sampling.softmax(logits, t, backend="triton"), sampling.softmax(logits, t, backend="torch")
    assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), dtype


@pytest.mark.parametrize(
    "rnd",
    [
        dict(seed=7),  # one seed for the batch, offset 0: the rows' seeds derive in the kernel
        dict(seed=7, offset=3),
        dict(seed=torch.tensor([-(2**63)]), offset=torch.tensor([5], dtype=torch.int32)),
        dict(seed=2**64 - 1, offset=torch.tensor([0, 9, 2**40, 1])),  # per-row offsets, derived at 0
        dict(seed=torch.tensor([3, 1, 4, 1], dtype=torch.int32)),  # per-row seeds, offset 0
        dict(seed=torch.tensor([3, 1, 4, 1]), offset=11),
    ],
    ids=["int", "int-int", "t1-t1", "int-tB", "tB-int32", "tB-int"],
)
def test_kernels_read_every_seed_form_like_the_reference(rnd):
    """Scalar seeds and offsets (Python ints, length-1 tensors) and per-row ones reach the race's
    finalize as given; it derives the rows' seeds itself: the reference's tokens, bit for bit."""
    B, V = 4, 40
    rnd = {key: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for key, v in rnd.items()}
    probs, logits = _rows("probs", B, V, seed=31), _rows("logits", B, V, seed=32)
    for call in (
        lambda **b: sampling.sampling_from_probs(probs, **rnd, **b),
        lambda **b: sampling.sampling_from_logits(logits, indices=torch.tensor([3, 0, 0, 2]).to(DEVICE), **rnd, **b),
        lambda **b: sampling.top_k_top_p_sampling_from_probs(probs, 5, 0.8, **rnd, **b),
        lambda **b: sampling.min_p_sampling_from_probs(probs, 0.1, **rnd, **b),
    ):
        assert torch.equal(call(backend="triton"), call(backend="torch")), rnd
