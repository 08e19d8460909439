"""Output layout and counters on hand-built cases whose outcome is certain.

A draft x with q(x) = p(x) > 0 is always accepted (u < 1); a draft with q(x) = 0 is always
rejected; a one-hot residual makes the recovered token certain.
"""

import pytest
import torch

from spec_samplers import RejectionSampler, TypicalAcceptanceSampler, build_output

V = 6


def one_hot(idx: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(idx), V).float()


def case(rows: list[tuple[list[int], int, list[int]]]) -> tuple[torch.Tensor, ...]:
    """rows: (draft ids, first rejected position or k, recovered ids per position)."""
    B, k = len(rows), len(rows[0][0])
    target = torch.zeros(B, k + 1, V)
    draft = torch.zeros(B, k, V)
    ids = torch.tensor([r[0] for r in rows])
    for b, (drafts, reject_at, recovered) in enumerate(rows):
        for i, x in enumerate(drafts):
            draft[b, i] = one_hot(x)
            # accepted: q = p = one-hot(x); rejected: q one-hot on the recovered token
            target[b, i] = one_hot(x) if i < reject_at else one_hot(recovered[i])
        target[b, k] = one_hot(0)
    bonus = torch.full((B, 1), 5)
    return target, bonus, draft, ids


K3 = [
    ([1, 2, 3], 3, [0, 0, 0]),  # all accepted -> bonus
    ([1, 2, 3], 0, [4, 0, 0]),  # first rejected
    ([1, 2, 3], 1, [0, 4, 0]),  # middle rejected
    ([1, 2, 3], 2, [0, 0, 4]),  # last rejected
]
EXPECTED = torch.tensor([[1, 2, 3, 5], [4, -1, -1, -1], [1, 4, -1, -1], [1, 2, 4, -1]])


@pytest.mark.parametrize("point_mass", [False, True])
def test_rejection_layout_and_counters(point_mass):
    target, bonus, draft, ids = case(K3)
    sampler = RejectionSampler()
    out = sampler(target, bonus, None if point_mass else draft, ids)
    assert out.dtype == torch.int64
    assert torch.equal(out, EXPECTED)
    assert int(sampler.num_accepted_tokens) == 3 + 0 + 1 + 2
    assert int(sampler.num_emitted_tokens) == 4 + 1 + 2 + 3
    assert sampler.num_draft_tokens == 12
    assert sampler.num_accepted_per_position.tolist() == [3, 2, 1]
    # counters accumulate over calls
    sampler(target, bonus, draft, ids)
    assert int(sampler.num_accepted_tokens) == 12
    assert sampler.num_draft_tokens == 24
    assert sampler.num_accepted_per_position.tolist() == [6, 4, 2]


def test_bonus_only_when_all_accepted():
    target, bonus, draft, ids = case(K3)
    out = RejectionSampler()(target, bonus, draft, ids)
    has_bonus = out[:, -1] == 5
    all_accepted = (out[:, :3] == ids).all(dim=1)
    assert torch.equal(has_bonus, all_accepted)


def test_per_position_counter_grows_with_k():
    sampler = RejectionSampler()
    target, bonus, draft, ids = case([([1], 1, [0])])
    sampler(target, bonus, draft, ids)
    target, bonus, draft, ids = case(K3)
    sampler(target, bonus, draft, ids)
    assert sampler.num_accepted_per_position.tolist() == [4, 2, 1]


def test_typical_layout_and_counters():
    # draft accepted iff q(x) > min(threshold, alpha*exp(-H)); one-hot rows: H ~ 0, threshold 0.09
    target, bonus, _, ids = case(K3)
    sampler = TypicalAcceptanceSampler()
    out = sampler(target, bonus, None, ids)
    assert torch.equal(out, EXPECTED)  # recovered = argmax q_j = the one-hot token
    assert int(sampler.num_accepted_tokens) == 6
    assert int(sampler.num_emitted_tokens) == 10
    assert sampler.num_accepted_per_position.tolist() == [3, 2, 1]


def test_init_tensors_and_properties():
    sampler = RejectionSampler()
    sampler.init_tensors("cpu")
    assert sampler.num_accepted_tokens.device.type == "cpu"
    assert int(sampler.num_accepted_tokens) == 0
    assert sampler.probs_dtype == torch.float32 and sampler.token_id_dtype == torch.int64
    # counters exist from construction (on the CPU); init_tensors moves them and may run again
    sampler.num_accepted_tokens += 3
    sampler.init_tensors("cpu")
    assert int(sampler.num_accepted_tokens) == 3
    with pytest.raises(TypeError, match="device"):
        RejectionSampler().init_tensors(1.5)


def test_batch_size_zero():
    sampler = RejectionSampler()
    out = sampler(
        torch.zeros(0, 4, V),
        torch.zeros(0, 1, dtype=torch.long),
        torch.zeros(0, 3, V),
        torch.zeros(0, 3, dtype=torch.long),
    )
    assert out.shape == (0, 4) and out.dtype == torch.int64
    assert int(sampler.num_emitted_tokens) == 0
    out = TypicalAcceptanceSampler()(
        torch.zeros(0, 4, V), torch.zeros(0, 1, dtype=torch.long), None, torch.zeros(0, 3, dtype=torch.long)
    )
    assert out.shape == (0, 4)


def test_vocab_size_one():
    target = torch.ones(3, 3, 1)
    ids = torch.zeros(3, 2, dtype=torch.long)
    bonus = torch.zeros(3, 1, dtype=torch.long)
    assert torch.equal(RejectionSampler()(target, bonus, torch.ones(3, 2, 1), ids), torch.zeros(3, 3, dtype=torch.long))
    assert torch.equal(TypicalAcceptanceSampler()(target, bonus, None, ids), torch.zeros(3, 3, dtype=torch.long))


def test_k_zero_emits_bonus():
    target = torch.softmax(torch.randn(2, 1, V), -1)
    bonus = torch.tensor([[3], [4]])
    out = RejectionSampler()(target, bonus, torch.zeros(2, 0, V), torch.zeros(2, 0, dtype=torch.long))
    assert torch.equal(out, bonus)


def test_build_output():
    drafts = torch.tensor([[7, 8, 9], [7, 8, 9]], dtype=torch.int32)
    out = build_output(drafts, torch.tensor([3, 1]), torch.tensor([1, 2]))
    assert torch.equal(out, torch.tensor([[7, 8, 9, 1], [7, 2, -1, -1]]))
