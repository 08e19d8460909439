"""rejection_sampler, draft-model drafting with vLLM's probabilistic draft_sample_method, fp32:
greedy requests in mixed batches (a), the law of verified tokens (b), min_p and logit_bias (c)."""

from __future__ import annotations

import pytest
from conftest import LAWS, PROMPTS, assert_greedy_rows, describe, law_run

from spec_samplers.certify.vllm_engine import EngineSpec
from spec_samplers.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(engine_factory, pair):
    spec = EngineSpec(pair.target, pair.draft, sampler="rejection_sampler", draft_sample_method="probabilistic")
    return engine_factory(spec)


@pytest.fixture(scope="module")
def runs(engine, pair):
    return {name: law_run(engine, pair, name) for name in LAWS}


def test_our_sampler_is_installed(engine):
    assert engine.installed() == {"vllm.v1.sample.rejection_sampler.rejection_sample": "rejection_sampler()"}


@pytest.mark.parametrize("name", list(LAWS))
def test_law_of_verified_tokens(runs, name):
    verdict = runs[name].verdict
    assert verdict.consistent, describe(verdict)


@pytest.mark.parametrize("name", list(LAWS))
def test_greedy_requests_in_mixed_batches(runs, name, greedy_reference, nonspeculative_greedy):
    assert nonspeculative_greedy == greedy_reference
    assert_greedy_rows(runs[name].greedy, greedy_reference)


def test_acceptance_is_counted(engine):
    before = engine.counts()
    engine.generate(PROMPTS, [SamplingParams(1.0, seed=i) for i in range(len(PROMPTS))], 8)
    after = engine.counts()
    print("spec decode counts", before, after)
    counts = after - before
    assert counts.drafts > 0 and 0 < counts.accepted_tokens < counts.draft_tokens, (before, after)


def test_min_p_and_logit_bias_are_served(engine, greedy_reference):
    """(c): vLLM 0.32 refuses both with speculative decoding; with our section they are served,
    and applied: a greedy request with a bias of +100 on token 5 gives 5 at every position, one
    with -100 on its reference's first token never gives it first."""
    from vllm import SamplingParams as VllmParams

    common = dict(max_tokens=6, min_tokens=6, ignore_eos=True, detokenize=False)
    first = greedy_reference[0][0]
    params = [
        VllmParams(temperature=0.0, logit_bias={5: 100.0}, **common),
        VllmParams(temperature=0.0, logit_bias={first: -100.0}, **common),
        VllmParams(temperature=0.8, min_p=0.2, seed=3, **common),
        VllmParams(temperature=0.8, min_p=0.2, logit_bias={7: 3.0}, seed=4, **common),
    ]
    rows = engine.generate([PROMPTS[0]] * len(params), params, 6)
    assert rows[0] == [5] * 6
    assert rows[1][0] != first
    assert all(len(r) == 6 and all(0 <= t < 16 for t in r) for r in rows[2:]), rows
