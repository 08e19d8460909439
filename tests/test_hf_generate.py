"""``model.generate(custom_generate=speculative_generate)`` on tiny models built from configs.

Runs on every transformers the package supports (CI: vLLM's environment and the oldest,
``tools/ci_transformers_oldest.sh``). transformers 5.x passes the callable's own parameters
(``sampler=``, ``seeds=`` ...) through ``generate``; 4.56 needs them bound with ``with_options``,
which :func:`spec_kwargs` does.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers
from stats_helpers import CHI2_ALPHA, chi2_pvalue  # noqa: E402
from tiny_models import noisy_copy, tiny_llama  # noqa: E402

from spec_samplers.integrations import hf_generate  # noqa: E402
from spec_samplers.integrations.transformers import HFLanguageModel, speculative_generate  # noqa: E402

#: transformers >= 5 hands a custom_generate callable the parameters it declares
PASSES_DECLARED = hasattr(transformers.GenerationMixin, "_extract_generation_mode_kwargs")


def spec_kwargs(**options):
    """generate() arguments for speculative_generate with its own ``options``."""
    if PASSES_DECLARED:
        return {"custom_generate": speculative_generate, **options}
    return {"custom_generate": speculative_generate.with_options(**options)}


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0, vocab_size=40, hidden=32)
    return target, noisy_copy(target, 0.1, seed=1)


def left_padded(lengths, vocab=40, seed=0):
    """A left-padded batch (pad id 0) of random prompts with these lengths."""
    gen = torch.Generator().manual_seed(seed)
    P = max(lengths)
    ids = torch.randint(2, vocab, (len(lengths), P), generator=gen)
    mask = torch.ones_like(ids)
    for b, n in enumerate(lengths):
        ids[b, : P - n] = 0
        mask[b, : P - n] = 0
    return ids, mask


class NullStreamer(transformers.generation.streamers.BaseStreamer):
    def put(self, value):
        pass

    def end(self):
        pass


class StopAfter(transformers.StoppingCriteria):
    """Ends a row at its first ``token`` (a criterion the decoding loop checks per token)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


@pytest.mark.parametrize("drafting", ["chain", "tree", "prompt_lookup"])
def test_greedy_equals_generate_row_for_row(pair, drafting):
    """A left-padded batch of 4 with unequal lengths; rows end at different times (an EOS, a
    stopping criterion, max_new_tokens); sequences and scores equal transformers' greedy."""
    target, draft = pair
    ids, mask = left_padded([7, 3, 5, 1])
    common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    free = target.generate(**common)
    eos, stop = int(free[0, 7 + 3]), int(free[2, 7 + 5])  # row 0 ends at its 4th token, row 2 at its 6th
    common.update(eos_token_id=eos, return_dict_in_generate=True, output_scores=True)
    criteria = transformers.StoppingCriteriaList([StopAfter(stop)])
    ref = target.generate(**common, stopping_criteria=criteria)
    options = {
        "chain": dict(assistant_model=draft, num_assistant_tokens=3),
        "tree": dict(assistant_model=draft, tree=[2, 2, 1]),
        "prompt_lookup": dict(prompt_lookup_num_tokens=3),
    }[drafting]
    generate_args = {k: v for k, v in options.items() if k != "tree"}
    own = {"tree": options["tree"]} if "tree" in options else {}
    out = target.generate(**common, stopping_criteria=criteria, **generate_args, **spec_kwargs(**own))
    generated = ref.sequences[:, 7:]
    ends = (generated == eos) | (generated == stop)
    lengths = torch.where(ends.any(dim=1), ends.to(torch.int64).argmax(dim=1) + 1, generated.shape[1])
    assert len(set(lengths.tolist())) > 2, "the rows must end at different times"
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.scores) == len(ref.scores)
    for t, (mine, theirs) in enumerate(zip(out.scores, ref.scores)):
        live = t < lengths  # transformers scores finished rows too; they read as the pad token here
        torch.testing.assert_close(mine[live], theirs[live], rtol=1e-4, atol=1e-4)


