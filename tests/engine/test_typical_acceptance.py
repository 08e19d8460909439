"""typical_acceptance_sampler, n-gram drafting, fp32. Typical acceptance is lossy by design (it
accepts drafts the target finds typical enough), so no law test: greedy requests in mixed batches
(a), min_p / logit_bias served (c), seeds (e)."""

from __future__ import annotations

import pytest
from conftest import GREEDY_TOKENS, PROMPTS, assert_greedy_rows, check_seeds

from spec_samplers.certify.vllm_engine import EngineSpec
from spec_samplers.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(engine_factory, pair):
    return engine_factory(EngineSpec(pair.target, sampler="typical_acceptance_sampler"))


def test_our_sampler_is_installed(engine):
    assert engine.installed() == {"vllm.v1.sample.rejection_sampler.rejection_sample": "typical_acceptance_sampler()"}


def test_greedy_requests_in_mixed_batches(engine, greedy_reference):
    params, prompts, greedy_at = [], [], []
    for i in range(120):
        b = i % len(PROMPTS)
        prompts.append(PROMPTS[b])
        if i % 4 == 3:
            greedy_at.append((len(params), b))
            params.append(SamplingParams(0.0))
        else:
            params.append(SamplingParams(1.0, top_p=0.9 if i % 2 else 1.0, seed=i))
    rows = engine.generate(prompts, params, GREEDY_TOKENS)
    greedy = [[rows[j] for j, b in greedy_at if b == p] for p in range(len(PROMPTS))]
    assert_greedy_rows(greedy, greedy_reference)
    assert engine.counts().accepted_tokens > 0  # n-gram drafts were verified and some accepted


def test_seeded_requests_reproduce(engine):
    check_seeds(engine)
