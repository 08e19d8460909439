"""Kernels vs reference on randomly drawn configurations (fixed seeds, so deterministic):
shapes, dtypes, layouts, row kinds, point-mass drafts, bad ids and vocabulary splits mixed."""

from __future__ import annotations

import random

import op_entries as R  # noqa: E402
import op_entries as RL  # noqa: E402
import op_entries as TL  # noqa: E402
import pytest
import torch
from conftest import DEVICE  # noqa: E402
from kernel_cases import make_case, ragged_view  # noqa: E402

from spec_samplers.kernels.backend import vocab_split  # noqa: E402


@pytest.mark.parametrize("trial", range(8))
def test_random_configuration(trial):
    rnd = random.Random(1000 + trial)
    B, K, V = rnd.randint(1, 5), rnd.randint(0, 5), rnd.randint(17, 400)
    dtype = rnd.choice([torch.float32, torch.float16, torch.bfloat16])
    case = make_case(
        B,
        K,
        V,
        seed=trial,
        dtype=dtype,
        greedy=rnd.choice(["none", "mixed", "all"]),
        closeness=rnd.choice([0.05, 0.3, 1.0]),
        bad_ids=rnd.random() < 0.5,
        zero_mass=rnd.random() < 0.3,
    )
    split = vocab_split(V, B, DEVICE, block_v=rnd.choice([16, 32, 64, 128]), num_blocks=rnd.randint(1, 6))
    use_draft = rnd.random() < 0.7
    dev = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    target, draft, ids, bonus = (
        dev(case.target),
        dev(case.draft) if use_draft else None,
        dev(case.draft_ids),
        dev(case.bonus),
    )
    seeds, offs, greedy = dev(case.seeds), dev(case.offsets), dev(case.is_greedy)
    info = f"B={B} K={K} V={V} {dtype} draft={use_draft} split={split}"

    a = (target, bonus, draft, ids, seeds, offs, greedy)
    assert torch.equal(RL.rejection_sample_triton(*a, split=split), R.rejection_sample_reference(*a)), info
    t = (target, bonus, ids, 0.09, 0.3)
    assert torch.equal(TL.typical_accept_triton(*t, split=split), R.typical_accept_reference(*t)), info

    k_b = torch.tensor([rnd.randint(0, K) for _ in range(B)])
    rt, rd, rids, cu = (dev(x) for x in ragged_view(case.target, case.draft, case.draft_ids, k_b))
    r = (rt, bonus[:, 0], rd if use_draft else None, rids, cu, K, seeds, offs, greedy)
    assert torch.equal(RL.rejection_sample_ragged_triton(*r, split=split), R.rejection_sample_ragged_reference(*r)), (
        info
    )

    lg = (
        dev(case.target_logits.to(dtype)),
        bonus,
        dev(case.draft_logits.to(dtype)) if use_draft else None,
        ids,
        dev(case.temperature),
        seeds,
        offs,
    )
    assert torch.equal(
        RL.rejection_sample_from_logits_triton(*lg, split=split), R.rejection_sample_from_logits_reference(*lg)
    ), info
