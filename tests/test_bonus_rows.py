"""The inputs of the bonus-row verification (spec_samplers.bonus_rows): the one-launch kernel
against the eager reference, value for value, on Model Runner V2-like batches (int32 and int64
indices, with and without a drafter cache, requests longer than the kernel's vector step); the
seams' checked inputs (malformed metadata included), vLLM V1's step inputs and the seams' tail."""

import random

import pytest
import torch
from conftest import DEVICE

from spec_samplers.bonus_rows import (
    bonus_row_inputs,
    bonus_row_inputs_reference,
    chunk_inputs_reference,
    chunk_outputs_reference,
    step_inputs_reference,
)
from spec_samplers.integrations.vllm.ragged import well_formed_requests
from spec_samplers.kernels.bonus_row_kernels import bonus_row_inputs_triton, chunk_outputs_triton, step_inputs_triton


def batch(counts: list[int], index_dtype: torch.dtype, seed: int, cache: bool):
    gen = torch.Generator().manual_seed(seed)
    R, L, states, S = len(counts), sum(counts), 11, 6
    cu = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=index_dtype)
    state = torch.randperm(states, generator=gen)[:R].to(index_dtype)
    temperature = torch.rand(states, generator=gen) * 1.5
    temperature[state[0]] = 0.0  # a greedy request
    seed_of_state = torch.randint(0, 2**62, (states,), generator=gen)
    pos = torch.randint(0, 10_000, (L + 3,), generator=gen)  # vLLM's buffers may be longer than L
    sampled = torch.randint(0, 32_000, (L + 3,), generator=gen).to(index_dtype)
    row_state = torch.repeat_interleave(state.long(), torch.tensor(counts)).to(index_dtype)
    row_step = torch.cat([torch.arange(c) for c in counts]).to(index_dtype)
    pad = torch.zeros(3, dtype=index_dtype)
    rows = (torch.cat([row_state, pad]), torch.cat([row_step, pad])) if cache else (None, None)
    args = (cu, state, temperature, seed_of_state, pos, sampled, *rows, L, S)
    return tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("step", [5, 2])  # 2: requests longer than the vector step loop
def test_kernel_gives_the_reference_inputs(index_dtype, cache, step):
    for seed, counts in enumerate(([5, 5, 5], [1, 5, 3, 2, 5], [4])):
        args = batch(counts, index_dtype, seed, cache)
        expected = bonus_row_inputs_reference(*args)
        got = bonus_row_inputs_triton(*args, step)
        for name, a, b in zip(expected._fields, expected, got):
            if a is None:
                assert b is None, name
                continue
            assert a.shape == b.shape and torch.equal(a.long() if name == "draft_rows" else a, b), name
            assert name == "draft_rows" or a.dtype == b.dtype, name
        assert (got[4][args[0][1:].long() - 1] == -1).all() and (got[3] == -1).all()  # ids, bonus


def test_empty_batch_and_the_eager_dispatch_off_cuda():
    args = batch([3, 2], torch.int64, 9, True)
    # off CUDA the dispatch is the eager reference
    assert all(torch.equal(a, b) for a, b in zip(bonus_row_inputs(*args, 4), bonus_row_inputs_reference(*args)))
    empty = (torch.zeros(1, dtype=torch.int64, device=DEVICE), torch.zeros(0, dtype=torch.int64, device=DEVICE))
    out = bonus_row_inputs_triton(*empty, *args[2:6], None, None, 0, 6, 4)
    assert out[0].shape == (0,) and out[4].shape == (0,) and out[5] is None


