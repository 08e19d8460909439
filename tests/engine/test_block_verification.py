"""block_verification, draft-model drafting with vLLM's greedy draft_sample_method (point-mass
drafts), fp32: greedy requests in mixed batches (a), the law of verified tokens (b), seeds (e)."""

from __future__ import annotations

import pytest
from conftest import LAWS, assert_greedy_rows, check_seeds, describe, law_run

from spec_samplers.certify.vllm_engine import EngineSpec


@pytest.fixture(scope="module")
def engine(engine_factory, pair):
    return engine_factory(EngineSpec(pair.target, pair.draft, sampler="block_verification"))


@pytest.fixture(scope="module")
def runs(engine, pair):
    return {name: law_run(engine, pair, name, seed=1) for name in LAWS}


def test_our_sampler_is_installed(engine):
    assert engine.installed() == {"vllm.v1.sample.rejection_sampler.rejection_sample": "block_verification()"}


@pytest.mark.parametrize("name", list(LAWS))
def test_law_of_verified_tokens(runs, name):
    verdict = runs[name].verdict
    assert verdict.consistent, describe(verdict)


@pytest.mark.parametrize("name", list(LAWS))
def test_greedy_requests_in_mixed_batches(runs, name, greedy_reference):
    assert_greedy_rows(runs[name].greedy, greedy_reference)


def test_seeded_requests_reproduce(engine):
    check_seeds(engine)
