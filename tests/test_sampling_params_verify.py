"""Samplers' logits entries with ``sampling_params=``: lossless for the processed target.

Design. Each request r has fixed target logits [k+1, V], draft logits [k, V] and its own
SamplingParams; it is repeated over N rows (distinct seeds), so rows are i.i.d. trials. Drafts are
sampled from the draft processed with the same parameters (float64 reference in tests/params_reference.py, step
by step in vLLM's order). Per request and slot, the emitted token (given the slot is reached)
follows the processed target q'_i: chi-square, significance CHI2_ALPHA = 1e-3 per test (false
failure rate at a random seed; seeds are fixed, so the suite is deterministic). Acceptance at
position 0 is sum_x min(p'_0(x), q'_0(x)), within Z_BOUND = 5 binomial standard errors.
"""

from __future__ import annotations

import pytest
import torch
from params_reference import processed_rows
from stats_helpers import CHI2_ALPHA, binomial_bound, chi2_pvalue

from spec_samplers import RejectionSampler, SamplingParams, SpecSamplerInputError, TypicalAcceptanceSampler
from spec_samplers.sampling_params import process_logits

V = 16
K = 2
N = 6000  # rows per request

REQUESTS = [
    SamplingParams(temperature=0.8, top_p=0.95),  # the trace's request
    SamplingParams(temperature=0),  # greedy
    SamplingParams(top_k=5, min_p=0.05),
    SamplingParams(temperature=1.2, top_k=8, top_p=0.8, min_p=0.02),
]


def make_batch(seed: int, dtype: torch.dtype):
    """Requests x N rows: logits, drafts sampled from the processed draft, params per row."""
    gen = torch.Generator().manual_seed(seed)
    R = len(REQUESTS)
    target = (torch.randn(R, K + 1, V, generator=gen) * 2).to(dtype)
    draft = (target[:, :K].float() + 0.8 * torch.randn(R, K, V, generator=gen)).to(dtype)
    q = torch.stack([processed_rows(target[r], REQUESTS[r]) for r in range(R)])  # [R, K+1, V]
    p = torch.stack([processed_rows(draft[r], REQUESTS[r]) for r in range(R)])  # [R, K, V]
    ids = torch.stack(
        [torch.multinomial(p[r].float(), N, replacement=True, generator=gen).T for r in range(R)]
    )  # [R, N, K]
    bonus = torch.stack([torch.multinomial(q[r, K].float(), N, replacement=True, generator=gen) for r in range(R)])
    rows = R * N
    batch = (
        target.repeat_interleave(N, 0),  # [R*N, K+1, V]
        bonus.reshape(rows, 1),
        draft.repeat_interleave(N, 0),
        ids.reshape(rows, K),
    )
    params = [REQUESTS[r] for r in range(R) for _ in range(N)]
    seeds = torch.randint(0, 2**62, (rows,), generator=gen)
    return batch, params, seeds, q, p


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lossless_for_the_processed_target(dtype):
    (target, bonus, draft, ids), params, seeds, q, p = make_batch(11, dtype)
    out = RejectionSampler(backend="torch").forward_from_logits(
        target, bonus, draft, ids, seeds=seeds, sampling_params=params
    )
    out = out.view(len(REQUESTS), N, K + 1)
    for r, req in enumerate(REQUESTS):
        emitted = out[r] != -1  # [N, K+1]
        for i in range(K + 1):
            # slot i is emitted iff drafts 0..i-1 were accepted, an event of positions < i only,
            # so given it the slot's token has law q'_i
            tokens = out[r][emitted[:, i], i]
            if tokens.numel() >= 50:
                pvalue = chi2_pvalue(tokens, q[r, i])
                assert pvalue > CHI2_ALPHA, f"request {r} ({req}), slot {i}: p = {pvalue:.2e}"
        if req.is_greedy:  # every emitted token is the argmax of its processed target row
            argmax = q[r].argmax(-1)  # [K+1]
            assert bool(((out[r] == argmax) | ~emitted).all())
        else:  # acceptance at position 0 is sum min(p', q') of the processed pair
            theory = float(torch.minimum(p[r, 0], q[r, 0]).sum())
            measured = float(emitted[:, 1].double().mean())
            assert abs(measured - theory) < binomial_bound(theory, N), f"request {r}: {measured:.4f} vs {theory:.4f}"


