"""Issue 9's adversarial findings, one test (or a few) each; every one failed on d952d38.

Behaviours chosen (docs/contract.md, "Robustness"):

1. every tensor argument may be strided or expanded (stride 0): [B] metadata is copied to
   contiguous memory once (VerifyBatch / RowLayout), larger tensors are read through strides;
2. a ragged request whose span is inconsistent (past T, negative count, k_b > max_spec_len)
   emits no token (all -1) on both backends; strict mode raises naming cu_num_draft_tokens;
3. logits follow one rule on both backends (torch_ops.probs_from_logits): q = exp((x - max) / T)
   / sum, +inf logits share the mass, T = +inf is uniform over the finite entries, a row
   without a finite or +inf logit has no distribution and emits -1; check_values raises;
4. subnormal-only rows: fixed by the RNG change (branch rng, scaled race keys); tested here;
5. typical acceptance decides in float64 on both backends, so near-ties agree;
6. meta tensors and absurd max_spec_len get errors naming the argument, before any data is read.
"""

from __future__ import annotations

import pytest
import torch

import spec_samplers.kernels.verify_launch  # noqa: F401  (kernels built under TRITON_INTERPRET=1)
from spec_samplers import RejectionSampler, SpecSamplerInputError, TypicalAcceptanceSampler
from spec_samplers.torch_ops import probs_from_logits

BACKENDS = ["torch", "triton"]
INF = float("inf")


def both(make, call):
    """call(sampler) on both backends; asserts they agree and returns the tokens."""
    outs = [call(make(backend=b)) for b in BACKENDS]
    assert torch.equal(outs[0], outs[1]), f"torch\n{outs[0]}\ntriton\n{outs[1]}"
    return outs[0]


def probs_case(B=3, K=2, V=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(B, K + 1, V, generator=g) * 2, -1)
    p = torch.softmax(torch.randn(B, K, V, generator=g) * 2, -1)
    ids = torch.multinomial(p.reshape(-1, V), 1, generator=g).view(B, K)
    bonus = torch.randint(0, V, (B, 1), generator=g)
    return q, p, ids, bonus


