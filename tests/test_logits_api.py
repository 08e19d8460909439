"""Sampler methods taking logits plus a per-request temperature (T == 0: greedy request)."""

import pytest
import torch
from stats_helpers import CHI2_ALPHA, chi2_pvalue

from spec_samplers import RejectionSampler, SpecSamplerInputError, TypicalAcceptanceSampler

B, K, V = 6, 3, 300


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(B, K + 1, V, generator=g) * 2
    draft = target[:, :K] + torch.randn(B, K, V, generator=g)
    temperature = torch.tensor([0.7, 0.0, 1.0, 1.3, 0.0, 0.5])
    probs = torch.softmax(draft / temperature.clamp(min=1e-3)[:, None, None], -1)
    ids = torch.multinomial(probs.reshape(-1, V), 1, generator=g).view(B, K)
    bonus = torch.randint(0, V, (B, 1), generator=g)
    return target, bonus, draft, ids, temperature


def probs_of(logits, temperature):
    """The distribution the sampler must verify against (temperature 0: one-hot argmax)."""
    t = torch.where(temperature > 0, temperature, 1.0).view(-1, *([1] * (logits.dim() - 1)))
    probs = torch.softmax(logits / t, -1)
    onehot = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.where((temperature == 0).view_as(t), onehot, probs)


@pytest.mark.parametrize("with_draft", [True, False])
def test_rejection_logits_equal_probs_path(with_draft):
    target, bonus, draft, ids, temperature = inputs(0)
    seeds = torch.arange(B) + 5
    out = RejectionSampler().forward_from_logits(
        target, bonus, draft if with_draft else None, ids, temperature, seeds=seeds
    )
    expected = RejectionSampler()(
        probs_of(target, temperature),
        bonus,
        probs_of(draft, temperature) if with_draft else None,
        ids,
        seeds=seeds,
        is_greedy=temperature == 0,
    )
    assert torch.equal(out, expected)


def test_typical_logits_equal_probs_path():
    target, bonus, _, ids, temperature = inputs(1)
    out = TypicalAcceptanceSampler().forward_from_logits(target, bonus, None, ids, temperature)
    assert torch.equal(out, TypicalAcceptanceSampler()(probs_of(target, temperature), bonus, None, ids))


@pytest.mark.parametrize("cls", [RejectionSampler, TypicalAcceptanceSampler])
def test_kernel_backend_matches_torch_backend(cls):
    target, bonus, draft, ids, temperature = inputs(2)
    seeds = torch.arange(B) * 3
    kw = {"seeds": seeds} if cls is RejectionSampler else {}
    a = cls(backend="torch").forward_from_logits(target, bonus, draft, ids, temperature, **kw)
    b = cls(backend="triton").forward_from_logits(target, bonus, draft, ids, temperature, **kw)
    assert torch.equal(a, b)
    # ragged: requests with 3, 0, 2, 3, 1, 3 drafts
    counts = torch.tensor([3, 0, 2, 3, 1, 3])
    keep = torch.arange(K)[None, :] < counts[:, None]
    cu = counts.cumsum(0)
    args = (target[:, :K][keep], bonus[:, 0], draft[keep], ids[keep], cu, K, temperature)
    a = cls(backend="torch").forward_ragged_from_logits(*args, **kw)
    b = cls(backend="triton").forward_ragged_from_logits(*args, **kw)
    assert torch.equal(a, b)
    assert bool((a[1, 1:] == -1).all())  # k_b = 0: one token (the bonus) only


def test_logits_path_is_lossless():
    """Slot 0 follows softmax(z / T): chi-square, false-failure rate CHI2_ALPHA at a random seed."""
    n, v = 20000, 20
    g = torch.Generator().manual_seed(3)
    z = torch.randn(v, generator=g) * 2
    zd = z + torch.randn(v, generator=g)
    t = 0.7
    q = torch.softmax(z / t, -1)
    ids = torch.multinomial(torch.softmax(zd / t, -1), n, replacement=True, generator=g)[:, None]
    out = RejectionSampler().forward_from_logits(
        z.expand(n, 2, v),
        torch.zeros(n, 1, dtype=torch.long),
        zd.expand(n, 1, v),
        ids,
        torch.full((n,), t),
        seeds=torch.arange(n),
    )
    assert chi2_pvalue(out[:, 0], q) > CHI2_ALPHA


@pytest.mark.parametrize("cls", [RejectionSampler, TypicalAcceptanceSampler])
def test_bad_logits_inputs(cls):
    target, bonus, draft, ids, temperature = inputs(4)
    with pytest.raises(SpecSamplerInputError, match=r"temperature: expected shape \(6,\), got shape \(5,\)"):
        cls().forward_from_logits(target, bonus, draft, ids, temperature[:5])
    with pytest.raises(SpecSamplerInputError, match="temperature: expected dtype"):
        cls().forward_from_logits(target, bonus, draft, ids, torch.zeros(B, dtype=torch.int64))
    with pytest.raises(SpecSamplerInputError, match="draft_logits: expected shape"):
        cls().forward_from_logits(target, bonus, draft[..., :-1], ids, temperature)
    with pytest.raises(SpecSamplerInputError, match="target_logits: expected a 3-d tensor"):
        cls().forward_from_logits(target[0], bonus, draft, ids, temperature)
    bad_t = temperature.clone()
    bad_t[2] = -1.0
    with pytest.raises(
        SpecSamplerInputError, match=r"temperature: expected finite values >= 0 \(0 = greedy\), got -1.0"
    ):
        cls(strict_mode=True).forward_from_logits(target, bonus, draft, ids, bad_t)
    nan_target = target.clone()
    nan_target[0, 0, 0] = float("nan")
    with pytest.raises(SpecSamplerInputError, match="target_logits: expected logits without NaN or \\+Inf"):
        cls(check_values=True).forward_from_logits(nan_target, bonus, draft, ids, temperature)
    # without strict mode: NaN counts as -inf, a bad T as 1; the output stays valid
    out = cls().forward_from_logits(nan_target, bonus, draft, ids, bad_t)
    emitted = out[out != -1]
    assert bool(((emitted >= 0) & (emitted < V)).all())