def test_streamer_and_plain_output(pair):
    """Batch 1: the streamer gets the prompt (from generate), then every token once, then end()."""
    target, draft = pair

    class Collect(transformers.generation.streamers.BaseStreamer):
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    ids, mask = left_padded([6])
    streamer = Collect()
    out = target.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=True, streamer=streamer,
        assistant_model=draft, num_assistant_tokens=3, **spec_kwargs(seeds=[5]),
    )  # fmt: skip
    assert isinstance(out, torch.Tensor) and out.shape == (1, 16)
    assert streamer.chunks[0] == ids[0].tolist() and streamer.ended
    assert sum(streamer.chunks[1:], []) == out[0, 6:].tolist()


def test_per_sequence_seeds_do_not_depend_on_the_batch(pair):
    target, draft = pair
    ids, mask = left_padded([5, 2, 5], seed=3)
    common = dict(max_new_tokens=10, do_sample=True, temperature=1.0, top_k=0, assistant_model=draft)
    common["num_assistant_tokens"] = 3
    batch = target.generate(input_ids=ids, attention_mask=mask, **common, **spec_kwargs(seeds=[11, 12, 13]))
    alone = target.generate(input_ids=ids[2:], attention_mask=mask[2:], **common, **spec_kwargs(seeds=[13]))
    assert torch.equal(batch[2], alone[0])
    again = target.generate(input_ids=ids, attention_mask=mask, **common, **spec_kwargs(seeds=[11, 12, 14]))
    assert torch.equal(batch[:2], again[:2]) and not torch.equal(batch[2], again[2])


def test_draft_policy_read_from_the_generation_config(pair, monkeypatch):
    """assistant_confidence_threshold and num_assistant_tokens_schedule reach the decoding loop
    (transformers' defaults, 0.4 and "constant", when unset; not for trees); threshold 0 gives the
    fixed-k loop's tokens exactly."""
    target, draft = pair
    real = hf_generate.SpeculativeDecoder
    seen = []

    class Spy(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append((self.confidence_threshold, self.draft_schedule))

    class FixedK(real):
        def __init__(self, *args, confidence_threshold=0.0, draft_schedule="constant", **kwargs):
            super().__init__(*args, **kwargs)

    ids, mask = left_padded([5, 3], seed=2)
    common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=True, temperature=1.0, top_k=0)
    common.update(assistant_model=draft, num_assistant_tokens=3)
    stats: list = []
    monkeypatch.setattr(hf_generate, "SpeculativeDecoder", Spy)
    target.generate(**common, **spec_kwargs(seeds=[1, 2], stats=stats))
    policy = dict(assistant_confidence_threshold=0.9, num_assistant_tokens_schedule="heuristic")
    target.generate(**common, **policy, **spec_kwargs(seeds=[1, 2]))
    off = target.generate(**common, assistant_confidence_threshold=0.0, **spec_kwargs(seeds=[1, 2]))
    target.generate(**common, **policy, **spec_kwargs(seeds=[1, 2], tree=[2, 1]))
    assert seen == [(0.4, "constant"), (0.9, "heuristic"), (0.0, "constant"), (0.0, "constant")]
    assert any(s.num_drafted < 3 * s.num_rounds for s in stats[0].stats)  # the default threshold stopped drafts
    monkeypatch.setattr(hf_generate, "SpeculativeDecoder", FixedK)
    assert torch.equal(off, target.generate(**common, **spec_kwargs(seeds=[1, 2])))


def test_prompt_lookup_drafts_without_a_draft_model(pair):
    """n-gram drafting on a repetitive prompt: drafts are proposed, some accepted; no draft model."""
    target, _ = pair
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    stats: list = []
    out = target.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
        prompt_lookup_num_tokens=4, **spec_kwargs(stats=stats),
    )  # fmt: skip
    ref = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    assert torch.equal(out, ref)
    (result,) = stats
    assert result.stats[0].num_drafted > 0 and result.stats[0].draft_forward_passes > 0


