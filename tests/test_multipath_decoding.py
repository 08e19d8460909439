"""K draft paths in the decoding loop and in ``custom_generate`` (``num_paths=K``), verified by
multi-path block verification in one target pass, on tiny transformers models (CPU): greedy
decoding is the target's greedy generation, the first two sampled tokens follow the target's
joint law (chi-square, CHI2_ALPHA = 1e-3, fixed seeds), bad combinations are clear errors."""

from __future__ import annotations

import pytest
import torch
from stats_helpers import CHI2_ALPHA, chi2_pvalue
from test_hf_generate import spec_kwargs
from tiny_models import noisy_copy, tiny_llama

from spec_samplers import SamplingParams
from spec_samplers.constants import SpecSamplerInputError
from spec_samplers.decoding import SpeculativeDecoder
from spec_samplers.integrations.transformers import HFLanguageModel
from spec_samplers.sampling_params import process_logits

V = 12
NAME = "multipath_block_verification"


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0, vocab_size=V)
    return target, noisy_copy(target, 0.5, seed=1)


def test_greedy_is_the_targets_greedy_generation(pair):
    target, draft = pair
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9, 10, 11, 0, 4, 5]]
    decoder = SpeculativeDecoder(
        HFLanguageModel(target), HFLanguageModel(draft), NAME, num_speculative_tokens=3, num_paths=3
    )
    out = decoder.generate(prompts, max_new_tokens=12, sampling_params=SamplingParams(temperature=0))
    with torch.no_grad():
        for b, p in enumerate(prompts):
            ids = torch.tensor([p])
            ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
            assert out.token_ids[b].tolist() == ref[0, len(p) :].tolist()


def test_first_two_tokens_follow_the_target_joint(pair):
    target, draft = pair
    params = SamplingParams(temperature=0.9, top_k=8)
    prompt = [3, 5, 7]
    N = 3000
    decoder = SpeculativeDecoder(
        HFLanguageModel(target), HFLanguageModel(draft), NAME, num_speculative_tokens=2, num_paths=3
    )
    out = decoder.generate(torch.tensor([prompt] * N), max_new_tokens=2, sampling_params=params, seed=17)
    assert bool((out.token_ids >= 0).all())
    with torch.no_grad():
        q1 = process_logits(target(torch.tensor([prompt])).logits[:, -1], params)[0]
        context = torch.cat([torch.tensor([prompt] * V), torch.arange(V)[:, None]], dim=1)
        q2 = process_logits(target(context).logits[:, -1], params)
    cells = out.token_ids[:, 0] * V + out.token_ids[:, 1]
    assert chi2_pvalue(cells, (q1[:, None] * q2).flatten()) > CHI2_ALPHA
    assert sum(s.num_accepted for s in out.stats) > 0


def test_custom_generate_takes_num_paths(pair):
    target, draft = pair
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    common = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    ref = target.generate(**common)
    out = target.generate(
        **common, assistant_model=draft, num_assistant_tokens=3, **spec_kwargs(sampler=NAME, num_paths=2)
    )
    assert torch.equal(out, ref)


def test_bad_combinations_are_errors(pair):
    target, draft = pair
    models = (HFLanguageModel(target), HFLanguageModel(draft))
    with pytest.raises(SpecSamplerInputError, match="tree"):
        SpeculativeDecoder(*models, NAME, tree=[2, 2])
    with pytest.raises(SpecSamplerInputError, match="draft_sampling"):
        SpeculativeDecoder(*models, NAME, num_paths=2, draft_sampling="without_replacement")
    with pytest.raises(SpecSamplerInputError, match="num_paths"):
        SpeculativeDecoder(*models, NAME, num_paths=2, tree=[2, 1])
    with pytest.raises(SpecSamplerInputError, match="num_paths"):
        SpeculativeDecoder(*models, NAME, num_paths=0)
