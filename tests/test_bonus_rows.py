"""The inputs of the bonus-row verification (spec_samplers.bonus_rows): the one-launch kernel
against the eager reference, value for value, on Model Runner V2-like batches (int32 and int64
indices, with and without a drafter cache, requests longer than the kernel's vector step)."""

import pytest
import torch
from conftest import DEVICE

from spec_samplers.bonus_rows import bonus_row_inputs, bonus_row_inputs_reference
from spec_samplers.kernels.bonus_row_kernels import bonus_row_inputs_triton


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