def test_strided_and_expanded_inputs_read_as_their_contiguous_copies():
    """Every input may be a view: a strided ``pos`` / ``sampled`` and an expanded (stride 0)
    temperature give the values of their contiguous copies (the launcher copies [R] / [L] inputs)."""
    cu, state, temperature, seed, pos, sampled, row_state, row_step, L, S = batch([3, 4], torch.int64, 5, True)
    wide_pos = torch.stack([pos, pos + 1], 1)[:, 0]  # stride 2
    wide_sampled = torch.stack([sampled, -sampled], 1)[:, 0]
    flat_t = torch.full((), 0.6, device=DEVICE).expand(temperature.shape[0])
    assert wide_pos.stride(0) == 2 and flat_t.stride(0) == 0
    args = (cu, state, flat_t, seed, wide_pos, wide_sampled, row_state, row_step, L, S)
    expected = bonus_row_inputs_reference(cu, state, flat_t.contiguous(), seed, pos, sampled, row_state, row_step, L, S)
    got = bonus_row_inputs_triton(*args, 4)
    for name, a, b in zip(expected._fields, expected, got):
        assert torch.equal(a.long() if name == "draft_rows" else a, b), name


# --- the seams' checked inputs and tail (chunk_inputs, step_inputs, chunk_outputs) ---------------


def malformed_chunk(rng: random.Random, gen: torch.Generator):
    """A Model Runner V2 chunk, often with one kind of malformed metadata (as the seams' fuzz)."""
    R, S = rng.randint(0, 5), rng.randint(1, 4)
    counts = [rng.randint(1, S + 1) for _ in range(R)]
    L = sum(counts)
    cu = torch.zeros(R + 1, dtype=torch.int64)
    cu[1:] = torch.tensor(counts, dtype=torch.int64).cumsum(0)
    idx = torch.tensor(rng.sample(range(R + 2), R), dtype=torch.int64)
    bad = rng.choice(["none", "non_monotone", "first", "end", "state", "lost_rows"])
    if R and bad == "non_monotone":
        cu[rng.randint(1, R)] -= rng.randint(1, 3)
    elif bad == "first":
        cu[0] = rng.choice([1, -1])
    elif R and bad == "end":
        cu[R] += rng.choice([1, -1])
    elif R and bad == "state":
        idx[rng.randrange(R)] = rng.choice([R + 2, -1, 2**30])
    elif R and bad == "lost_rows":
        r = rng.randrange(R)
        cu[r + 1 :] -= counts[r]
    dtype = rng.choice([torch.int32, torch.int64])
    temperature = torch.tensor([rng.choice([0.0, 1.0, 0.7, float("nan"), -1.0]) for _ in range(R + 2)])
    seed = torch.randint(0, 2**40, (R + 2,), generator=gen)
    pos = torch.randint(0, 100, (L + 2,), generator=gen)
    sampled = torch.randint(0, 50, (L + 2,), generator=gen).to(dtype)
    cache = rng.random() < 0.5
    row_state = torch.randint(0, R + 2, (L + 2,), generator=gen) if cache else None
    row_step = torch.randint(0, S, (L + 2,), generator=gen) if cache else None
    args = (cu.to(dtype), idx.to(dtype), temperature, seed, pos, sampled, row_state, row_step, L, S, S + 1)
    return tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)


def test_checked_kernel_gives_the_reference_checks_and_the_well_formed_requests_inputs():
    """The seam's checks (ok) agree everywhere; a well-formed request's inputs and rows agree
    value for value (a malformed request's are never emitted: the kernel leaves its rows)."""
    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    for case in range(30):
        args = malformed_chunk(rng, gen)
        cu = args[0].tolist()
        for divided in (True, False):
            ok, target_t, expected = chunk_inputs_reference(*args, divided)
            *got, got_ok, sign = bonus_row_inputs_triton(*args, checked=True)
            assert torch.equal(ok, got_ok), (case, ok, got_ok)
            got_t = sign if divided else got[0]
            for r in [r for r in range(ok.shape[0]) if ok[r]]:
                lo, hi = cu[r], cu[r + 1]
                assert torch.equal(target_t[r], got_t[r]) or bool(target_t[r].isnan() & got_t[r].isnan()), case
                assert [int(t[r]) for t in expected[1:4]] == [int(t[r]) for t in got[1:4]], case
                assert torch.equal(expected.ids[lo:hi], got[4][lo:hi]), case
                if expected.draft_rows is not None:
                    assert torch.equal(expected.draft_rows[lo:hi], got[5][lo:hi]), case
            ok_out, _ = chunk_outputs_reference(torch.zeros(ok.shape[0], 3, dtype=torch.int64, device=DEVICE), ok, 3)
            assert (ok_out[~ok] == -1).all() and (ok_out[ok][:, 0] >= 0).all()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("counts", [True, False])
