"""vLLM's own verification (no spec_samplers section), draft-model drafting (probabilistic), fp32:
min_p and logit_bias are refused without our section (c), and the law test has power on a real
fault: vLLM 0.32's CPU build divides the draft rows by uninitialised per-row temperatures
(vLLM issue #55005), and the same law test that our samplers pass rejects its tokens."""

from __future__ import annotations

import pytest
from conftest import PROMPTS, describe, law_run

from spec_samplers.certify.vllm_engine import EngineSpec


@pytest.fixture(scope="module")
def engine(engine_factory, pair):
    return engine_factory(EngineSpec(pair.target, pair.draft, draft_sample_method="probabilistic"))


def test_nothing_is_installed(engine):
    assert engine.installed() == {}


@pytest.mark.parametrize("field", [{"min_p": 0.1}, {"logit_bias": {3: 1.0}}])
def test_min_p_and_logit_bias_are_refused(engine, field):
    from vllm import SamplingParams as VllmParams

    with pytest.raises(Exception, match="not yet supported with speculative decoding"):  # VLLMValidationError
        engine.generate([PROMPTS[0]], [VllmParams(max_tokens=2, detokenize=False, **field)], 2)


def test_law_test_rejects_vllms_own_cpu_verification(engine, pair):
    run = law_run(engine, pair, "T=1", seed=3)
    assert not run.verdict.consistent, "vLLM #55005 fixed in this build? " + describe(run.verdict)
