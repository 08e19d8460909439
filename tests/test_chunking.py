"""The PyTorch path in chunks of requests (spec_samplers.chunking) gives the tokens of the whole
batch, token for token: every entry of every built-in sampler, at one request per chunk."""

from __future__ import annotations

import pytest
import torch

from spec_samplers import BlockVerificationSampler, RejectionSampler, SamplingParams, TypicalAcceptanceSampler, chunking
from spec_samplers.layout import VerifyBatch

B, K, V = 7, 3, 33
SAMPLERS = {
    "rejection": lambda: RejectionSampler(backend="torch"),
    "typical": lambda: TypicalAcceptanceSampler(backend="torch"),
    "block": lambda: BlockVerificationSampler(backend="torch"),
}


def _randomness(sampler: torch.nn.Module, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    if isinstance(sampler, TypicalAcceptanceSampler):
        return {}
    return {
        "seeds": torch.randint(0, 2**62, (n,), generator=gen),
        "offsets": torch.randint(0, 100, (n,), generator=gen),
    }


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    # a peaked target and a draft near it, so that requests stop at different positions
    target_logits = 3 * torch.randn(B, K + 1, V, generator=gen)
    draft_logits = target_logits[:, :K] + torch.randn(B, K, V, generator=gen)
    draft_ids = torch.multinomial(draft_logits.softmax(-1).reshape(-1, V), 1, generator=gen).view(B, K)
    draft_ids[0, 1] = V + 5  # out of range: rejected
    bonus = torch.randint(0, V, (B, 1), generator=gen)
    return gen, target_logits, draft_logits, draft_ids, bonus


def _ragged(gen: torch.Generator, counts: list[int]):
    T = sum(counts)
    target_logits = 3 * torch.randn(T, V, generator=gen)
    draft_logits = target_logits + torch.randn(T, V, generator=gen)
    draft_ids = torch.randint(0, V, (T,), generator=gen)
    cu = torch.tensor(counts).cumsum(0)
    bonus = torch.randint(0, V, (len(counts),), generator=gen)
    return target_logits, draft_logits, draft_ids, cu, bonus


def _both(monkeypatch: pytest.MonkeyPatch, call) -> tuple[torch.Tensor, torch.Tensor]:
    """(whole batch, one request per chunk) outputs of ``call()``; also checks that the small
    setting does split the batch."""
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 2**62)
    whole = call()
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 1)
    calls = []
    original = chunking.request_slice
    monkeypatch.setattr(chunking, "request_slice", lambda *a, **k: calls.append(1) or original(*a, **k))
    chunked = call()
    assert len(calls) > 1, "the batch was not split"
    return whole, chunked


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("entry", ["forward", "forward_from_logits", "forward_params"])
def test_padded_entries_chunked_equal_whole(monkeypatch: pytest.MonkeyPatch, name: str, entry: str) -> None:
    sampler = SAMPLERS[name]()
    gen, target_logits, draft_logits, draft_ids, bonus = _inputs(1)
    extra = _randomness(sampler, B, gen)
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0, 0.0, 2.0])  # greedy requests among them

    def call() -> torch.Tensor:
        if entry == "forward":
            return sampler(target_logits.softmax(-1), bonus, draft_logits.softmax(-1), draft_ids, **extra)
        if entry == "forward_from_logits":
            return sampler.forward_from_logits(target_logits, bonus, draft_logits, draft_ids, temperature, **extra)
        params = [SamplingParams(temperature=0.8, top_k=5), SamplingParams(top_p=0.9, min_p=0.05)] * 3
        params.append(SamplingParams(temperature=0.0))
        return sampler.forward_from_logits(
            target_logits, bonus, draft_logits, draft_ids, sampling_params=params, **extra
        )

    whole, chunked = _both(monkeypatch, call)
    assert torch.equal(whole, chunked)
    assert (whole[:, 0] >= 0).all()  # every request emitted a token: the comparison is not vacuous


RAGGED_CASES = [
    (name, entry)
    for name in SAMPLERS
    for entry in ("forward_ragged", "forward_ragged_from_logits", "draft_rows", "point_mass")
    if entry != "draft_rows" or SAMPLERS[name]().takes_draft_rows  # the others refuse it by name
]


@pytest.mark.parametrize(("name", "entry"), RAGGED_CASES)
def test_ragged_entries_chunked_equal_whole(monkeypatch: pytest.MonkeyPatch, name: str, entry: str) -> None:
    sampler = SAMPLERS[name]()
    gen = torch.Generator().manual_seed(2)
    counts = [3, 0, 2, 3, 1, 0, 3, 2]
    target_logits, draft_logits, draft_ids, cu, bonus = _ragged(gen, counts)
    extra = _randomness(sampler, len(counts), gen)
    temperature = torch.tensor([1.0, 1.0, 0.0, 0.5, 1.0, 2.0, 1.0, 0.0])
    # an engine's draft matrix read through row indices, one of them out of range
    matrix = torch.randn(5, V, generator=gen)
    rows = torch.randint(0, 5, (draft_ids.shape[0],), generator=gen)
    rows[3] = 9

    def call() -> torch.Tensor:
        if entry == "forward_ragged":
            probs = draft_logits.softmax(-1)
            return sampler.forward_ragged(target_logits.softmax(-1), bonus, probs, draft_ids, cu, K, **extra)
        if entry == "point_mass":
            return sampler.forward_ragged(target_logits.softmax(-1), bonus, None, draft_ids, cu, K, **extra)
        if entry == "forward_ragged_from_logits":
            return sampler.forward_ragged_from_logits(
                target_logits, bonus, draft_logits, draft_ids, cu, K, temperature, **extra
            )
        return sampler.forward_ragged_from_logits(
            target_logits, bonus, matrix, draft_ids, cu, K, temperature, draft_rows=rows, **extra
        )

    whole, chunked = _both(monkeypatch, call)
    assert torch.equal(whole, chunked)


