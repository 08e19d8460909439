"""bf16 engine: rejection_sampler with n-gram drafting. Greedy requests in mixed batches equal the
target's greedy continuation in bf16 (transformers) (a); the law of verified tokens matches the
exact law of the bf16 target (logits processed in fp32) (b)."""

from __future__ import annotations

import pytest
from conftest import GREEDY_TOKENS, PROMPTS, assert_greedy_rows, describe, law_run

from spec_samplers.certify.law import greedy_continuation
from spec_samplers.certify.tiny_models import load_causal_lm
from spec_samplers.certify.vllm_engine import EngineSpec


@pytest.fixture(scope="module")
def engine(engine_factory, pair):
    return engine_factory(EngineSpec(pair.target, sampler="rejection_sampler", dtype="bfloat16"))


@pytest.fixture(scope="module")
def run(engine, pair):
    return law_run(engine, pair, "T=1", dtype="bfloat16", seed=2)


def test_law_of_verified_tokens(run):
    assert run.verdict.consistent, describe(run.verdict)


def test_greedy_requests_in_mixed_batches(run, pair):
    import torch

    model = load_causal_lm(pair.target, dtype=torch.bfloat16)
    reference = [greedy_continuation(model, p, GREEDY_TOKENS) for p in PROMPTS]
    assert_greedy_rows(run.greedy, reference)
