"""Hypothesis property tests: output-format invariants over random shapes and distributions."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_samplers import RejectionSampler, TypicalAcceptanceSampler


@st.composite
def problems(draw):
    B = draw(st.integers(0, 6))
    k = draw(st.integers(0, 5))
    V = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    sharp = draw(st.floats(0.0, 8.0))
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    id_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    point_mass = draw(st.booleans())
    g = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(B, k + 1, V, generator=g) * sharp, -1)
    draft = torch.softmax(torch.randn(B, k, V, generator=g) * sharp, -1)
    # sparsify some rows so zero probabilities and disjoint supports occur
    target = torch.where(torch.rand(B, k + 1, V, generator=g) < 0.3, 0.0, target)
    target[..., 0] += 1e-3  # no all-zero rows
    target = target / target.sum(-1, keepdim=True)
    ids = torch.randint(0, V, (B, k), generator=g).to(id_dtype)
    bonus = torch.randint(0, V, (B, 1), generator=g).to(id_dtype)
    greedy = torch.rand(B, generator=g) < 0.3
    return target.to(dtype), bonus, None if point_mass else draft.to(dtype), ids, greedy, seed


def check_invariants(out, ids, V):
    B, k = ids.shape
    assert out.shape == (B, k + 1) and out.dtype == torch.int64
    n = (out != -1).sum(1)
    assert bool((n >= 1).all()) or B == 0
    pos = torch.arange(k + 1)[None, :]
    assert torch.equal(out != -1, pos < n[:, None])  # tokens, then -1 only
    # the accepted prefix is the drafts
    prefix = pos[:, :k] < (n - 1)[:, None]
    assert torch.equal(torch.where(prefix, out[:, :k], 0), torch.where(prefix, ids.long(), 0))
    emitted = out[out != -1]
    assert bool(((emitted >= 0) & (emitted < V)).all())


@settings(max_examples=150, deadline=None, derandomize=True)
@given(problems())
def test_rejection_invariants(problem):
    target, bonus, draft, ids, greedy, seed = problem
    sampler = RejectionSampler()
    out = sampler(target, bonus, draft, ids, seeds=torch.arange(ids.shape[0]) + seed, is_greedy=greedy)
    check_invariants(out, ids, target.shape[-1])
    # an accepted draft never has zero target probability
    n = (out != -1).sum(1) - 1
    for b in range(ids.shape[0]):
        for i in range(int(n[b])):
            assert float(target[b, i, int(ids[b, i])]) > 0
    assert int(sampler.num_emitted_tokens) == int((out != -1).sum())
    assert int(sampler.num_accepted_tokens) == int(n.sum())


@settings(max_examples=100, deadline=None, derandomize=True)
@given(problems(), st.floats(0.0, 1.0), st.floats(0.0, 2.0))
def test_typical_invariants(problem, threshold, alpha):
    target, bonus, _, ids, _, _ = problem
    out = TypicalAcceptanceSampler(posterior_threshold=threshold, posterior_alpha=alpha)(target, bonus, None, ids)
    check_invariants(out, ids, target.shape[-1])