def test_malformed_ragged_metadata_runs_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Non-monotone counts keep their one rule (spec_samplers.layout) by running unsplit."""
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 1)
    gen = torch.Generator().manual_seed(3)
    target_logits, _, draft_ids, _, bonus = _ragged(gen, [2, 2, 2])
    cu = torch.tensor([2, 1, 6])
    batch = VerifyBatch.ragged(target_logits.softmax(-1), bonus, None, draft_ids, cu, K)
    assert chunking.chunk_bounds(batch) is None
    cu_ok = torch.tensor([2, 4, 6])
    bounds = list(
        chunking.chunk_bounds(VerifyBatch.ragged(target_logits.softmax(-1), bonus, None, draft_ids, cu_ok, K))
    )
    assert bounds == [(0, 1, (0, 2)), (1, 2, (2, 4)), (2, 3, (4, 6))]


def test_requests_per_chunk_bounds_the_rows() -> None:
    """At vLLM's CPU test shape (V = 4096, K = 1) a chunk holds 32 requests: 256 Ki entries."""
    assert chunking.requests_per_chunk(2, 4096) == 32
    assert chunking.requests_per_chunk(2, 10**9) == 1


def test_a_request_within_the_budget_never_runs_alone() -> None:
    """One request alone in its chunk only when its rows alone are over the budget: at K = 4,
    V = 32000 (160,000 entries, over half of 2**18) two requests share a chunk; at V = 128256
    (641,280 entries, over the budget) each runs alone; a chunk stays under twice the budget."""
    budget = chunking.CHUNK_ELEMENTS
    assert chunking.requests_per_chunk(5, 32000) == 2
    assert chunking.requests_per_chunk(5, 128256) == 1
    assert chunking.requests_per_chunk(1, budget) == 2
    assert chunking.requests_per_chunk(1, budget + 1) == 1
    for rows, V in [(5, 32000), (2, 4096), (1, budget // 2 + 1), (1, budget // 3)]:
        n = chunking.requests_per_chunk(rows, V)
        assert n >= 2 and n * rows * V < 2 * budget, (rows, V, n)


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("entry", ["forward_tree", "forward_tree_from_logits"])
def test_tree_entries_chunked_equal_whole(monkeypatch: pytest.MonkeyPatch, name: str, entry: str) -> None:
    sampler = SAMPLERS[name]()
    gen = torch.Generator().manual_seed(4)
    parents = torch.tensor([0, 0, 1, 1, 2, 2])  # a binary tree of depth 3
    N = parents.shape[0]
    target_logits = 3 * torch.randn(B, N + 1, V, generator=gen)
    draft_logits = target_logits + torch.randn(B, N + 1, V, generator=gen)
    # node j's token drawn from its parent's draft row
    tokens = torch.multinomial(draft_logits[:, parents].softmax(-1).reshape(-1, V), 1, generator=gen).view(B, N)
    extra = _randomness(sampler, B, gen)
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0, 0.0, 2.0])

    def call() -> torch.Tensor:
        if entry == "forward_tree":
            out = sampler.forward_tree(target_logits.softmax(-1), draft_logits.softmax(-1), tokens, parents, **extra)
        else:
            out = sampler.forward_tree_from_logits(target_logits, draft_logits, tokens, parents, temperature, **extra)
        return torch.cat([out.token_ids, out.node_ids], dim=1)

    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 2**62)
    whole = call()
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 1)
    calls = []
    original = chunking._tree_slice
    monkeypatch.setattr(chunking, "_tree_slice", lambda *a: calls.append(1) or original(*a))
    chunked = call()
    assert len(calls) == B
    assert torch.equal(whole, chunked)


def test_a_planted_slicing_fault_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Power of the comparison: chunks that drop the offsets draw other numbers, and the tokens
    differ from the whole batch's."""
    sampler = RejectionSampler(backend="torch")
    gen, target_logits, draft_logits, draft_ids, bonus = _inputs(5)
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    offsets = torch.randint(1, 100, (B,), generator=gen)

    def call() -> torch.Tensor:
        probs = target_logits.softmax(-1), draft_logits.softmax(-1)
        return sampler(probs[0], bonus, probs[1], draft_ids, seeds=seeds, offsets=offsets)

    original = chunking.request_slice

    def faulty(*args, **kwargs):
        from dataclasses import replace

        return replace(original(*args, **kwargs), offsets=None)

    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 2**62)
    whole = call()
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(chunking, "request_slice", faulty)
    assert not torch.equal(whole, call())
