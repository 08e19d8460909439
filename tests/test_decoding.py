"""End to end: speculative decoding on tiny transformers Llama models (CPU, no downloads).

Statistical checks (fixed seeds, so deterministic; the rates are per test at a random seed):
* the joint law of the first two generated tokens equals the target's autoregressive joint under
  the same SamplingParams, computed exactly from the target: chi-square, false-failure rate
  CHI2_ALPHA = 1e-3;
* a lossless sampler accepts, on average, sum_x min(p'(x), q'(x)) of each draft it judges: the
  accepted count is a sum of independent-given-the-past Bernoulli trials with those means, so
  it lies within Z_BOUND = 5 standard errors (variance <= judged / 4) of the expectation.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from stats_helpers import CHI2_ALPHA, Z_BOUND, chi2_pvalue
from tiny_models import noisy_copy, tiny_llama

from spec_samplers import SamplingParams, available_samplers, get_sampler
from spec_samplers.decoding import (
    AutoregressiveInferencer,
    Inferencer,
    KVCache,
    SampleStrategy,
    SlotKVCache,
    SpeculativeDecoder,
    generate_autoregressive,
)
from spec_samplers.integrations.transformers import HFLanguageModel
from spec_samplers.sampling_params import process_logits

V = 12


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0, vocab_size=V)
    draft = noisy_copy(target, 0.5, seed=1)
    return target, draft


def lossless_samplers() -> list[str]:
    """Every registered sampler that declares itself lossless (block verification too, once registered)."""
    return [name for name, info in available_samplers().items() if getattr(info.load(), "lossless", None) is True]


@pytest.mark.parametrize("name", lossless_samplers())
def test_first_two_tokens_follow_the_target_joint(pair, name):
    target, draft = pair
    params = SamplingParams(temperature=0.9, top_k=8, top_p=0.95, min_p=0.02)
    prompt = [3, 5, 7]
    N = 3000
    decoder = SpeculativeDecoder(
        HFLanguageModel(target), HFLanguageModel(draft), sampler=name, num_speculative_tokens=2
    )
    out = decoder.generate(torch.tensor([prompt] * N), max_new_tokens=2, sampling_params=params, seed=11)
    assert out.token_ids.shape == (N, 2) and bool((out.token_ids >= 0).all())
    # exact joint of the target: q'(x1 | prompt) q'(x2 | prompt, x1)
    with torch.no_grad():
        q1 = process_logits(target(torch.tensor([prompt])).logits[:, -1], params)[0]  # [V]
        context = torch.cat([torch.tensor([prompt] * V), torch.arange(V)[:, None]], dim=1)  # [V, P+1]
        q2 = process_logits(target(context).logits[:, -1], params)  # [V, V], row x1
    joint = (q1[:, None] * q2).flatten()
    cells = out.token_ids[:, 0] * V + out.token_ids[:, 1]
    assert chi2_pvalue(cells, joint) > CHI2_ALPHA
    # acceptance of the judged drafts matches sum_x min(p', q') (lossless theory)
    verified = sum(s.num_verified for s in out.stats)
    accepted = sum(s.num_accepted for s in out.stats)
    expected = sum(s.expected_accepted for s in out.stats)
    assert 0 < accepted < verified
    assert abs(accepted - expected) <= Z_BOUND * math.sqrt(verified / 4)


def _two_token_sample(pair, sampler, **policy):
    """3000 requests, k = 2, 2 new tokens each: (decoder, output, exact joint of the first two
    tokens under the target)."""
    target, draft = pair
    params = SamplingParams(temperature=0.9, top_k=8, top_p=0.95, min_p=0.02)
    prompt = [3, 5, 7]
    decoder = SpeculativeDecoder(HFLanguageModel(target), HFLanguageModel(draft), sampler, 2, **policy)
    out = decoder.generate(torch.tensor([prompt] * 3000), max_new_tokens=2, sampling_params=params, seed=11)
    with torch.no_grad():
        q1 = process_logits(target(torch.tensor([prompt])).logits[:, -1], params)[0]  # [V]
        context = torch.cat([torch.tensor([prompt] * V), torch.arange(V)[:, None]], dim=1)
        q2 = process_logits(target(context).logits[:, -1], params)  # [V, V], row x1
    return decoder, out, (q1[:, None] * q2).flatten()


def test_draft_policy_keeps_the_target_joint(pair):
    """transformers' draft-length policy (stop after a draft whose own probability is below the
    threshold): the length is a stopping time of the draft's values, so rejection sampling keeps
    the target's joint: chi-square, false-failure rate CHI2_ALPHA = 1e-3 (fixed seed). The
    threshold splits the first round's requests between 1 and 2 drafts, so both paths are sampled."""
    decoder, out, joint = _two_token_sample(pair, "rejection_sampler", confidence_threshold=0.3)
    drafted = torch.tensor([s.num_drafted for s in out.stats])
    full = 2 * torch.tensor([s.num_rounds for s in out.stats])
    assert int((drafted < full).sum()) > 300 and int((drafted == full).sum()) > 300  # stopped early / drafted k
    cells = out.token_ids[:, 0] * V + out.token_ids[:, 1]
    assert chi2_pvalue(cells, joint) > CHI2_ALPHA


