"""The engine seam (spec_samplers.engine_seam): what callers read from a sampler, read once; and
the typed errors that replaced reachable asserts in the reference and the ragged verifier."""

from __future__ import annotations

import pytest
import torch

from spec_samplers import RejectionSampler, TypicalAcceptanceSampler, engine_seam
from spec_samplers.base import SpecDecodeStochasticBaseSampler
from spec_samplers.constants import SpecSamplerInputError
from spec_samplers.decoding.speculative import SpeculativeDecoder
from spec_samplers.engine_seam import ENTRIES, bind, replace_engine_function
from spec_samplers.integrations.vllm.ragged import RaggedVerifier
from spec_samplers.layout import RowLayout, VerifyBatch
from spec_samplers.logits_processor import LogitsPipe, Softmax, Temperature
from spec_samplers.reference import rejection_reference

V = 8


class V0Forward(torch.nn.Module):
    """vLLM V0's shape of a third-party sampler: a padded forward with generators."""

    def forward(self, target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, seeded_seqs=None):
        return torch.zeros(draft_token_ids.shape[0], draft_token_ids.shape[1] + 1, dtype=torch.int64)


class V0Subclass(SpecDecodeStochasticBaseSampler):
    """A base subclass that only overrides forward: its other entries need the op it lacks."""

    def forward(self, target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, seeded_seqs=None):
        return V0Forward()(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)


def test_bind_reads_entries_keywords_randomness_and_filters():
    stochastic = bind(RejectionSampler())
    assert tuple(stochastic.entries) == ENTRIES and stochastic.randomness == "tensors"
    assert stochastic.accepts("forward", "is_greedy") and not stochastic.accepts("forward_from_logits", "is_greedy")
    assert stochastic.applies_filters == RejectionSampler.applies_filters
    deterministic = bind(TypicalAcceptanceSampler())
    assert deterministic.randomness == "none" and not deterministic.keywords["forward"]
    v0 = bind(V0Forward())
    assert tuple(v0.entries) == ("forward",) and v0.randomness == "generators"
    # a base subclass without the op: forward only, so the ragged verifier pads for it
    assert tuple(bind(V0Subclass()).entries) == ("forward",)
    assert not RaggedVerifier(V0Subclass()).uses_ragged_method


def test_randomness_for_keeps_what_the_entry_takes_and_drops_none():
    bound = bind(RejectionSampler())
    seeds = torch.arange(2)
    got = bound.randomness_for("forward_from_logits", seeds=seeds, offsets=None, is_greedy=torch.ones(2, dtype=bool))
    assert list(got) == ["seeds"] and got["seeds"] is seeds
    assert bind(TypicalAcceptanceSampler()).randomness_for("forward", seeds=seeds) == {}


def test_signatures_are_read_once(monkeypatch):
    """LogitsPipe.verify, the decoding loop and the ragged verifier read a sampler's signatures
    when they first see it, not on every call."""
    reads = []
    real = engine_seam.inspect.signature
    monkeypatch.setattr(engine_seam.inspect, "signature", lambda fn: reads.append(fn) or real(fn))
    sampler = RejectionSampler()
    pipe = LogitsPipe([Temperature(), Softmax()])
    B, k = 2, 3
    args = (torch.randn(B, k + 1, V), torch.zeros(B, 1, dtype=torch.long), torch.randn(B, k, V))
    ids = torch.randint(0, V, (B, k))
    for _ in range(3):
        pipe.verify(sampler, *args, ids, temperature=torch.tensor([0.7, 0.0]), seeds=torch.arange(B))

    # the sampler's own methods (a compiler patched alike, numba's on its first call, reads others')
    def ours():
        return [fn for fn in reads if getattr(fn, "__self__", None) is sampler]

    assert len(ours()) == len(ENTRIES)
    SpeculativeDecoder(None, None, sampler)
    assert len(ours()) == 2 * len(ENTRIES)


def test_logits_pipe_refuses_seeds_for_a_deterministic_sampler_and_ragged_for_a_padded_one():
    pipe = LogitsPipe([Temperature(), Softmax()])
    B, k = 2, 2
    args = (torch.randn(B, k + 1, V), torch.zeros(B, 1, dtype=torch.long), None, torch.randint(0, V, (B, k)))
    with pytest.raises(SpecSamplerInputError, match="seeds: expected None"):
        pipe.verify(TypicalAcceptanceSampler(), *args, temperature=1.0, seeds=torch.arange(B))
    ragged = (torch.randn(3, V), torch.zeros(B, dtype=torch.long), None, torch.zeros(3, dtype=torch.long))
    with pytest.raises(SpecSamplerInputError, match="cu_num_draft_tokens: .*forward_ragged"):
        pipe.verify(V0Forward(), *ragged, cu_num_draft_tokens=torch.tensor([1, 3]), max_spec_len=2, temperature=1.0)


def test_replace_engine_function_binds_and_hands_engine_schemes_back():
    def verify(verifier, x, mode=None):
        return ("ours", verifier, x)

    replaced = replace_engine_function(
        "S", "V", verify, lambda *a, **kw: ("engine", a, kw), lambda a: a.get("mode") is not None
    )
    assert replaced(1) == ("ours", "V", 1) and replaced(x=2) == ("ours", "V", 2)
    assert replaced(3, mode="theirs") == ("engine", (3,), {"mode": "theirs"})
    assert replaced.__spec_samplers_sampler__ == "S"
    with pytest.raises(TypeError):
        replaced(1, 2, 3)


def test_reference_without_seeds_is_a_typed_error():
    B, K = 2, 2
    batch = VerifyBatch(
        RowLayout.padded(B, K, V),
        torch.rand(B, K + 1, V),
        torch.rand(B, K, V),
        torch.zeros(B, K, dtype=torch.long),
        torch.zeros(B, dtype=torch.long),
    )
    with pytest.raises(SpecSamplerInputError, match="seeds: expected"):
        rejection_reference(batch)


def test_ragged_logits_without_the_entry_is_a_typed_error():
    verifier = RaggedVerifier(V0Forward())
    assert not verifier.has_logits_entry
    args = (torch.rand(3, V), torch.zeros(2, dtype=torch.long), None, torch.zeros(3, dtype=torch.long))
    with pytest.raises(SpecSamplerInputError, match="sampler: expected .*forward_ragged_from_logits"):
        verifier.from_logits(*args, torch.tensor([1, 3]), 2, temperature=torch.ones(2))


def test_ragged_entry_without_max_spec_len_is_a_typed_error():
    args = (torch.rand(3, V), torch.zeros(2, dtype=torch.long), None, torch.zeros(3, dtype=torch.long))
    with pytest.raises(SpecSamplerInputError, match="max_spec_len"):
        RejectionSampler().forward_ragged(*args, torch.tensor([1, 3]), None)
