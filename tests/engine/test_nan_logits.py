"""(f) every request gains at least one in-vocabulary token per engine step, even when its target
logits are all NaN (a target whose head is NaN): vLLM's contract at the verification seam
(its test_all_nan_target_logits_in_range). Our samplers give -1 to direct callers there
(docs/contract.md); the seam gives token 0, as vLLM's own verification does."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, run_with_timeout

from spec_samplers.certify.tiny_models import load_causal_lm
from spec_samplers.certify.vllm_engine import EngineSpec
from spec_samplers.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def nan_target(pair, tmp_path_factory):
    model = load_causal_lm(pair.target)
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    path = tmp_path_factory.mktemp("nan") / "target"
    model.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("drafting", ["ngram", "draft_model"])
def test_every_request_progresses_with_nan_logits(engine_factory, pair, nan_target, drafting):
    draft = pair.draft if drafting == "draft_model" else None
    engine = engine_factory(
        EngineSpec(nan_target, draft, sampler="block_verification" if draft else "rejection_sampler")
    )
    params = [SamplingParams(0.0) if i % 3 == 0 else SamplingParams(1.0, seed=i) for i in range(12)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(12)]
    rows = run_with_timeout(lambda: engine.generate(prompts, params, 10), 300)
    assert all(len(r) == 10 for r in rows), [len(r) for r in rows]
    assert all(0 <= t < 16 for r in rows for t in r), rows
    engine.close()