def test_bad_sampler_and_processor_fail_before_any_model_call(pair):
    target, draft = pair
    calls = []
    original = target.forward

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    ids, mask = left_padded([4, 2])
    common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=True, assistant_model=draft)
    target.forward = counting
    try:
        with pytest.raises(Exception, match="no_such_sampler"):
            target.generate(**common, **spec_kwargs(sampler="no_such_sampler"))
        with pytest.raises(Exception, match="bogus"):
            target.generate(**common, **spec_kwargs(sampler="rejection_sampler", sampler_options={"bogus": 1}))
        with pytest.raises(ValueError, match="RepetitionPenaltyLogitsProcessor"):
            target.generate(**common, repetition_penalty=1.3, **spec_kwargs())
        with pytest.raises(ValueError, match="MinPLogitsWarper with TopPLogitsWarper"):
            target.generate(**common, top_p=0.9, min_p=0.1, **spec_kwargs())
        with pytest.raises(ValueError, match="seeds"):
            target.generate(**common, **spec_kwargs(seeds=[1]))
        with pytest.raises(ValueError, match="streamer"):
            target.generate(**common, streamer=NullStreamer(), **spec_kwargs())
    finally:
        del target.forward
    assert calls == []


def test_with_options_names_unknown_options():
    with pytest.raises(ValueError, match="samplr"):
        speculative_generate.with_options(samplr="rejection_sampler")


def test_cache_passed_under_the_models_own_name(pair):
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns until 5.40):
    the model (or its decoder, when the wrapper takes the head product itself) gets its cache
    under the name its forward declares, never the deprecated one."""
    target, _ = pair
    seen = []
    wrapped = HFLanguageModel(target, eos_token_id=None)  # reads the real forwards' signatures
    modules = (target, target.model)
    originals = [module.forward for module in modules]

    def recording(original):
        def forward(*args, **kwargs):
            declared = inspect.signature(original).parameters
            seen.append(({name for name in ("cache", "past_key_values") if name in kwargs}, declared))
            return original(*args, **kwargs)

        return forward

    for module, original in zip(modules, originals):
        module.forward = recording(original)
    try:
        wrapped.forward(torch.tensor([[3, 4, 5]]), wrapped.new_kv_cache())
    finally:
        for module in modules:
            del module.forward
    assert len(seen) == 1  # the decoder alone (the listed Llama) or the model
    names, declared = seen[0]
    assert names == {"cache" if "cache" in declared else "past_key_values"}


def test_head_product_is_the_models_own(pair):
    """A listed causal LM's head product is taken by the wrapper (``head_logits``: ``weight @
    rows.T`` or the compiled kernel for the CPU shapes of HEAD_STREAM_ROWS and HEAD_KERNEL_ROWS, else F.linear): the
    model's own logits to fp32 rounding, for every row count; a subclass or a head with a bias runs
    the model's forward."""
    from spec_samplers.integrations.transformers import _plain_head, head_logits

    target, _ = pair
    weight = torch.randn(300, 16)
    for B, Q in ((1, 1), (1, 2), (2, 3), (4, 2), (1, 9), (3, 4)):
        hidden = torch.randn(B, Q, 16)
        torch.testing.assert_close(head_logits(hidden, weight), torch.nn.functional.linear(hidden, weight))
    # strided (the last position of a query), expanded and bf16 hidden states
    wide = torch.randn(3, 4, 16)
    for hidden in (wide[:, -1:], wide[:1, :1].expand(2, 1, 16), wide[:, ::2], wide.to(torch.bfloat16)):
        expected = torch.nn.functional.linear(hidden, weight.to(hidden.dtype))
        torch.testing.assert_close(head_logits(hidden, weight.to(hidden.dtype)), expected)
    wrapped = HFLanguageModel(target, eos_token_id=None)
    assert wrapped._head is not None
    ids = torch.randint(2, 40, (2, 3))
    torch.testing.assert_close(wrapped.forward(ids, wrapped.new_kv_cache()), target(ids).logits)
    subclass = type("ScaledLlamaForCausalLM", (type(target),), {})
    assert _plain_head(subclass(target.config)) is None
    biased = type(target)(target.config)
    biased.lm_head = torch.nn.Linear(32, 40, bias=True)
    assert _plain_head(biased) is None


