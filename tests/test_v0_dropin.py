"""vLLM V0 drop-in: code written against V0's sampler classes works by changing only the import.

Covers V0's constructor options (``use_flashinfer``), strict mode as V0 defines it (shapes,
dtypes, devices, token-id bounds; unnormalised targets pass, as V0's own tests feed them), the
helpers a V0 subclass calls (``_create_output``, ``_raise_if_incorrect_input``,
``init_gpu_tensors``/``init_tensors``, typical acceptance's ``_evaluate_accepted_tokens`` and
``_get_recovered_token_ids``), and a third-party V0-style sampler built on them.
"""

from __future__ import annotations

import pytest
import torch

from spec_samplers import (
    RejectionSampler,
    SpecDecodeDeterministicBaseSampler,
    SpecDecodeStochasticBaseSampler,
    TypicalAcceptanceSampler,
)

B, K, V = 5, 3, 50


def rand_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    target = torch.rand(B, K + 1, V, generator=g)  # V0's tests: unnormalised
    draft = torch.rand(B, K, V, generator=g)
    ids = torch.randint(0, V, (B, K), generator=g)
    bonus = torch.randint(0, V, (B, 1), generator=g)
    return target, bonus, draft, ids


class GreedyMatchSampler(SpecDecodeDeterministicBaseSampler):
    """A third-party sampler written against V0's base class: overrides forward only and uses
    V0's helpers (strict check, output format, counters)."""

    def forward(self, target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids):
        if self._strict_mode:
            self._raise_if_incorrect_input(target_with_bonus_probs, draft_token_ids, bonus_token_ids, draft_probs)
        target_probs = target_with_bonus_probs[:, :-1]
        argmax = target_probs.argmax(dim=-1)
        accepted = draft_token_ids == argmax
        return self._create_output(accepted, argmax, draft_token_ids, bonus_token_ids)


class RandomAcceptSampler(SpecDecodeStochasticBaseSampler):
    """A stochastic V0-style sampler (signature with seeded_seqs)."""

    def forward(self, target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, seeded_seqs=None):
        accepted = torch.ones_like(draft_token_ids, dtype=torch.bool)
        return self._create_output(accepted, draft_token_ids, draft_token_ids, bonus_token_ids)


def v0_expected_output(accepted, substitute, drafts, bonus):
    """V0's documented output: the accepted prefix of the drafts, the substitute at the first
    rejection, the bonus token after k acceptances (only where the last draft slot is not -1)."""
    rows = []
    for a, s, d, b in zip(accepted.tolist(), substitute.tolist(), drafts.tolist(), bonus.view(-1).tolist()):
        n = next((i for i, x in enumerate(a) if not x), len(a))
        row = d[:n] + [s[n] if n < len(a) else (b if d[-1] != -1 else -1)]
        rows.append(row + [-1] * (len(a) + 1 - len(row)))
    return torch.tensor(rows)


def test_third_party_v0_sampler_runs_unchanged():
    target, bonus, draft, ids = rand_inputs()
    ids[0] = target[0, :K].argmax(-1)  # row 0: every draft matches
    ids[1, 1] = target[1, 1].argmax(-1)
    ids[1, 0] = target[1, 0].argmax(-1)
    sampler = GreedyMatchSampler(strict_mode=True)
    sampler.init_tensors("cpu")  # V0 engines call init_gpu_tensors(rank) once
    out = sampler(target, bonus, None, ids)
    argmax = target[:, :K].argmax(-1)
    assert torch.equal(out, v0_expected_output(ids == argmax, argmax, ids, bonus))
    assert out[0].tolist() == ids[0].tolist() + [int(bonus[0])]
    assert int(sampler.num_emitted_tokens) == int((out != -1).sum())
    assert int(sampler.num_accepted_tokens) == int((out[:, 1:] != -1).sum())
    assert sampler.num_draft_tokens == B * K
    bad = ids.clone()
    bad[2, 1] = V
    with pytest.raises(AssertionError, match=r"draft_token_ids: expected token ids in \[0, 50\)"):
        sampler(target, bonus, None, bad)
    with pytest.raises(AssertionError, match="bonus_token_ids: expected a 2-d tensor"):
        sampler(target, bonus[:, 0], None, ids)
    # only forward() is implemented: the other entries say what is missing
    with pytest.raises(NotImplementedError, match="implements only vLLM V0's padded forward"):
        sampler.forward_ragged(target[:, 0], bonus[:, 0], None, ids[:, 0], torch.arange(1, B + 1), 1)


def test_stochastic_v0_sampler_and_counters_on_cpu_from_construction():
    sampler = RandomAcceptSampler()
    assert sampler.num_accepted_tokens.device.type == "cpu" and int(sampler.num_accepted_tokens) == 0
    target, bonus, draft, ids = rand_inputs(1)
    out = sampler(target, bonus, draft, ids, seeded_seqs={0: torch.Generator()})
    assert torch.equal(out, torch.cat([ids, bonus], 1))
    assert int(sampler.num_accepted_tokens) == B * K and int(sampler.num_emitted_tokens) == B * (K + 1)