def test_draft_policy_law_test_has_power(pair, monkeypatch):
    """The same check fails on a planted fault: the bonus of a request that stopped drafting
    early is drawn after the batch's last draft instead of its own."""
    from spec_samplers.decoding import speculative

    monkeypatch.setattr(speculative, "after_own_drafts", lambda q, own_k: q[:, -1])
    _, out, joint = _two_token_sample(pair, "rejection_sampler", confidence_threshold=0.3)
    assert chi2_pvalue(out.token_ids[:, 0] * V + out.token_ids[:, 1], joint) < CHI2_ALPHA


def test_draft_policy_only_where_it_keeps_the_law(pair):
    """Block verification (acceptance of a position depends on the drafts after it) and trees draft
    their fixed shape; typical acceptance (token-wise) takes the policy; bad values name the argument."""
    target, draft = HFLanguageModel(pair[0]), HFLanguageModel(pair[1])
    policy = dict(confidence_threshold=0.4, draft_schedule="heuristic_transient")
    for sampler, tree, on in [
        ("rejection_sampler", None, True),
        ("typical_acceptance_sampler", None, True),
        ("block_verification", None, False),
        ("rejection_sampler", [2, 1], False),
    ]:
        decoder = SpeculativeDecoder(target, draft, sampler, 3, tree=tree, **policy)
        assert (decoder.confidence_threshold, decoder.draft_schedule) == (
            (0.4, "heuristic_transient") if on else (0.0, "constant")
        )
    with pytest.raises(ValueError, match="confidence_threshold"):
        SpeculativeDecoder(target, draft, confidence_threshold=1.5)
    with pytest.raises(ValueError, match="draft_schedule"):
        SpeculativeDecoder(target, draft, draft_schedule="adaptive")


def test_greedy_equals_the_targets_own_generate(pair):
    target, draft = pair
    prompts = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 0]])
    decoder = SpeculativeDecoder(HFLanguageModel(target), HFLanguageModel(draft), num_speculative_tokens=3)
    out = decoder.generate(prompts, max_new_tokens=16, sampling_params=SamplingParams(temperature=0))
    with torch.no_grad():
        ref = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=16, do_sample=False)
    assert torch.equal(out.token_ids, ref[:, prompts.shape[1] :])
    assert 0 < out.acceptance_rate < 1
    ar = generate_autoregressive(HFLanguageModel(target), prompts, 16, SamplingParams(temperature=0))
    assert torch.equal(ar.token_ids, out.token_ids)


