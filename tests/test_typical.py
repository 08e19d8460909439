"""Typical acceptance: vLLM V0 semantics on cases with a known answer."""

import math

import pytest
import torch

from spec_samplers import TypicalAcceptanceSampler

V = 16


def test_uniform_target_accepts_everything():
    B, k = 8, 4
    target = torch.full((B, k + 1, V), 1.0 / V)
    ids = torch.randint(0, V, (B, k), generator=torch.Generator().manual_seed(0))
    bonus = torch.randint(0, V, (B, 1), generator=torch.Generator().manual_seed(1))
    out = TypicalAcceptanceSampler()(target, bonus, None, ids)
    assert torch.equal(out, torch.cat([ids, bonus], 1))


def test_one_hot_target_accepts_exactly_argmax_drafts():
    B, k = 32, 3
    gen = torch.Generator().manual_seed(2)
    argmax = torch.randint(0, V, (B, k + 1), generator=gen)
    target = torch.nn.functional.one_hot(argmax, V).float()
    ids = torch.where(torch.rand(B, k, generator=gen) < 0.6, argmax[:, :k], torch.randint(0, V, (B, k), generator=gen))
    ids = torch.where(ids == argmax[:, :k], ids, (argmax[:, :k] + 1) % V)  # mismatches are real mismatches
    bonus = argmax[:, k:]
    out = TypicalAcceptanceSampler()(target, bonus, None, ids)
    for b in range(B):
        n = next((i for i in range(k) if ids[b, i] != argmax[b, i]), k)
        assert out[b, :n].tolist() == ids[b, :n].tolist()
        assert int(out[b, n]) == int(argmax[b, n])  # recovered argmax, or the bonus (= argmax here)
        assert (out[b, n + 1 :] == -1).all()


def test_zero_threshold_and_alpha_accept_all_positive_drafts():
    B, k = 6, 5
    gen = torch.Generator().manual_seed(3)
    target = torch.softmax(torch.randn(B, k + 1, V, generator=gen) * 4, -1)
    ids = torch.randint(0, V, (B, k), generator=gen)
    bonus = torch.randint(0, V, (B, 1), generator=gen)
    out = TypicalAcceptanceSampler(posterior_threshold=0.0, posterior_alpha=0.0)(target, bonus, None, ids)
    assert torch.equal(out, torch.cat([ids, bonus], 1))