def test_tail_kernel_gives_the_reference_tail(dtype, counts):
    """Malformed -> no token, first slot -1 -> 0 for a well-formed request, num_sampled; int64
    in place or another dtype."""
    gen = torch.Generator().manual_seed(4)
    out = torch.randint(-1, 5, (6, 5), generator=gen).to(DEVICE)
    out[:, 2:] = torch.where(out[:, 2:] < 2, -1, out[:, 2:])
    ok = torch.tensor([True, False, True, True, False, True], device=DEVICE)
    expected, expected_n = chunk_outputs_reference(out.clone(), ok, 4, dtype, counts)
    got, got_n = chunk_outputs_triton(out.clone(), ok, 4, None, dtype, counts)
    assert torch.equal(expected, got) and expected.dtype == got.dtype == dtype
    assert (got_n is None) == (not counts) and (not counts or torch.equal(expected_n, got_n))
    assert (got[~ok] == -1).all() and (got[ok][:, 0] >= 0).all()


@pytest.mark.parametrize("draft_rows", [True, False])
def test_v1_step_kernel_gives_the_reference_inputs(draft_rows):
    """vLLM V1's step (request r's k_r draft rows, then its bonus row): the ids each row scores
    and the draft rows, as vLLM's target_logits_indices lay them out; ragged.well_formed_requests."""
    rng = random.Random(5)
    for case in range(30):
        B, K = rng.randint(0, 5), rng.randint(0, 4)
        ks = [rng.randint(0, K) for _ in range(B)]
        T = sum(ks)
        dtype = rng.choice([torch.int32, torch.int64])
        cu = torch.tensor([sum(k + 1 for k in ks[: r + 1]) for r in range(B)], dtype=dtype)
        if B and rng.random() < 0.3:
            cu[rng.randrange(B)] += rng.choice([2, -2])
        drafts = torch.randint(0, 50, (T,), dtype=dtype)
        args = (cu.to(DEVICE), drafts.to(DEVICE), T + B, K + 1, draft_rows)
        ids, rows, bonus, ok = step_inputs_reference(*args)
        got = step_inputs_triton(*args)
        assert torch.equal(ok, got[3]) and torch.equal(bonus, got[2]) and ids.dtype == got[0].dtype
        assert torch.equal(ok, well_formed_requests(args[0], K + 1, T + B))
        starts = [0, *cu.tolist()]
        for r in [r for r in range(B) if ok[r]]:
            lo, hi = starts[r], starts[r + 1]
            assert torch.equal(ids[lo:hi], got[0][lo:hi]), case
            assert rows is None or torch.equal(rows[lo:hi], got[1][lo:hi]), case
            if hi > lo:  # vLLM's layout: row t + r scores draft t, the last row the placeholder
                expected = [int(drafts[i - r]) for i in range(lo, hi - 1)] + [-1]
                assert ids[lo:hi].tolist() == expected, case