def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values, every other element of a wider buffer (the issue's seeds example)."""
    return torch.stack([t, torch.full_like(t, 12345 if t.dtype != torch.bool else True)], -1)[..., 0]


# -- finding 1: strided and expanded [B] tensors ----------------------------------------------


@pytest.mark.parametrize("which", ["seeds", "offsets", "is_greedy", "all"])
def test_strided_seeds_offsets_greedy_match_contiguous_on_both_backends(which):
    q, p, ids, bonus = probs_case(B=4, K=2, V=16, seed=4)
    p = 0.5 * p + 0.5 * q[:, :2]  # close drafts: some accepted, so every uniform matters
    kw = dict(
        seeds=torch.tensor([1, 2, 3, 4]),
        offsets=torch.tensor([5, 0, 7, 1]),
        is_greedy=torch.tensor([False, True, False, False]),
    )
    expected = RejectionSampler(backend="torch")(q, bonus, p, ids, **kw)
    bent = {k: strided(v) if which in (k, "all") else v for k, v in kw.items()}
    got = both(RejectionSampler, lambda s: s(q, strided(bonus), p, ids, **bent))
    assert torch.equal(got, expected)


def test_expanded_seeds_and_temperature_are_not_read_past_their_storage():
    q, p, ids, bonus = probs_case(seed=1)
    logits = torch.log(q)
    seed = torch.tensor([77]).expand(3)  # stride 0: one element of storage
    temp = torch.tensor([0.7]).expand(3)
    expected = RejectionSampler(backend="torch").forward_from_logits(
        logits, bonus, torch.log(p), ids, torch.full((3,), 0.7), seeds=torch.full((3,), 77)
    )
    got = both(RejectionSampler, lambda s: s.forward_from_logits(logits, bonus, torch.log(p), ids, temp, seeds=seed))
    assert torch.equal(got, expected)


def test_strided_ragged_counts_and_bonus():
    q, p, ids, bonus = probs_case(B=3, K=2)
    flat_q, flat_p, flat_ids = q[:, :2].reshape(-1, 16), p.reshape(-1, 16), ids.reshape(-1)
    cu = torch.tensor([2, 4, 6])
    seeds = torch.tensor([4, 5, 6])
    expected = RejectionSampler(backend="torch").forward_ragged(
        flat_q, bonus[:, 0], flat_p, flat_ids, cu, 2, seeds=seeds
    )
    cu_strided = strided(cu)
    bonus_strided = strided(bonus[:, 0])
    for cls in (RejectionSampler,):
        got = both(
            cls,
            lambda s: s.forward_ragged(flat_q, bonus_strided, flat_p, flat_ids, cu_strided, 2, seeds=strided(seeds)),
        )
        assert torch.equal(got, expected)
    typ = both(
        TypicalAcceptanceSampler, lambda s: s.forward_ragged(flat_q, bonus_strided, None, flat_ids, cu_strided, 2)
    )
    assert torch.equal(
        typ, TypicalAcceptanceSampler(backend="torch").forward_ragged(flat_q, bonus[:, 0], None, flat_ids, cu, 2)
    )


def test_expanded_target_rows_and_vocab():
    q, p, ids, bonus = probs_case(B=2, K=1, V=8)
    row = q[:1, :1]  # [1, 1, V]
    target = row.expand(2, 2, 8)  # every (request, position) the same row: strides (0, 0, 1)
    expected = RejectionSampler(backend="torch")(target.contiguous(), bonus, p, ids, seeds=torch.tensor([1, 2]))
    assert torch.equal(both(RejectionSampler, lambda s: s(target, bonus, p, ids, seeds=torch.tensor([1, 2]))), expected)
    flat = torch.full((2, 1, 1), 0.5).expand(2, 2, 2)  # vocab stride 0
    out = both(TypicalAcceptanceSampler, lambda s: s(flat, torch.tensor([[0], [1]]), None, torch.tensor([[1], [0]])))
    assert torch.equal(out, torch.tensor([[1, 0], [0, 1]]))


# -- finding 2: inconsistent ragged metadata --------------------------------------------------


def test_issue_example_counts_past_T_emit_no_token():
    args = (
        torch.full((1, 5), 0.2),
        torch.tensor([0]),
        torch.tensor([[0.01, 0.01, 0.9, 0.04, 0.04]]),
        torch.tensor([0]),
        torch.tensor([2]),
        2,
    )
    out = both(RejectionSampler, lambda s: s.forward_ragged(*args, seeds=torch.tensor([0])))
    assert out.tolist() == [[-1, -1, -1]]
    with pytest.raises(SpecSamplerInputError, match="cu_num_draft_tokens: expected a last entry equal to T = 1, got 2"):
        RejectionSampler(strict_mode=True).forward_ragged(*args)


@pytest.mark.parametrize(
    "cu,K,malformed",
    [
        ([2, 1, 3], 2, [1]),  # non-monotone: request 1 has a negative count; request 2 reads row 1..2
        ([3, 3, 4], 2, [0]),  # k_0 = 3 > max_spec_len
        ([1, 2, 9], 3, [2]),  # past T = 4
        ([-1, 2, 4], 3, [0, 1]),  # a negative entry: request 0 ends and request 1 starts before row 0
        ([2**62, 2**62, 4], 3, [0, 1, 2]),  # huge entries: no overflow into a valid span
        ([1, 2, 3], 3, []),  # rows past the last count are ignored
    ],
)
@pytest.mark.parametrize("logits", [False, True])
def test_malformed_requests_emit_no_token_identically(cu, K, malformed, logits):
    T, V, B = 4, 12, 3
    g = torch.Generator().manual_seed(len(malformed) + K)
    target = torch.randn(T, V, generator=g)
    draft = torch.randn(T, V, generator=g)
    ids = torch.randint(0, V, (T,), generator=g)
    bonus = torch.randint(0, V, (B,), generator=g)
    cu_t = torch.tensor(cu)
    temperature = torch.tensor([1.0, 0.5, 0.0])
    for cls in (RejectionSampler, TypicalAcceptanceSampler):

        def call(s, cls=cls):
            kw = {"seeds": torch.tensor([3, 4, 5])} if cls is RejectionSampler else {}
            if logits:
                return s.forward_ragged_from_logits(target, bonus, draft, ids, cu_t, K, temperature, **kw)
            return s.forward_ragged(torch.softmax(target, -1), bonus, torch.softmax(draft, -1), ids, cu_t, K, **kw)

        out = both(cls, call)
        for b in range(B):
            if b in malformed:
                assert out[b].tolist() == [-1] * (K + 1)
            else:
                assert out[b, 0] != -1, (cls.__name__, b, out)
        with pytest.raises(SpecSamplerInputError, match="cu_num_draft_tokens"):
            call(cls(strict_mode=True))


def test_empty_batch_with_rows():
    out = both(
        RejectionSampler,
        lambda s: s.forward_ragged(
            torch.full((3, 4), 0.25),
            torch.zeros(0, dtype=torch.long),
            None,
            torch.zeros(3, dtype=torch.long),
            torch.zeros(0, dtype=torch.long),
            2,
        ),
    )
    assert out.shape == (0, 3)
    with pytest.raises(
        SpecSamplerInputError, match=r"cu_num_draft_tokens: expected a last entry equal to T = 3 \(B = 0 needs T = 0\)"
    ):
        RejectionSampler(strict_mode=True).forward_ragged(
            torch.full((3, 4), 0.25),
            torch.zeros(0, dtype=torch.long),
            None,
            torch.zeros(3, dtype=torch.long),
            torch.zeros(0, dtype=torch.long),
            2,
        )


# -- finding 3: logits edge cases ---------------------------------------------------------------


def test_probs_from_logits_limits():
    x = torch.tensor(
        [
            [0.0, INF, INF, 1.0],  # +inf entries share the mass
            [0.0, 1.0, 2.0, -INF],  # T = +inf: uniform over the finite entries
            [-INF, -INF, -INF, -INF],  # no distribution
            [0.0, 0.0, 0.0, 3e38],  # x / T overflows fp32: still one-hot at 3
            [1.0, 2.0, 2.0, 0.0],  # T tiny: the maxima share
            [float("nan"), 0.0, -INF, 0.0],  # NaN counts as -inf
        ]
    )
    t = torch.tensor([1.0, INF, 1.0, 0.5, 1e-38, 1.0])
    q = probs_from_logits(x, t)
    assert torch.equal(
        q,
        torch.tensor(
            [
                [0.0, 0.5, 0.5, 0.0],
                [1 / 3, 1 / 3, 1 / 3, 0.0],
                [0.0] * 4,
                [0.0, 0.0, 0.0, 1.0],
                [0.0, 0.5, 0.5, 0.0],
                [0.0, 0.5, 0.0, 0.5],
            ]
        ),
    )
    greedy = probs_from_logits(x[2:4], torch.zeros(2))
    assert torch.equal(greedy, torch.tensor([[0.0] * 4, [0.0, 0.0, 0.0, 1.0]]))


@pytest.mark.parametrize("cls", [RejectionSampler, TypicalAcceptanceSampler])
@pytest.mark.parametrize(
    "row,temp,expected",
    [
        ([0.0, 0.0, 0.0, INF, 0.0], 1.0, 3),  # was token 0 (NaN softmax)
        ([0.0, 0.0, 0.0, 3e38, 0.0], 0.5, 3),  # was token 0 (x / T = inf - inf)
        ([0.0, 0.0, 0.0, 3e38, 0.0], 1e-38, 3),
        ([-INF] * 5, 1.0, -1),  # no distribution: no token (was token 0)
        ([-INF] * 5, 0.0, -1),  # greedy request on a row without a finite logit
    ],
)
def test_logits_edge_rows(cls, row, temp, expected):
    lg = torch.zeros(1, 2, 5)
    lg[0, 0] = torch.tensor(row)
    kw = {"seeds": torch.tensor([0])} if cls is RejectionSampler else {}
    # the draft (token 1) has probability 0 under q: rejected; the token at position 0 comes from row 0
    out = both(
        cls,
        lambda s: s.forward_from_logits(lg, torch.tensor([[0]]), None, torch.tensor([[1]]), torch.tensor([temp]), **kw),
    )
    assert out.tolist() == [[expected, -1]]
    if expected == -1:
        with pytest.raises(
            SpecSamplerInputError, match=r"target_logits: expected rows with a finite logit .*row \[0, 0\] all -inf"
        ):
            cls(check_values=True).forward_from_logits(
                lg, torch.tensor([[0]]), None, torch.tensor([[1]]), torch.tensor([temp])
            )


@pytest.mark.parametrize("cls", [RejectionSampler, TypicalAcceptanceSampler])
def test_infinite_temperature_is_uniform_over_finite_logits(cls):
    lg = torch.tensor([[[0.0, 50.0, -INF, -30.0], [0.0, 0.0, 0.0, 0.0]]])
    kw = {"seeds": torch.tensor([9])} if cls is RejectionSampler else {}
    for draft, accepted in ((0, True), (2, False)):  # q = (1/3, 1/3, 0, 1/3)
        out = both(
            cls,
            lambda s, draft=draft: s.forward_from_logits(
                lg, torch.tensor([[1]]), None, torch.tensor([[draft]]), torch.tensor([INF]), **kw
            ),
        )
        if accepted and cls is TypicalAcceptanceSampler:  # q(0) = 1/3 clears the threshold
            assert out.tolist() == [[0, 1]]
        else:  # rejection accepts 0 with probability 1/3; a recovery never picks token 2 (q = 0)
            assert out[0, 0].item() in (0, 1, 3)
            assert out.tolist() == [[0, 1]] or out[0, 1] == -1


@pytest.mark.parametrize("cls", [RejectionSampler, TypicalAcceptanceSampler])
def test_probability_rows_without_mass_emit_no_token(cls):
    q = torch.zeros(2, 2, 4)
    q[:, 1, 2] = 1.0
    q[1, 0, 1] = float("nan")
    kw = {"seeds": torch.tensor([1, 2])} if cls is RejectionSampler else {}
    out = both(cls, lambda s: s(q, torch.tensor([[0], [5]]), None, torch.tensor([[0], [1]]), **kw))
    assert out.tolist() == [[-1, -1], [-1, -1]]
    if cls is RejectionSampler:  # greedy rows: argmax 0 of an all-zero row is never accepted
        greedy = both(
            cls,
            lambda s: s(
                q,
                torch.tensor([[0], [5]]),
                None,
                torch.tensor([[0], [0]]),
                seeds=torch.tensor([1, 2]),
                is_greedy=torch.tensor([True, True]),
            ),
        )
        assert greedy.tolist() == [[-1, -1], [-1, -1]]


# -- finding 4 (fixed by the rng merge: scaled race keys) ---------------------------------------


def test_subnormal_only_row_emits_its_only_token():
    t = torch.zeros(1, 2, 4)
    t[0, 0, 2] = 1.4e-45
    t[0, 1, 0] = 1
    out = both(
        RejectionSampler, lambda s: s(t, torch.tensor([[0]]), None, torch.tensor([[1]]), seeds=torch.tensor([2]))
    )
    assert out.tolist() == [[2, -1]]


# -- finding 5: typical acceptance near-ties --------------------------------------------------


def test_typical_issue_example_agrees():
    q = torch.softmax(torch.randn(2, 100, generator=torch.Generator().manual_seed(104)) * 1.5, -1)[None]
    out = both(
        lambda backend: TypicalAcceptanceSampler(1.0, 2.330611472490791, backend=backend),
        lambda s: s(q, torch.tensor([[0]]), None, torch.tensor([[31]])),
    )
    assert out.tolist() == [[31, 0]]  # q(31) = 0.0434 is above the float64 threshold


def test_typical_300_constructed_near_ties_agree():
    """alpha = q(x) * exp(H) with H as fp32 torch computes it (what V0 and the old reference did),
    nudged by -2..2 fp32 ulps: the threshold sits on q(x) to fp32 precision, where the fp32 sums of
    the two backends disagreed on 56 of 300."""
    g = torch.Generator().manual_seed(9)
    n, V = 300, 100
    rows = torch.softmax(torch.randn(n, 2, V, generator=g) * (0.5 + 2 * torch.rand(n, 1, 1, generator=g)), -1)
    x = torch.randint(0, V, (n,), generator=g)
    q0 = rows[:, 0]
    h = -(q0 * torch.log(q0 + 1e-5)).sum(-1)
    alpha = (q0[torch.arange(n), x] * torch.exp(h)).double()
    nudge = torch.randint(-2, 3, (n,), generator=g).double()
    alpha = alpha * (1 + nudge * 2.0**-23)
    bonus = torch.zeros(1, 1, dtype=torch.long)
    mismatches = []
    for i in range(n):
        outs = [
            TypicalAcceptanceSampler(1.0, float(alpha[i]), backend=b)(rows[i : i + 1], bonus, None, x[i].view(1, 1))
            for b in BACKENDS
        ]
        if not torch.equal(*outs):
            mismatches.append((i, outs))
    assert mismatches == []


# -- finding 6: errors naming nothing ---------------------------------------------------------


@pytest.mark.parametrize("cls", [RejectionSampler, TypicalAcceptanceSampler])
def test_meta_tensors(cls):
    q, p, ids, bonus = (t.to("meta") for t in probs_case())
    with pytest.raises(SpecSamplerInputError, match="draft_token_ids: expected a tensor with data"):
        cls(strict_mode=True)(q, bonus, p, ids)
    with pytest.raises(SpecSamplerInputError, match="target_with_bonus_probs: expected a tensor with data"):
        cls(check_values=True)(q, bonus, p, ids)
    out = cls()(q, bonus, p, ids)  # without checks: shapes propagate
    assert out.device.type == "meta" and out.shape == (3, 3)


def test_huge_max_spec_len_is_rejected_before_allocating():
    with pytest.raises(SpecSamplerInputError, match=r"max_spec_len: expected an int in \[0, 1024\], got 1099511627776"):
        RejectionSampler().forward_ragged(
            torch.full((1, 5), 0.2), torch.tensor([0]), None, torch.tensor([0]), torch.tensor([1]), 2**40
        )


def test_strict_errors_name_the_element():
    q, p, ids, bonus = probs_case()
    ids[2, 1] = 99
    with pytest.raises(
        SpecSamplerInputError, match=r"draft_token_ids: expected token ids in \[0, 16\), got id 99 at \[2, 1\]"
    ):
        RejectionSampler(strict_mode=True)(q, bonus, p, ids)
    with pytest.raises(
        SpecSamplerInputError, match=r"temperature: expected finite values >= 0 \(0 = greedy\), got nan at \[1\]"
    ):
        RejectionSampler(strict_mode=True).forward_from_logits(
            q, bonus, p, ids.clamp(max=15), torch.tensor([1.0, float("nan"), 1.0])
        )