def test_create_output_matches_v0_on_non_prefix_acceptance_and_missing_last_draft():
    g = torch.Generator().manual_seed(3)
    accepted = torch.rand(64, 4, generator=g) < 0.7
    substitute = torch.randint(0, V, (64, 4), generator=g)
    drafts = torch.randint(0, V, (64, 4), generator=g)
    drafts[::7, -1] = -1  # V0 leaves the bonus slot -1 where the last draft slot is -1
    accepted[::7] = True
    bonus = torch.randint(0, V, (64, 1), generator=g)
    out = GreedyMatchSampler()._create_output(accepted, substitute, drafts, bonus)
    assert out.dtype == torch.int64
    assert torch.equal(out, v0_expected_output(accepted, substitute, drafts, bonus))


@pytest.mark.parametrize("cls", [RejectionSampler, TypicalAcceptanceSampler])
def test_v0_strict_mode_accepts_unnormalised_targets_and_rejects_bad_ids(cls):
    target, bonus, draft, ids = rand_inputs(2)
    make = (
        (lambda **kw: cls(strict_mode=True, use_flashinfer=True, **kw))
        if cls is RejectionSampler
        else (lambda **kw: cls(0.03, 0.9, strict_mode=True, **kw))
    )
    sampler = make()
    sampler.init_tensors("cpu")
    out = sampler(target, bonus, draft, ids)  # V0's tests feed torch.rand targets in strict mode
    assert out.shape == (B, K + 1)
    for name, t in (("draft_token_ids", ids), ("bonus_token_ids", bonus)):
        for rogue in (-1, V + 1):
            bad = t.clone()
            bad[0, 0] = rogue
            args = (target, bad, draft, ids) if name == "bonus_token_ids" else (target, bonus, draft, bad)
            with pytest.raises(AssertionError, match=name):
                sampler(*args)
    with pytest.raises(AssertionError, match="target_with_bonus_probs: expected rows summing to 1"):
        make(check_values=True)(target, bonus, draft, ids)


def test_use_flashinfer_is_recorded_and_checked():
    assert RejectionSampler(use_flashinfer=True).use_flashinfer is True
    assert RejectionSampler().use_flashinfer is False
    assert "use_flashinfer=True" in repr(RejectionSampler(use_flashinfer=True))
    with pytest.raises(TypeError, match="use_flashinfer"):
        RejectionSampler(use_flashinfer="yes")


def test_repr_shows_options():
    assert repr(TypicalAcceptanceSampler(0.05, 0.2, strict_mode=True)) == (
        "TypicalAcceptanceSampler(strict_mode=True, check_values=False, backend='auto', "
        "posterior_threshold=0.05, posterior_alpha=0.2)"
    )


def test_init_tensors_keeps_counts_and_init_gpu_tensors_signature():
    s = RejectionSampler()
    target, bonus, draft, ids = rand_inputs(4)
    s(target.softmax(-1), bonus, draft.softmax(-1), ids)
    before = int(s.num_emitted_tokens)
    s.init_tensors("cpu")
    s.init_tensors(0, device_type="cpu")
    assert int(s.num_emitted_tokens) == before > 0
    assert callable(s.init_gpu_tensors)


def test_typical_v0_helpers():
    s = TypicalAcceptanceSampler(0.03, 0.9, strict_mode=True)
    g = torch.Generator().manual_seed(5)
    # V0's test_uniform_target_distribution_accepts_all_tokens: high entropy, every draft accepted
    uniform = torch.rand(B, K, 30000, generator=g)
    ids = torch.randint(0, 30000, (B, K), generator=g)
    assert bool(s._evaluate_accepted_tokens(uniform, ids).all())
    # V0's test_temperature_zero_target_distribution: one-hot rows accept only their token
    hot = torch.randint(0, V, (B, K), generator=g)
    one_hot = torch.nn.functional.one_hot(hot, V).float()
    assert torch.equal(s._evaluate_accepted_tokens(one_hot, hot), torch.ones(B, K, dtype=torch.bool))
    assert not bool(s._evaluate_accepted_tokens(one_hot, (hot + 1) % V).any())
    # V0's test_get_recovered_token_ids: the argmax at every position
    probs = torch.rand(B, K, V, generator=g)
    assert torch.equal(s._get_recovered_token_ids(probs), probs.argmax(-1))
    # the helpers agree with the sampler's own decisions
    target = torch.softmax(torch.randn(B, K + 1, V, generator=g) * 3, -1)
    ids = torch.randint(0, V, (B, K), generator=g)
    accepted = s._evaluate_accepted_tokens(target[:, :K], ids)
    recovered = s._get_recovered_token_ids(target[:, :K])
    bonus = torch.randint(0, V, (B, 1), generator=g)
    assert torch.equal(s(target, bonus, None, ids), v0_expected_output(accepted, recovered, ids, bonus))