@pytest.mark.parametrize("policy", [{}, {"confidence_threshold": 0.4, "draft_schedule": "heuristic"}])
def test_batched_equals_one_request_at_a_time(pair, monkeypatch, policy):
    """Also with transformers' draft-length policy: each request stops drafting on its own draft's
    confidence, so its tokens do not depend on its batch (only its draft passes do: the batch
    drafts until every request stopped)."""
    target, draft = pair
    compactions = []
    original = SlotKVCache.compact

    def spy(self, num_slots=None):
        compactions.append(num_slots)
        original(self, num_slots)

    monkeypatch.setattr(SlotKVCache, "compact_min_slots", 1)  # compact as soon as a slot can be freed
    monkeypatch.setattr(SlotKVCache, "compact", spy)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10], [11, 3]]
    params = [
        SamplingParams(temperature=0.8, seed=1),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_k=5, seed=3),
        SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05, seed=4),
    ]
    decoder = SpeculativeDecoder(HFLanguageModel(target), HFLanguageModel(draft), num_speculative_tokens=3, **policy)
    batched = decoder.generate(prompts, max_new_tokens=14, sampling_params=params)
    accepted_per_round = {tuple(s.accepted_per_position) for s in batched.stats}
    assert len(accepted_per_round) > 1, "rows should accept different numbers of drafts"
    assert compactions, "the per-request crops should have compacted a cache"
    for b, (prompt, p) in enumerate(zip(prompts, params)):
        alone = decoder.generate([prompt], max_new_tokens=14, sampling_params=[p])
        assert alone.token_ids[0].tolist() == batched.token_ids[b].tolist(), f"request {b}"
        # statistics agree; sum_x min(p', q') only to rounding (batched matmuls round differently)
        assert alone.stats[0].expected_accepted == pytest.approx(batched.stats[b].expected_accepted, rel=1e-5)
        passes = alone.stats[0].draft_forward_passes if policy else batched.stats[b].draft_forward_passes
        assert dataclasses.replace(alone.stats[0], expected_accepted=0.0) == dataclasses.replace(
            batched.stats[b], expected_accepted=0.0, draft_forward_passes=passes
        )


def test_eos_and_max_new_tokens_per_request(pair):
    target, draft = pair
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    greedy = SamplingParams(temperature=0)
    plain = SpeculativeDecoder(HFLanguageModel(target), HFLanguageModel(draft), num_speculative_tokens=4)
    free = plain.generate(prompts, max_new_tokens=9, sampling_params=greedy)
    row0 = free.token_ids[0].tolist()
    eos = next(t for i, t in enumerate(row0) if i >= 2 and t not in row0[:i])  # first new id at step >= 2
    stop_at = row0.index(eos)
    decoder = SpeculativeDecoder(
        HFLanguageModel(target, eos_token_id=eos), HFLanguageModel(draft), num_speculative_tokens=4
    )
    out = decoder.generate(prompts, max_new_tokens=9, sampling_params=greedy)
    # token_ids is as wide as the longest request (no [B, max_new_tokens] allocation up front)
    width = max(s.num_generated for s in out.stats)
    assert out.token_ids.shape == (3, width)
    for b in range(3):
        ref = free.token_ids[b].tolist()
        n = ref.index(eos) + 1 if eos in ref else 9
        assert out.token_ids[b].tolist() == ref[:n] + [-1] * (width - n)
        assert out.stats[b].num_generated == n and out.stats[b].finished_by_eos == (eos in ref)
    assert out.stats[0].num_generated == stop_at + 1 < 9
    # max_new_tokens cuts the last round short (k + 1 = 5 tokens per round at most)
    short = plain.generate(prompts, max_new_tokens=3, sampling_params=greedy)
    assert torch.equal(short.token_ids, free.token_ids[:, :3])
    assert plain.generate(prompts, max_new_tokens=0).token_ids.shape == (3, 0)


def test_output_grows_with_what_is_generated():
    """Issue 39: a huge max_new_tokens allocates nothing up front; the output grows (doubling)
    with the tokens generated, and a request stopped at EOS leaves it that short."""
    from spec_samplers.decoding.output import TokenBuffer

    buffer = TokenBuffer(2, 10**12, eos_token_ids=[7])
    assert buffer._storage.numel() <= 2 * TokenBuffer.INITIAL_WIDTH
    rows, widths = torch.arange(2), []
    for _ in range(40):  # 40 rounds of 5 tokens, no EOS among them
        new = torch.arange(5).repeat(2, 1) + 10
        assert not buffer.append(rows, new, torch.full((2,), 5)).any()
        widths.append(buffer._storage.shape[1])
    assert buffer.token_ids.shape == (2, 200) and widths[-1] == 256  # 64 -> 128 -> 256
    assert buffer.token_ids[:, :5].tolist() == [[10, 11, 12, 13, 14]] * 2
    finished = buffer.append(rows, torch.tensor([[1, 7, 3], [4, 5, 6]]), torch.tensor([3, 2]))
    assert finished.tolist() == [True, False] and buffer.num_tokens.tolist() == [202, 202]
    assert buffer.token_ids[0, 200:].tolist() == [1, 7] and buffer.token_ids.shape == (2, 202)
    small = TokenBuffer(1, 3, eos_token_ids=[])
    assert small.append(torch.arange(1), torch.tensor([[1, 2, 3, 4]]), torch.tensor([4])).tolist() == [True]
    assert small.token_ids.tolist() == [[1, 2, 3]] and small._storage.shape == (1, 3)