def _exact_two_token_law(model, prompt, warpers):
    """P(x1, x2 | prompt) [V, V] under transformers' own warpers (the law generate samples)."""
    with torch.no_grad():
        first = model(prompt).logits[:, -1]
        p1 = torch.softmax(warpers(prompt, first), dim=-1)[0]  # [V]
        V = p1.shape[0]
        seconds = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], dim=1)
        second = model(seconds).logits[:, -1]
        p2 = torch.softmax(warpers(seconds, second), dim=-1)  # [V, V]
    return (p1[:, None] * p2).double()


def _two_token_samples(target, draft, prompt, n, sampler, temperature, top_k):
    out = target.generate(
        input_ids=prompt.expand(n, -1), attention_mask=torch.ones(n, prompt.shape[1], dtype=torch.long),
        max_new_tokens=2, do_sample=True, temperature=temperature, top_k=top_k, top_p=1.0,
        assistant_model=draft, num_assistant_tokens=2, **spec_kwargs(sampler=sampler, seeds=list(range(n))),
    )  # fmt: skip
    V = target.config.vocab_size
    return out[:, -2] * V + out[:, -1]


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["rejection_sampler", "block_verification"])
def test_first_two_tokens_follow_the_targets_law(sampler):
    """Chi-square of the joint law of the first two sampled tokens (both from one verification
    round, k = 2) against transformers' own warpers on the target: false-failure rate CHI2_ALPHA
    = 1e-3 per sampler at a random seed; fixed seeds here."""
    target = tiny_llama(4, vocab_size=12, hidden=32)
    draft = noisy_copy(target, 0.5, seed=5)
    prompt = torch.tensor([[3, 7, 2]])
    warpers = transformers.LogitsProcessorList(
        [transformers.TemperatureLogitsWarper(0.9), transformers.TopKLogitsWarper(8)]
    )
    law = _exact_two_token_law(target, prompt, warpers).reshape(-1)
    samples = _two_token_samples(target, draft, prompt, 6000, sampler, 0.9, 8)
    assert chi2_pvalue(samples, law) > CHI2_ALPHA


@pytest.mark.slow
def test_two_token_law_test_has_power(monkeypatch):
    """The same check fails on a planted fault: top-k dropped from the fused filters (target and
    draft sampled without it) while transformers' law keeps it."""
    target = tiny_llama(4, vocab_size=12, hidden=32)
    draft = noisy_copy(target, 0.5, seed=5)
    prompt = torch.tensor([[3, 7, 2]])
    warpers = transformers.LogitsProcessorList(
        [transformers.TemperatureLogitsWarper(0.9), transformers.TopKLogitsWarper(8)]
    )
    law = _exact_two_token_law(target, prompt, warpers).reshape(-1)
    real = hf_generate.sampling_fields

    def without_top_k(processors, do_sample):
        fields = real(processors, do_sample)
        fields.pop("top_k", None)
        return fields

    monkeypatch.setattr(hf_generate, "sampling_fields", without_top_k)
    samples = _two_token_samples(target, draft, prompt, 6000, "rejection_sampler", 0.9, 8)
    assert chi2_pvalue(samples, law) < CHI2_ALPHA


def test_compiled_head_rows_equal_the_linear_map() -> None:
    """spec_samplers.cpu.head_rows (numba: blocks of 8, 4, 2 and 1 rows) against F.linear in fp64:
    within the fp32 summation's rounding, on strided rows and a grad-requiring head; head_logits
    takes it for the shapes of HEAD_KERNEL_ROWS and F.linear beyond."""
    from spec_samplers import cpu
    from spec_samplers.integrations.transformers import head_logits

    g = torch.Generator().manual_seed(2)
    weight = (torch.randn(3001, 96, generator=g) * 0.1).requires_grad_()
    for r in (1, 2, 3, 4, 5, 7, 8, 11, 16):
        rows = torch.randn(96, r, generator=g).T  # (strided)
        got = cpu.head_rows(weight, rows)
        assert got is not None and got.shape == (r, 3001)
        want = torch.nn.functional.linear(rows.double(), weight.detach().double())
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
        hidden = rows.reshape(1, r, 96)
        torch.testing.assert_close(head_logits(hidden, weight.detach()), got.view(1, r, -1), rtol=0, atol=0)
    wide = torch.randn(1, 17, 96, generator=g)
    torch.testing.assert_close(head_logits(wide, weight.detach()), torch.nn.functional.linear(wide, weight.detach()))