@pytest.mark.parametrize("cache", [True, False])
def test_the_seam_builds_the_batch_the_entry_builds(cache):
    """The MRv2 chunk's sampler call (fast_path._verify_in_place: the seam builds the VerifyBatch
    from its checked inputs) gives the tokens and counters of the sampler's ragged logits entry
    on the same inputs, twice in a row (workspaces reused), malformed requests included."""
    from spec_samplers import RejectionSampler
    from spec_samplers.bonus_rows import chunk_inputs
    from spec_samplers.integrations.vllm import fast_path
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier

    rng, gen = random.Random(7), torch.Generator().manual_seed(7)
    for case in range(6):
        cu, idx, temperature, seed, pos, sampled, row_state, row_step, L, S, max_rows = malformed_chunk(rng, gen)
        if L == 0 or cu.shape[0] < 2:
            continue
        V = 50
        logits = torch.randn(L, V, generator=gen).to(DEVICE)
        drafter = torch.randn(idx.shape[0] + 2, S, V, generator=gen).to(DEVICE) if cache else None
        rows = (row_state, row_step) if cache and row_state is not None else (None, None)
        num_steps = S if rows[0] is not None else 0
        args = (cu, idx, temperature, seed, pos, sampled, *rows, L, num_steps, max_rows, False, "triton")
        _, target_t, inputs = chunk_inputs(*args)
        matrix = drafter.reshape(-1, V) if rows[0] is not None else None
        drafts = {} if matrix is None else dict(draft_rows=inputs.draft_rows, draft_temperature=inputs.temperature)
        common = (inputs.bonus, matrix, inputs.ids, cu[1:], S + 1)
        randomness = (target_t, inputs.seeds, inputs.offsets)
        entry, direct = RejectionSampler(backend="triton"), RejectionSampler(backend="triton")
        direct_verifier = RaggedVerifier(direct)
        direct_verifier.from_logits = None  # (the seam's own batch, never the entry)
        for _ in range(2):
            expected = RaggedVerifier(entry).from_logits(
                logits, *common, temperature=target_t, seeds=inputs.seeds, offsets=inputs.offsets, **drafts
            )
            got = fast_path._verify_in_place(direct_verifier, logits, *common, *randomness, drafts)
            assert torch.equal(expected, got), case
        assert torch.equal(entry.num_accepted_tokens, direct.num_accepted_tokens), case
        assert torch.equal(entry.num_emitted_tokens, direct.num_emitted_tokens), case
        assert entry.num_draft_tokens == direct.num_draft_tokens, case


def test_a_chunk_shape_seen_before_takes_its_plan():
    """Model Runner V2's seam keeps one plan per chunk shape (fast_path.chunk_plan): the second
    call of a shape takes it and gives the tokens, num_sampled and counters of a seam that plans
    every call anew, malformed requests included; a plan is never used under another launch
    config (a tool planning for another device plans anew)."""
    from spec_samplers import RejectionSampler
    from spec_samplers.integrations.vllm import v2_runner
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier
    from spec_samplers.kernels.backend import LaunchConfig, planned_for

    rng, gen = random.Random(11), torch.Generator().manual_seed(11)
    planned = 0
    for case in range(6):
        cu, idx, temperature, seed, pos, sampled, row_state, row_step, L, S, _ = malformed_chunk(rng, gen)
        if L == 0 or cu.shape[0] < 2:
            continue
        V = 40
        logits = torch.randn(L, V, generator=gen).to(DEVICE)
        drafter = None
        if row_state is None:
            row_state, row_step = torch.zeros_like(pos), torch.zeros_like(pos)
        else:
            drafter = torch.randn(idx.shape[0] + 2, S, V + 3, generator=gen).to(DEVICE)
        args = (logits, drafter, sampled, cu, pos, idx, row_state, row_step, temperature, seed, S)
        kept, fresh = RejectionSampler(backend="triton"), RejectionSampler(backend="triton")
        kept_verifier, fresh_verifier = RaggedVerifier(kept), RaggedVerifier(fresh)
        for _ in range(3):
            fresh_verifier.chunk_plans.clear()
            expected = v2_runner.verify(fresh_verifier, *args, logits_divided=False)
            got = v2_runner.verify(kept_verifier, *args, logits_divided=False)
            assert all(torch.equal(e, g) for e, g in zip(expected, got)), case
        planned += len(kept_verifier.chunk_plans)
        assert torch.equal(kept.num_accepted_tokens, fresh.num_accepted_tokens), case
        assert torch.equal(kept.num_emitted_tokens, fresh.num_emitted_tokens), case
        assert kept.num_draft_tokens == fresh.num_draft_tokens, case
        launches: list = []
        with planned_for(LaunchConfig(num_sms=132, kernels=True, launches=launches)):
            v2_runner.verify(kept_verifier, *args, logits_divided=False)
        assert launches, case  # planned, not launched: the plan made outside was not taken
    assert planned > 0  # (the plans were kept: the warm calls took them)