def test_hand_computed_partial_case():
    # position 0: q = [0.5, 0.3, 0.2, 0...]; H = -sum q log(q + 1e-5)
    q0 = torch.zeros(V)
    q0[:3] = torch.tensor([0.5, 0.3, 0.2])
    h = -sum(v * math.log(v + 1e-5) for v in (0.5, 0.3, 0.2))
    thr = min(0.09, 0.3 * math.exp(-h))  # 0.3 * exp(-1.0297) = 0.1071 -> threshold 0.09
    assert thr == 0.09
    # position 1: q = [0.95, 0.05, ...]: H = 0.1985..., alpha*exp(-H) = 0.246 -> threshold 0.09;
    # draft 1 has q = 0.05 < 0.09 -> rejected, recovered argmax 0
    q1 = torch.zeros(V)
    q1[:2] = torch.tensor([0.95, 0.05])
    q2 = torch.full((V,), 1.0 / V)
    target = torch.stack([q0, q1, q2, q2])[None]  # k = 3
    ids = torch.tensor([[2, 1, 5]])  # q0(2) = 0.2 > 0.09 accepted; q1(1) = 0.05 rejected
    out = TypicalAcceptanceSampler()(target, torch.tensor([[7]]), None, ids)
    assert out.tolist() == [[2, 0, -1, -1]]
    # raise the threshold above 0.2 and lower alpha: now min(1.0, 0.3*exp(-H0)) = 0.1071 < 0.2 still accepts
    out = TypicalAcceptanceSampler(posterior_threshold=1.0)(target, torch.tensor([[7]]), None, ids)
    assert out.tolist() == [[2, 0, -1, -1]]
    # alpha large: threshold min(0.25, 10*exp(-H0)) = 0.25 > 0.2 -> rejected at 0, recover argmax 0
    out = TypicalAcceptanceSampler(posterior_threshold=0.25, posterior_alpha=10.0)(
        target, torch.tensor([[7]]), None, ids
    )
    assert out.tolist() == [[0, -1, -1, -1]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_matches_fp32_decisions(dtype):
    gen = torch.Generator().manual_seed(4)
    B, k = 16, 3
    target = torch.softmax(torch.randn(B, k + 1, V, generator=gen) * 2, -1).to(dtype)
    ids = torch.randint(0, V, (B, k), generator=gen)
    bonus = torch.randint(0, V, (B, 1), generator=gen)
    a = TypicalAcceptanceSampler()(target, bonus, None, ids)
    b = TypicalAcceptanceSampler()(target.float(), bonus, None, ids)
    assert torch.equal(a, b)


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf"), "0.1", True])
@pytest.mark.parametrize("name", ["posterior_threshold", "posterior_alpha"])
def test_bad_options_raise_at_construction(name, value):
    with pytest.raises(ValueError, match=name):
        TypicalAcceptanceSampler(**{name: value})


def test_ignores_draft_probs():
    gen = torch.Generator().manual_seed(5)
    target = torch.softmax(torch.randn(4, 3, V, generator=gen), -1)
    ids = torch.randint(0, V, (4, 2), generator=gen)
    bonus = torch.zeros(4, 1, dtype=torch.long)
    draft = torch.softmax(torch.randn(4, 2, V, generator=gen), -1)
    s = TypicalAcceptanceSampler()
    assert torch.equal(s(target, bonus, draft, ids), s(target, bonus, None, ids))


def test_reference_matches_the_per_position_definition():
    """The PyTorch reference tests on the CPU only the positions a request reaches (it accepted
    every earlier draft) and takes one argmax per request (issue 29's speedup): its tokens are
    those of the definition, every position tested and every row's argmax taken, written out
    here in float64 from the fp32 probabilities."""
    from spec_samplers.output import build_output, num_leading_accepted
    from spec_samplers.reference import ENTROPY_EPS_FP32, fp32_value

    gen = torch.Generator().manual_seed(29)
    for trial in range(20):
        B, k, n = 7, 4, 40
        target = torch.softmax(torch.randn(B, k + 1, n, generator=gen) * (trial % 4 + 0.5), -1)
        ids = torch.where(
            torch.rand(B, k, generator=gen) < 0.7, target[:, :k].argmax(-1), torch.randint(0, n, (B, k), generator=gen)
        )
        bonus = torch.randint(0, n, (B, 1), generator=gen)
        thr, alpha = 0.09, 0.3
        out = TypicalAcceptanceSampler(posterior_threshold=thr, posterior_alpha=alpha)(target, bonus, None, ids)
        q64 = target.double()
        entropy = -(q64 * torch.log(q64 + ENTROPY_EPS_FP32)).sum(-1)  # [B, k+1]
        bound = torch.clamp(fp32_value(alpha) * torch.exp(-entropy), max=fp32_value(thr))
        accepted = q64[:, :k].gather(2, ids[..., None]).squeeze(2) > bound[:, :k]
        m = num_leading_accepted(accepted)
        final = torch.where(m < k, target.argmax(-1)[torch.arange(B), m], bonus[:, 0])
        assert torch.equal(out, build_output(ids, m, final)), trial


def test_entropy_threshold_of_a_row_is_that_of_the_batch_when_tested_twice():
    """The reference tests only the live rows of a position; a lone row is tested twice over
    (PyTorch sums a single row's float64 entropy along another path than a batch's: the last bits
    differ at large V, which could flip a near-tie): the doubled row's threshold is bitwise the
    batch's."""
    from spec_samplers.reference import typical_threshold

    q = torch.softmax(torch.randn(4, 151936, generator=torch.Generator().manual_seed(5)) * 3, -1)
    batch = typical_threshold(q, 0.09, 0.3)
    for i in range(4):
        assert torch.equal(typical_threshold(q[[i, i]], 0.09, 0.3), batch[[i, i]])
        assert torch.equal(typical_threshold(q[[i, (i + 1) % 4]], 0.09, 0.3)[0], batch[i])
