"""Tree drafting end to end on tiny transformers models (CPU): tree attention scores every path
as a plain forward would, greedy tree decoding is the target's greedy generation, and the first
two generated tokens follow the target's joint law (chi-square, CHI2_ALPHA = 1e-3, fixed seeds)."""

from __future__ import annotations

import pytest
import torch
from stats_helpers import CHI2_ALPHA, chi2_pvalue
from tiny_models import noisy_copy, tiny_llama

from spec_samplers import SamplingParams
from spec_samplers.constants import SpecSamplerInputError
from spec_samplers.decoding import SpeculativeDecoder
from spec_samplers.decoding.tree_drafting import NodeBudget, as_tree_shape, static_parents
from spec_samplers.integrations.transformers import HFLanguageModel
from spec_samplers.sampling_params import process_logits

V = 12


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0, vocab_size=V)
    return target, noisy_copy(target, 0.5, seed=1)


def test_tree_attention_scores_every_path_as_a_plain_forward(pair):
    target, _ = pair
    lm = HFLanguageModel(target)
    cache = lm.new_kv_cache()
    lm.forward(torch.tensor([[1, 2, 3], [-1, 4, 5]]), cache)  # request 1 left-padded
    query = torch.tensor([[7, 8, 9, 10, 11], [3, 4, 5, 6, 7]])
    parents = torch.tensor([-1, 0, 0, 1, 2])  # 0 -> {1, 2}, 1 -> 3, 2 -> 4
    logits = lm.forward_tree(query, parents, cache)
    with torch.no_grad():
        for path in ([0, 1, 3], [0, 2, 4]):
            for b, prefix in enumerate(([1, 2, 3], [4, 5])):
                full = target(torch.tensor([prefix + query[b, path].tolist()])).logits[0, -3:]
                torch.testing.assert_close(logits[b, path], full, rtol=1e-4, atol=1e-4)
    # keep one path: the next plain forward continues it
    cache.keep_query_slots(torch.tensor([[True, True, False, True, False]] * 2))
    nxt = lm.forward(torch.tensor([[1], [2]]), cache)
    with torch.no_grad():
        full = target(torch.tensor([[1, 2, 3, 7, 8, 10, 1]])).logits[0, -1]
    torch.testing.assert_close(nxt[0, -1], full, rtol=1e-4, atol=1e-4)
    assert cache.get_num_tokens_per_request() == [7, 6]


def test_static_tree_layout():
    shape = as_tree_shape([2, 2, 1])
    assert shape.widths == (2, 4, 4) and shape.num_nodes == 10 and shape.depth == 3
    assert static_parents(shape) == [0, 0, 1, 1, 2, 2, 3, 4, 5, 6]
    assert as_tree_shape(NodeBudget(8, 3)).widths == (3, 3, 2)
    with pytest.raises(SpecSamplerInputError, match="tree"):
        as_tree_shape([2, 0])
    with pytest.raises(SpecSamplerInputError, match="expansion"):
        NodeBudget(8, 3, "beam")


TREES = [
    ([2, 2, 1], "independent"),
    ([3, 1], "without_replacement"),
    ([2, 2], "deterministic"),
    (NodeBudget(8, 3), "independent"),
    (NodeBudget(7, 2, "sampled"), "without_replacement"),
]


@pytest.mark.parametrize(("tree", "policy"), TREES, ids=[f"{t}-{p}" for t, p in TREES])
def test_greedy_tree_decoding_is_the_targets_greedy_generation(pair, tree, policy):
    target, draft = pair
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9, 10, 11, 0, 4, 5]]
    decoder = SpeculativeDecoder(HFLanguageModel(target), HFLanguageModel(draft), tree=tree, draft_sampling=policy)
    out = decoder.generate(prompts, max_new_tokens=12, sampling_params=SamplingParams(temperature=0))
    with torch.no_grad():
        for b, p in enumerate(prompts):
            ids = torch.tensor([p])
            ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
            assert out.token_ids[b].tolist() == ref[0, len(p) :].tolist()


@pytest.mark.parametrize(
    ("tree", "policy"),
    [([2, 1], "independent"), (NodeBudget(5, 2, "sampled"), "without_replacement"), (NodeBudget(5, 2), "independent")],
)
def test_first_two_tokens_follow_the_target_joint_with_tree_drafting(pair, tree, policy):
    target, draft = pair
    params = SamplingParams(temperature=0.9, top_k=8)
    prompt = [3, 5, 7]
    N = 3000
    decoder = SpeculativeDecoder(HFLanguageModel(target), HFLanguageModel(draft), tree=tree, draft_sampling=policy)
    out = decoder.generate(torch.tensor([prompt] * N), max_new_tokens=2, sampling_params=params, seed=13)
    assert bool((out.token_ids >= 0).all())
    with torch.no_grad():
        q1 = process_logits(target(torch.tensor([prompt])).logits[:, -1], params)[0]
        context = torch.cat([torch.tensor([prompt] * V), torch.arange(V)[:, None]], dim=1)
        q2 = process_logits(target(context).logits[:, -1], params)
    cells = out.token_ids[:, 0] * V + out.token_ids[:, 1]
    assert chi2_pvalue(cells, (q1[:, None] * q2).flatten()) > CHI2_ALPHA
    assert sum(s.num_accepted for s in out.stats) > 0


def test_tree_needs_a_sampler_with_forward_tree(pair):
    target, draft = pair

    class ChainOnly(torch.nn.Module):
        def forward(self, *args):
            raise AssertionError

    with pytest.raises(SpecSamplerInputError, match="forward_tree"):
        SpeculativeDecoder(HFLanguageModel(target), HFLanguageModel(draft), ChainOnly(), tree=[2])


def test_the_verifier_gets_each_nodes_own_draft_distribution(pair, monkeypatch):
    """In every round, row j given to forward_tree is the draft's distribution after the committed
    tokens and the path root..j, and the target's row likewise (a misaligned row stays exact but
    loses acceptance, so the joint-law tests cannot see it). Two requests, so that rows are
    padded differently."""
    target, draft = pair
    calls = []
    decoder = SpeculativeDecoder(HFLanguageModel(target), HFLanguageModel(draft), tree=NodeBudget(7, 3, "sampled"))
    original = type(decoder.sampler).forward_tree

    def spy(self, q, p, tokens, parents, *args, **kwargs):
        out = original(self, q, p, tokens, parents, *args, **kwargs)
        calls.append((q[0].clone(), p[0].clone(), tokens[0].clone(), torch.as_tensor(parents)[0].clone(), out))
        return out

    monkeypatch.setattr(type(decoder.sampler), "forward_tree", spy)
    prompt = [3, 5, 7, 2]
    decoder.generate([prompt, [4, 4, 1]], max_new_tokens=10, sampling_params=SamplingParams(temperature=1.0), seed=3)
    assert len(calls) >= 3
    context = list(prompt)
    for q, p, tokens, parents, out in calls:
        for j in range(6):  # nodes with children: levels 0..2 of a tree of widths 3, 2, 2
            path, node = [], j
            while node > 0:
                path.insert(0, int(tokens[node - 1]))
                node = int(parents[node - 1])
            with torch.no_grad():
                ids = torch.tensor([context + path])
                torch.testing.assert_close(p[j], torch.softmax(draft(ids).logits[0, -1], -1), rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(q[j], torch.softmax(target(ids).logits[0, -1], -1), rtol=1e-4, atol=1e-5)
        context += [t for t in out.token_ids[0].tolist() if t >= 0]