def test_model_without_eos_generates_to_max_new_tokens(pair):
    target, draft = pair
    model = HFLanguageModel(target)
    assert isinstance(model.new_kv_cache(), KVCache)
    with pytest.raises(ValueError, match="eos_token_id"):
        _ = model.eos_token_id
    out = SpeculativeDecoder(model, HFLanguageModel(draft), num_speculative_tokens=2).generate(
        torch.tensor([[1, 2]]), max_new_tokens=11, sampling_params=SamplingParams(seed=5)
    )
    assert out.stats[0].num_generated == 11 and bool((out.token_ids >= 0).all())


def test_typical_acceptance_runs_and_reports_acceptance(pair):
    target, draft = pair
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    decoder = SpeculativeDecoder(
        HFLanguageModel(target), HFLanguageModel(draft), sampler="typical_acceptance_sampler", num_speculative_tokens=3
    )
    out = decoder.generate(prompts, max_new_tokens=12, sampling_params=SamplingParams(temperature=1.0), seed=0)
    for s in out.stats:
        assert s.num_generated == 12 and 0 <= s.num_accepted <= s.num_verified <= s.num_drafted == 3 * s.num_rounds
        per_position = s.acceptance_per_position
        assert all(a >= b for a, b in itertools.pairwise(per_position))  # position i needs i - 1 accepted
    assert 0 < out.acceptance_rate < 1
    # greedy targets are one-hot, which typical acceptance accepts exactly when the draft is the argmax
    greedy = decoder.generate(prompts, max_new_tokens=12, sampling_params=SamplingParams(temperature=0))
    with torch.no_grad():
        ref = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=12, do_sample=False)
    assert torch.equal(greedy.token_ids, ref[:, 3:])


