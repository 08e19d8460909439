"""Typical-acceptance kernels vs the PyTorch reference, token for token."""

from __future__ import annotations

import pytest
import torch
from conftest import KERNEL_BACKEND  # noqa: E402
from conftest import small_split as _split
from conftest import to_device as _dev
from kernel_cases import make_case, ragged_view  # noqa: E402
from op_entries import (  # noqa: E402  # noqa: E402
    typical_accept_from_logits_reference,
    typical_accept_from_logits_triton,
    typical_accept_ragged_from_logits_reference,
    typical_accept_ragged_from_logits_triton,
    typical_accept_ragged_reference,
    typical_accept_ragged_triton,
    typical_accept_reference,
    typical_accept_triton,
)

from spec_samplers import TypicalAcceptanceSampler  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 8])
def test_padded_matches_reference(dtype, k):
    B, V = 5, 300
    case = make_case(B, k, V, seed=30 + k, dtype=dtype, bad_ids=True)
    target, bonus, ids = _dev(case.target, case.bonus, case.draft_ids)
    for thr, alpha in [(0.09, 0.3), (0.01, 0.05)]:
        ref = typical_accept_reference(target, bonus, ids, thr, alpha)
        out = typical_accept_triton(target, bonus, ids, thr, alpha, split=_split(V, B))
        assert torch.equal(out, ref), f"kernel\n{out}\nreference\n{ref}"


def test_batch_of_one_accepts_and_rejects():
    V = 777
    case = make_case(1, 4, V, seed=31, closeness=0.1, greedy="all")  # greedy drafts: often accepted
    target, bonus, ids = _dev(case.target, case.bonus, case.draft_ids)
    ref = typical_accept_reference(target, bonus, ids, 0.09, 0.3)
    assert torch.equal(typical_accept_triton(target, bonus, ids, 0.09, 0.3, split=_split(V, 1, 32, 5)), ref)
    assert torch.equal(typical_accept_triton(target, bonus, ids, 0.09, 0.3), ref)


def test_ragged_matches_reference():
    B, K, V = 6, 3, 250
    case = make_case(B, K, V, seed=32, bad_ids=True, greedy="all", closeness=0.2)
    k_b = torch.tensor([3, 0, 2, 1, 3, 0])
    target, _, ids, cu = ragged_view(case.target, case.draft, case.draft_ids, k_b)
    target, bonus, ids, cu = _dev(target, case.bonus[:, 0], ids, cu)
    ref = typical_accept_ragged_reference(target, bonus, ids, cu, K, 0.09, 0.3)
    out = typical_accept_ragged_triton(target, bonus, ids, cu, K, 0.09, 0.3, split=_split(V, B))
    assert torch.equal(out, ref), f"kernel\n{out}\nreference\n{ref}"
    assert (out[:, 1:] != -1).any()
    # k_b = 0 with an out-of-range bonus id (rows 1 and 5): no bonus row to fall back on, -1.
    assert out[:, 0].tolist().count(-1) == 2 and out[1, 0] == -1 and out[5, 0] == -1


@pytest.mark.parametrize("greedy", ["none", "mixed"])
def test_logits_match_reference(greedy):
    B, K, V = 6, 3, 300
    case = make_case(B, K, V, seed=33, greedy=greedy, closeness=0.2)
    logits, bonus, ids, temp = _dev(case.target_logits, case.bonus, case.draft_ids, case.temperature)
    ref = typical_accept_from_logits_reference(logits, bonus, ids, temp, 0.09, 0.3)
    out = typical_accept_from_logits_triton(logits, bonus, ids, temp, 0.09, 0.3, split=_split(V, B))
    assert torch.equal(out, ref), f"kernel\n{out}\nreference\n{ref}"
    k_b = torch.tensor([3, 1, 0, 2, 3, 1])
    r_logits, _, r_ids, cu = ragged_view(case.target_logits, case.draft_logits, case.draft_ids, k_b)
    r_logits, r_ids, cu = _dev(r_logits, r_ids, cu)
    ref = typical_accept_ragged_from_logits_reference(r_logits, bonus[:, 0], r_ids, cu, K, temp, 0.09, 0.3)
    out = typical_accept_ragged_from_logits_triton(
        r_logits, bonus[:, 0], r_ids, cu, K, temp, 0.09, 0.3, split=_split(V, B)
    )
    assert torch.equal(out, ref), f"kernel\n{out}\nreference\n{ref}"


def test_sampler_backends_agree_with_counters():
    B, K, V = 5, 3, 200
    case = make_case(B, K, V, seed=34, closeness=0.2, greedy="all")
    args = _dev(case.target, case.bonus, case.draft, case.draft_ids)
    a, b = TypicalAcceptanceSampler(backend="torch"), TypicalAcceptanceSampler(backend=KERNEL_BACKEND)
    assert torch.equal(a(*args), b(*args))
    k_b = torch.tensor([3, 0, 2, 1, 3])
    t, d, ids, cu = ragged_view(case.target, case.draft, case.draft_ids, k_b)
    rargs = (*_dev(t, case.bonus[:, 0], d, ids, cu), K)
    assert torch.equal(a.forward_ragged(*rargs), b.forward_ragged(*rargs))
    for name in ("num_accepted_tokens", "num_emitted_tokens"):
        assert int(getattr(a, name)) == int(getattr(b, name))
    assert a.num_draft_tokens == b.num_draft_tokens
    assert torch.equal(a.num_accepted_per_position, b.num_accepted_per_position)