def test_equals_the_probability_path_and_ragged():
    (target, bonus, draft, ids), params, seeds, _, _ = make_batch(3, torch.float32)
    sel = torch.arange(0, target.shape[0], N // 2)  # a few rows of every request
    target, bonus, draft, ids, seeds = target[sel], bonus[sel], draft[sel], ids[sel], seeds[sel]
    params = [params[i] for i in sel.tolist()]
    B = target.shape[0]
    sampler = RejectionSampler(backend="torch")
    out = sampler.forward_from_logits(target, bonus, draft, ids, seeds=seeds, sampling_params=params)
    q = process_logits(target.reshape(-1, V), [p for p in params for _ in range(K + 1)]).view(B, K + 1, V)
    p = process_logits(draft.reshape(-1, V), [p for p in params for _ in range(K)]).view(B, K, V)
    greedy = torch.tensor([x.is_greedy for x in params])
    assert torch.equal(out, sampler(q, bonus, p, ids, seeds=seeds, is_greedy=greedy))
    cu = torch.arange(1, B + 1) * K
    ragged = sampler.forward_ragged_from_logits(
        target[:, :K].reshape(-1, V),
        bonus[:, 0],
        draft.reshape(-1, V),
        ids.reshape(-1),
        cu,
        K,
        seeds=seeds,
        sampling_params=params,
    )
    # the ragged layout has no bonus rows: equal wherever a draft was rejected
    rejected = (out[:, 1:] == -1).any(dim=1)
    assert torch.equal(ragged[rejected], out[rejected])
    typical = TypicalAcceptanceSampler(backend="torch")
    assert torch.equal(
        typical.forward_from_logits(target, bonus, None, ids, sampling_params=params), typical(q, bonus, None, ids)
    )


@pytest.mark.parametrize("seed", [5, 6])
def test_kernel_backend_matches_torch_backend(seed):
    """backend="triton": the processing runs the sampling kernels and the verification the
    rejection kernels (interpreted on CPU); the tokens equal the PyTorch path's."""
    gen = torch.Generator().manual_seed(seed)
    B, k, v = 4, 3, 32
    target, draft = torch.randn(B, k + 1, v, generator=gen) * 2, torch.randn(B, k, v, generator=gen) * 2
    ids, bonus = torch.randint(0, v, (B, k), generator=gen), torch.randint(0, v, (B, 1), generator=gen)
    params = [
        SamplingParams(temperature=0.8, top_p=0.95),
        SamplingParams(temperature=0),
        SamplingParams(top_k=3, min_p=0.05),
        SamplingParams(top_k=50, top_p=0.7),
    ]
    seeds = torch.arange(B) + 17 * seed
    torch_sampler, triton_sampler = RejectionSampler(backend="torch"), RejectionSampler(backend="triton")
    a = torch_sampler.forward_from_logits(target, bonus, draft, ids, seeds=seeds, sampling_params=params)
    b = triton_sampler.forward_from_logits(target, bonus, draft, ids, seeds=seeds, sampling_params=params)
    assert torch.equal(a, b)
    counts = torch.tensor([3, 0, 2, 1])
    keep = torch.arange(k)[None, :] < counts[:, None]
    args = (target[:, :k][keep], bonus[:, 0], draft[keep], ids[keep], counts.cumsum(0), k)
    assert torch.equal(
        torch_sampler.forward_ragged_from_logits(*args, seeds=seeds, sampling_params=params),
        triton_sampler.forward_ragged_from_logits(*args, seeds=seeds, sampling_params=params),
    )


def test_one_params_for_the_batch_equals_a_list():
    gen = torch.Generator().manual_seed(8)
    target, draft = torch.randn(3, K + 1, V, generator=gen), torch.randn(3, K, V, generator=gen)
    ids, bonus, seeds = torch.randint(0, V, (3, K), generator=gen), torch.zeros(3, 1, dtype=torch.long), torch.arange(3)
    sp = SamplingParams(temperature=0.7, top_k=4)
    s = RejectionSampler(backend="torch")
    assert torch.equal(
        s.forward_from_logits(target, bonus, draft, ids, seeds=seeds, sampling_params=sp),
        s.forward_from_logits(target, bonus, draft, ids, seeds=seeds, sampling_params=[sp] * 3),
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "temperature: expected a .B. float tensor"),
        (
            {"temperature": torch.ones(3), "sampling_params": SamplingParams()},
            "sampling_params: expected None when temperature",
        ),
        ({"sampling_params": [SamplingParams()] * 2}, "sampling_params: expected one SamplingParams or a list of 3"),
        ({"sampling_params": [SamplingParams(), SamplingParams(), "x"]}, "sampling_params: expected SamplingParams"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    target, draft = torch.randn(3, K + 1, V), torch.randn(3, K, V)
    ids, bonus = torch.randint(0, V, (3, K)), torch.zeros(3, 1, dtype=torch.long)
    for sampler in (RejectionSampler(), TypicalAcceptanceSampler()):
        with pytest.raises(SpecSamplerInputError, match=message):
            sampler.forward_from_logits(target, bonus, draft, ids, **kwargs)