def test_sampler_instance_and_seed_argument(pair):
    target, draft = pair
    sampler = get_sampler("rejection_sampler")
    decoder = SpeculativeDecoder(
        HFLanguageModel(target), HFLanguageModel(draft), sampler=sampler, num_speculative_tokens=2
    )
    a = decoder.generate(torch.tensor([[1, 2], [1, 2]]), max_new_tokens=6, seed=3)
    b = decoder.generate(torch.tensor([[1, 2], [1, 2]]), max_new_tokens=6, seed=3)
    assert torch.equal(a.token_ids, b.token_ids)
    assert sampler.num_draft_tokens > 0  # the instance did the verification
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeDecoder(HFLanguageModel(target), HFLanguageModel(draft), num_speculative_tokens=0)
    with pytest.raises(ValueError, match="prompt_ids"):
        decoder.generate(torch.tensor([[1, V]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="sampling_params"):
        decoder.generate(torch.tensor([[1, 2]]), max_new_tokens=2, sampling_params=[SamplingParams()] * 2)


def test_draft_with_a_smaller_vocabulary(pair):
    target, _ = pair
    draft = tiny_llama(2, vocab_size=V - 3, layers=1)  # the target can emit ids the draft lacks
    decoder = SpeculativeDecoder(HFLanguageModel(target), HFLanguageModel(draft), num_speculative_tokens=2)
    out = decoder.generate(
        torch.tensor([[1, 2, 3]] * 8), max_new_tokens=10, sampling_params=SamplingParams(seed=1), seed=1
    )
    assert bool((out.token_ids >= 0).all()) and bool((out.token_ids < V).all())
    greedy = decoder.generate(
        torch.tensor([[1, 2, 3]]), max_new_tokens=10, sampling_params=SamplingParams(temperature=0)
    )
    with torch.no_grad():
        ref = target.generate(
            torch.tensor([[1, 2, 3]]),
            attention_mask=torch.ones(1, 3, dtype=torch.long),
            max_new_tokens=10,
            do_sample=False,
        )
    assert torch.equal(greedy.token_ids, ref[:, 3:])


def test_autoregressive_inferencer_prefill_and_decode(pair):
    target, _ = pair
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    free = generate_autoregressive(HFLanguageModel(target), prompts, 8, SamplingParams(temperature=0))
    row0 = free.token_ids[0].tolist()
    eos = row0[3] if row0[3] not in row0[:3] else row0[0]
    model = HFLanguageModel(target, eos_token_id=eos)
    inferencer = AutoregressiveInferencer(model)
    assert isinstance(inferencer, Inferencer)
    cache = model.new_kv_cache()
    strategy = SampleStrategy(SamplingParams(temperature=0), batch_size=2)
    first = inferencer.prefill(prompts, cache, strategy)
    assert first.token_ids.shape == (2, 1) and first.token_logits.shape == (2, 3, V)
    rest = inferencer.decode(first.token_ids, cache, 7, strategy)
    n = rest.token_ids.shape[1]
    assert rest.token_logits.shape == (2, n, V)
    got = torch.cat([first.token_ids, rest.token_ids], dim=1)
    for b in range(2):
        ref = free.token_ids[b].tolist()
        stop = ref.index(eos) + 1 if eos in ref else 8
        assert got[b, :stop].tolist() == ref[:stop] and bool((got[b, stop:] == -1).all())
    assert n == 7 or all(eos in free.token_ids[b].tolist() for b in range(2))  # stops once every row has an EOS
    with pytest.raises(ValueError, match="query_token_ids"):
        inferencer.decode(prompts, cache, 2, strategy)


class _ForwardOnly:
    """An HFLanguageModel seen through the seed's interface alone (no ``forward_last``)."""

    def __init__(self, model: HFLanguageModel) -> None:
        self.inner = model
        self.eos_token_ids, self.vocab_size, self.device = model.eos_token_ids, model.vocab_size, model.device

    @property
    def eos_token_id(self) -> int:
        return self.inner.eos_token_id

    def new_kv_cache(self):
        return self.inner.new_kv_cache()

    def forward(self, query_token_ids, kv_cache):
        return self.inner.forward(query_token_ids, kv_cache)


def test_forward_last_runs_the_head_on_the_last_position_only(pair, monkeypatch):
    """Prefills and draft steps read only the last position's logits: HFLanguageModel.forward_last
    takes the head product of that position alone (the wrapper's for a listed model, else
    transformers' with logits_to_keep=1), fills the cache as forward does, and the loop's tokens
    equal those of models that have only forward."""
    from spec_samplers.integrations import transformers as hf

    target, draft = pair
    query = torch.tensor([[-1, 3, 4], [5, 6, 7]])  # a left-padded row
    unlisted = type("OtherLlamaForCausalLM", (type(target),), {})(target.config)
    unlisted.load_state_dict(target.state_dict())
    listed, other = HFLanguageModel(target), HFLanguageModel(unlisted)  # (before the recording forward)
    assert listed._head is not None and other._head is None and other._keeps_logits
    heads, kept = [], []
    original_head, original_forward = hf.head_logits, unlisted.forward
    monkeypatch.setattr(
        hf, "head_logits", lambda hidden, weight: heads.append(hidden.shape) or original_head(hidden, weight)
    )
    monkeypatch.setattr(
        unlisted, "forward", lambda *a, **kw: kept.append(kw.get("logits_to_keep")) or original_forward(*a, **kw)
    )
    for wrapped, seen, expected in (
        (listed, heads, [(2, 1, target.config.hidden_size)]),
        (other, kept, [1]),
    ):
        full_cache, last_cache = wrapped.new_kv_cache(), wrapped.new_kv_cache()
        full = wrapped.forward(query, full_cache)[:, -1]
        seen.clear()
        last = wrapped.forward_last(query, last_cache)
        assert seen == expected and last.shape == (2, V)
        torch.testing.assert_close(last, full, rtol=1e-5, atol=1e-6)  # the head over 1 row rounds as over 3
        assert last_cache.get_num_tokens_per_request() == full_cache.get_num_tokens_per_request() == [2, 3]
    model = HFLanguageModel(target)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    params = SamplingParams(temperature=0.9, seed=5)
    with_last = SpeculativeDecoder(model, HFLanguageModel(draft), num_speculative_tokens=3)
    seed_only = SpeculativeDecoder(_ForwardOnly(model), _ForwardOnly(HFLanguageModel(draft)), num_speculative_tokens=3)
    a = with_last.generate(prompts, 12, params)
    b = seed_only.generate(prompts, 12, params)
    assert a.token_ids.tolist() == b.token_ids.tolist()
