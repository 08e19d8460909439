"""Rejection-sampling kernels vs the PyTorch reference, token for token (torch.equal).

On CPU the kernels run through TRITON_INTERPRET=1 (tests/conftest.py), so shapes stay small.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, case_on_device  # noqa: E402
from conftest import small_split as _split
from conftest import to_device as _dev
from kernel_cases import make_case, ragged_view  # noqa: E402
from op_entries import (  # noqa: E402  # noqa: E402
    rejection_sample_ragged_reference,
    rejection_sample_ragged_triton,
    rejection_sample_reference,
    rejection_sample_triton,
)

from spec_samplers.kernels.backend import vocab_split  # noqa: E402


def _check_padded(case, *, use_draft=True, greedy=True, offsets=True, split=None):
    B, K = case.draft_ids.shape
    V = case.target.shape[-1]
    target, draft, ids, bonus, seeds, offs, g = case_on_device(
        case, use_draft=use_draft, greedy=greedy, offsets=offsets
    )
    ref = rejection_sample_reference(target, bonus, draft, ids, seeds, offs, g)
    out = rejection_sample_triton(target, bonus, draft, ids, seeds, offs, g, split=split or _split(V, B))
    assert torch.equal(out, ref), f"kernel\n{out}\nreference\n{ref}"
    return ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("greedy", ["none", "mixed", "all"])
def test_padded_dtypes_and_row_kinds(dtype, greedy):
    seed = 100 + 10 * ["none", "mixed", "all"].index(greedy) + str(dtype).__len__()
    case = make_case(6, 3, 300, seed=seed, dtype=dtype, greedy=greedy, closeness=0.3)
    ref = _check_padded(case, greedy=greedy != "none")
    assert (ref[:, 1:] != -1).any(), "the case should accept some drafts"


@pytest.mark.parametrize("k", [1, 8])
@pytest.mark.parametrize("use_draft", [True, False])
def test_padded_k_and_point_mass_drafts(k, use_draft):
    case = make_case(5, k, 257, seed=10 + k, closeness=0.2)
    _check_padded(case, use_draft=use_draft)


def test_batch_of_one_and_many_blocks():
    case = make_case(1, 4, 1000, seed=3, closeness=0.3)
    _check_padded(case, split=_split(1000, 1, block_v=32, num_blocks=7))
    _check_padded(case, split=vocab_split(1000, 1, DEVICE))  # launcher defaults


def test_zero_k_padded():
    case = make_case(3, 0, 100, seed=4)
    _check_padded(case)


def test_zero_mass_residual_falls_back_to_target():
    case = make_case(8, 3, 200, seed=5, greedy="none", zero_mass=True)
    ref = _check_padded(case)
    # Even rows have draft == target, so every rejection there has a zero-mass residual and
    # recovers from q, where token 0 (the planted draft) has probability 0.
    assert (ref[0::2] != 0).all()


@pytest.mark.parametrize("use_draft", [True, False])
def test_out_of_range_ids_are_rejected_never_read(use_draft):
    case = make_case(12, 3, 150, seed=6, bad_ids=True, closeness=0.1)
    ref = _check_padded(case, use_draft=use_draft)
    assert ((ref >= -1) & (ref < 150)).all()


@pytest.mark.parametrize("use_draft", [True, False])
@pytest.mark.parametrize("greedy", ["none", "mixed"])
def test_ragged_matches_reference_and_padded(use_draft, greedy):
    B, K, V = 7, 4, 300
    case = make_case(B, K, V, seed=20, greedy=greedy, closeness=0.2)
    k_b = torch.tensor([4, 0, 2, 4, 1, 0, 3])
    target, draft, ids, cu = ragged_view(case.target, case.draft, case.draft_ids, k_b)
    target, draft, ids, cu, bonus, seeds, offs, g = _dev(
        target,
        draft if use_draft else None,
        ids,
        cu,
        case.bonus[:, 0],
        case.seeds,
        case.offsets,
        case.is_greedy if greedy != "none" else None,
    )
    ref = rejection_sample_ragged_reference(target, bonus, draft, ids, cu, K, seeds, offs, g)
    out = rejection_sample_ragged_triton(target, bonus, draft, ids, cu, K, seeds, offs, g, split=_split(V, B))
    assert torch.equal(out, ref), f"kernel\n{out}\nreference\n{ref}"
    # Requests with k_b = K see the same rows as in the padded layout: same tokens.
    full = (k_b == K).to(DEVICE)
    padded_draft = _dev(case.draft)[0] if use_draft else None
    padded = rejection_sample_triton(
        *_dev(case.target, case.bonus),
        padded_draft,
        *_dev(case.draft_ids, case.seeds, case.offsets),
        g,
        split=_split(V, B),
    )
    assert torch.equal(out[full], padded[full])


def test_ragged_bad_bonus_and_empty():
    B, K, V = 6, 3, 120
    case = make_case(B, K, V, seed=21, bad_ids=True, greedy="mixed", closeness=0.1)
    k_b = torch.tensor([3, 0, 0, 1, 3, 2])
    target, draft, ids, cu = ragged_view(case.target, case.draft, case.draft_ids, k_b)
    args = _dev(target, case.bonus, draft, ids, cu)
    rest = _dev(case.seeds, case.offsets, case.is_greedy)
    ref = rejection_sample_ragged_reference(*args, K, *rest)
    out = rejection_sample_ragged_triton(*args, K, *rest, split=_split(V, B))
    assert torch.equal(out, ref)
    assert (out[1] == -1).all()  # k_b = 0 with bonus id V: no bonus row to resample, -1
    # No drafts at all (T = 0).
    cu0 = torch.zeros(B, dtype=torch.int64, device=DEVICE)
    empty = torch.zeros(0, V, device=DEVICE)
    ids0 = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    ref = rejection_sample_ragged_reference(empty, args[1], empty, ids0, cu0, 0, *rest)
    out = rejection_sample_ragged_triton(empty, args[1], empty, ids0, cu0, 0, *rest)
    assert torch.equal(out, ref)


def test_empty_batch():
    out = rejection_sample_triton(
        torch.zeros(0, 3, 10, device=DEVICE),
        torch.zeros(0, 1, dtype=torch.int64, device=DEVICE),
        None,
        torch.zeros(0, 2, dtype=torch.int64, device=DEVICE),
        torch.zeros(0, dtype=torch.int64, device=DEVICE),
    )
    assert out.shape == (0, 3)


def test_nan_inf_negative_probabilities_count_as_zero():
    case = make_case(6, 3, 128, seed=7, closeness=0.2)
    case.target[0, :, :10] = float("nan")
    case.target[1, :, 5:20] = float("inf")
    case.draft[2, :, :30] = -1.0
    case.target[3] = float("nan")  # a whole request without mass
    _check_padded(case)


def test_strided_inputs():
    case = make_case(4, 3, 200, seed=8, closeness=0.2)
    target = case.target.transpose(0, 1).contiguous().transpose(0, 1)  # non-standard batch stride
    ids = case.draft_ids.t().contiguous().t()
    args = _dev(target, case.bonus, case.draft, ids, case.seeds)
    ref = rejection_sample_reference(*args)
    assert torch.equal(rejection_sample_triton(*args, split=_split(200, 4)), ref)


# ---------------------------------------------------------------------------------------------
# Logits inputs: softmax(logits / T) fused in the kernels, temperature 0 = greedy request.

from op_entries import (  # noqa: E402  # noqa: E402
    rejection_sample_from_logits_reference,
    rejection_sample_from_logits_triton,
    rejection_sample_ragged_from_logits_reference,
    rejection_sample_ragged_from_logits_triton,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("greedy", ["none", "mixed"])
@pytest.mark.parametrize("use_draft", [True, False])
def test_logits_padded_and_ragged(dtype, greedy, use_draft):
    B, K, V = 6, 3, 300
    case = make_case(B, K, V, seed=40 + use_draft, greedy=greedy, closeness=0.3)
    tlog, dlog = case.target_logits.to(dtype), case.draft_logits.to(dtype)
    tlog, dlog, bonus, ids, temp, seeds, offs = _dev(
        tlog, dlog if use_draft else None, case.bonus, case.draft_ids, case.temperature, case.seeds, case.offsets
    )
    ref = rejection_sample_from_logits_reference(tlog, bonus, dlog, ids, temp, seeds, offs)
    out = rejection_sample_from_logits_triton(tlog, bonus, dlog, ids, temp, seeds, offs, split=_split(V, B))
    assert torch.equal(out, ref), f"kernel\n{out}\nreference\n{ref}"
    if use_draft:
        assert (ref[:, 1:] != -1).any()
    k_b = torch.tensor([3, 0, 1, 3, 2, 0])
    rt, rd, rids, cu = ragged_view(case.target_logits.to(dtype), case.draft_logits.to(dtype), case.draft_ids, k_b)
    rt, rd, rids, cu = _dev(rt, rd if use_draft else None, rids, cu)
    ref = rejection_sample_ragged_from_logits_reference(rt, bonus[:, 0], rd, rids, cu, K, temp, seeds, offs)
    out = rejection_sample_ragged_from_logits_triton(
        rt, bonus[:, 0], rd, rids, cu, K, temp, seeds, offs, split=_split(V, B)
    )
    assert torch.equal(out, ref), f"kernel\n{out}\nreference\n{ref}"


def test_logits_k8_batch_of_one_and_zero_mass():
    B, K, V = 1, 8, 500
    case = make_case(B, K, V, seed=42, greedy="none", closeness=0.1)
    args = _dev(case.target_logits, case.bonus, case.draft_logits, case.draft_ids, case.temperature, case.seeds)
    ref = rejection_sample_from_logits_reference(*args)
    assert torch.equal(rejection_sample_from_logits_triton(*args, split=_split(V, B, 64, 4)), ref)
    # Draft logits equal to the target's, a -inf token drafted: zero-mass residual -> sample q.
    B, K, V = 4, 3, 200
    case = make_case(B, K, V, seed=43, greedy="none")
    tlog = case.target_logits.clone()
    tlog[:, :, 7] = float("-inf")
    ids = case.draft_ids.clone()
    ids[:, 1] = 7
    args = _dev(tlog, case.bonus, tlog[:, :K].clone(), ids, case.temperature, case.seeds, case.offsets)
    ref = rejection_sample_from_logits_reference(*args)
    assert torch.equal(rejection_sample_from_logits_triton(*args, split=_split(V, B)), ref)
    assert (ref[:, 1] != -1).all() and (ref[:, 1] != 7).all() and (ref[:, 2] == -1).all()


def test_the_launch_finishes_each_request_and_leaves_its_arrival_counters_at_zero():
    # One launch per call (no finalize kernel): the last of a request's programs to arrive
    # finishes it (kernels.common.last_to_arrive) and resets its counter, so the same buffer
    # serves the next call, also with another batch size, and the launcher's default split.
    from spec_samplers.kernels import backend

    for B, seed in ((4, 21), (7, 22), (2, 23)):
        case = make_case(B, 3, 600, seed=seed, closeness=0.3, greedy="mixed")
        _check_padded(case, split=vocab_split(600, B, DEVICE) if B == 7 else _split(600, B, block_v=64, num_blocks=5))
        counters = backend.arrival_counters(torch.device(DEVICE), B)
        assert counters.numel() >= B and not counters.any(), counters[:B]
