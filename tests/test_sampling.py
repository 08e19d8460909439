"""spec_samplers.sampling (FlashInfer-compatible sampling operations), PyTorch path.

Distributions: every sampling op draws N tokens in one call, through ``indices`` (several outputs
per input row) with per-request parameter tensors (one entry per output). The law each output
must follow is computed here from the definitions in float64 (brute force over pairs of tokens,
independent of spec_samplers.sampling.reference), on rows with ties at the filters' boundaries,
and checked by a chi-square test per case at significance CHI2_ALPHA = 1e-3 (the false-failure
rate per case at a random seed; the seeds here are fixed, so the suite is deterministic).
"""

from __future__ import annotations

import pytest
import torch
from sampling_cases import FILTERS, filter_kwargs
from stats_helpers import CHI2_ALPHA, binomial_bound, chi2_pvalue

import spec_samplers.sampling as sampling
from spec_samplers.constants import SpecSamplerInputError
from spec_samplers.layout import VerifyBatch
from spec_samplers.reference import rejection_reference
from spec_samplers.sampling import reference as ref

N = 24000  # draws per call (split over the cases of the call)

# Rows with ties where the filters cut: 0.2 twice (top-2 keeps both and the 0.3 -> 3 tokens),
# 0.1 twice, 0.05 four times; zeros at the end.
TIED = [0.3, 0.2, 0.2, 0.1, 0.1, 0.03, 0.02, 0.05, 0.0, 0.0]
FLAT = [0.125] * 8 + [0.0, 0.0]
SKEWED = [0.05, 0.6, 0.05, 0.05, 0.1, 0.1, 0.01, 0.01, 0.01, 0.02]


def expected_kept(
    p: torch.Tensor,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    joint: bool = False,
    order: torch.Tensor | None = None,
) -> torch.Tensor:
    """[V] bool from the definitions (float64; ``order``: the values top-k ranks, default p)."""
    p = p.double()
    order = p if order is None else order.double()
    V = p.numel()
    keep = torch.ones(V, dtype=torch.bool)
    if top_k is not None and 0 < top_k < V:
        keep = torch.tensor([int((order > order[x]).sum()) < top_k for x in range(V)])
    if top_p is not None and top_p < 1:
        cand = torch.ones(V, dtype=torch.bool) if joint else keep.clone()
        total = float(p[cand].sum())
        above = [float(p[cand & (order > order[x])].sum()) for x in range(V)]
        keep_p = torch.tensor([cand[x] and (above[x] == 0 or above[x] < top_p * total) for x in range(V)])
        keep = keep & keep_p
    if min_p is not None:
        keep = keep & (p >= min_p * p.max())
    return keep


def law(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    w = torch.where(keep, p.double(), 0.0)
    return w / w.sum()


def check_cases(tokens: torch.Tensor, case_of_output: torch.Tensor, laws: list[torch.Tensor]) -> None:
    for c, expected in enumerate(laws):
        got = tokens[case_of_output == c].to(torch.int64)
        pval = chi2_pvalue(got, expected)
        counts = torch.bincount(got, minlength=expected.numel()).tolist()
        assert pval > CHI2_ALPHA, f"case {c}: chi-square p = {pval:.2e}, counts {counts}, expected {expected.tolist()}"


def batch_of_cases(rows: list[list[float]], num_cases: int, dtype=torch.float32):
    """(probs [R, V], case of each output [N], indices [N] int32: the row of the output's case)."""
    probs = torch.tensor(rows, dtype=torch.float32).to(dtype)
    case = torch.arange(N) % num_cases
    return probs, case


def per_output(values: list, case: torch.Tensor, dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)[case]


def seeds_for(n: int, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(salt)
    return torch.randint(0, 2**62, (n,), generator=g), torch.randint(0, 2**40, (n,), generator=g)


# ---------------------------------------------------------------------------------------------
# Exact distributions.


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampling_from_probs_distribution(dtype):
    probs, case = batch_of_cases([TIED, SKEWED, FLAT], 3, dtype)
    seeds, offsets = seeds_for(N, 1)
    tokens = sampling.sampling_from_probs(probs, indices=case.to(torch.int32), seed=seeds, offset=offsets)
    assert tokens.dtype == torch.int32 and tokens.shape == (N,)
    check_cases(tokens, case, [law(probs[c].float(), torch.ones(10, dtype=torch.bool)) for c in range(3)])


def test_sampling_from_logits_distribution():
    logits = torch.log(torch.tensor([TIED, SKEWED]))  # zeros -> -inf
    case = torch.arange(N) % 2
    tokens = sampling.sampling_from_logits(logits, indices=case, seed=123, offset=5)
    assert tokens.dtype == torch.int64  # the dtype of indices
    check_cases(
        tokens, case, [law(torch.softmax(logits[c].double(), -1), torch.ones(10, dtype=torch.bool)) for c in range(2)]
    )


@pytest.mark.parametrize("scalar", [False, True])
def test_top_k_distribution(scalar):
    probs = torch.tensor([TIED, SKEWED, FLAT])
    ks = [2, 1, 3] if not scalar else [2, 2, 2]  # TIED top-2: the 0.2 tie keeps 3 tokens; FLAT: all 8 tied
    case = torch.arange(N) % 3
    seeds, offsets = seeds_for(N, 2)
    top_k = 2 if scalar else per_output(ks, case, torch.int32)
    tokens = sampling.top_k_sampling_from_probs(probs, top_k, indices=case, seed=seeds, offset=offsets)
    check_cases(tokens, case, [law(probs[c], expected_kept(probs[c], top_k=ks[c])) for c in range(3)])


def test_top_p_distribution():
    probs = torch.tensor([TIED, TIED, SKEWED, FLAT])
    ps = [0.4, 0.75, 0.65, 0.3]  # TIED 0.4: {0.3, 0.2, 0.2} (the tie stays); 0.75: + the 0.1 pair
    case = torch.arange(N) % 4
    seeds, offsets = seeds_for(N, 3)
    tokens = sampling.top_p_sampling_from_probs(
        probs, per_output(ps, case, torch.float32), indices=case, seed=seeds, offset=offsets
    )
    check_cases(tokens, case, [law(probs[c], expected_kept(probs[c], top_p=ps[c])) for c in range(4)])
    assert expected_kept(probs[0], top_p=0.4).sum() == 3 and expected_kept(probs[1], top_p=0.75).sum() == 5


def test_min_p_distribution():
    probs = torch.tensor([TIED, SKEWED, FLAT])
    mps = [0.5, 0.1, 1.0]  # TIED: >= 0.15 -> {0.3, 0.2, 0.2}; SKEWED: >= 0.06; FLAT: all 8 tied at the max
    case = torch.arange(N) % 3
    seeds, offsets = seeds_for(N, 4)
    tokens = sampling.min_p_sampling_from_probs(
        probs, per_output(mps, case, torch.float32), indices=case, seed=seeds, offset=offsets
    )
    check_cases(tokens, case, [law(probs[c], expected_kept(probs[c], min_p=mps[c])) for c in range(3)])


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_top_k_top_p_from_probs_distribution(order):
    probs = torch.tensor([TIED, SKEWED, TIED])
    ks, ps = [5, 5, 0], [0.75, 0.85, 0.45]  # TIED, k=5, p=0.75: the 0.1 pair stays only when joint
    case = torch.arange(N) % 3
    seeds, offsets = seeds_for(N, 5)
    tokens = sampling.top_k_top_p_sampling_from_probs(
        probs,
        per_output(ks, case, torch.int64),
        per_output(ps, case, torch.float32),
        indices=case,
        filter_apply_order=order,
        seed=seeds,
        offset=offsets,
    )
    joint = order == "joint"
    laws = [law(probs[c], expected_kept(probs[c], top_k=ks[c], top_p=ps[c], joint=joint)) for c in range(3)]
    check_cases(tokens, case, laws)


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_top_k_top_p_from_logits_distribution(order):
    logits = torch.tensor(
        [[2.0, 1.0, 1.0, 0.5, 0.5, 0.0, -1.0, float("-inf")], [0.0, 3.0, 0.0, 1.0, 2.0, 2.0, -2.0, 1.0]]
    )
    ks, ps = [3, 4], [0.6, 0.9]
    case = torch.arange(N) % 2
    tokens = sampling.top_k_top_p_sampling_from_logits(
        logits,
        per_output(ks, case, torch.int32),
        per_output(ps, case, torch.float64),
        indices=case,
        filter_apply_order=order,
        seed=99,
        offset=1,
    )
    laws = []
    for c in range(2):
        probs = torch.softmax(logits[c].double(), -1)
        laws.append(law(probs, expected_kept(probs, top_k=ks[c], top_p=ps[c], joint=order == "joint", order=logits[c])))
    check_cases(tokens, case, laws)


def test_top_k_first_differs_from_joint_where_it_should():
    """top_k_first applies top-p to the renormalised top-k: on TIED, top-5 has mass 0.9 and the
    0.1 pair has 0.7 above it: 0.7 >= 0.75 * 0.9 cuts it after top-k, 0.7 < 0.75 keeps it when joint."""
    p = torch.tensor(TIED)
    first = expected_kept(p, top_k=5, top_p=0.75)
    joint = expected_kept(p, top_k=5, top_p=0.75, joint=True)
    assert first.sum() == 3 and joint.sum() == 5
    probs = p[None].expand(4000, -1).contiguous()
    a = sampling.top_k_top_p_sampling_from_probs(probs, 5, 0.75, filter_apply_order="top_k_first", seed=1, offset=0)
    b = sampling.top_k_top_p_sampling_from_probs(probs, 5, 0.75, filter_apply_order="joint", seed=1, offset=0)
    assert set(a.tolist()) == set(torch.nonzero(first).flatten().tolist())
    assert set(b.tolist()) == set(torch.nonzero(joint).flatten().tolist())


# ---------------------------------------------------------------------------------------------
# Renorm and mask outputs.


def test_top_k_renorm_probs_exact_set_and_values():
    probs = torch.tensor([TIED, SKEWED, FLAT])
    top_k = torch.tensor([2, 3, 0])
    out = sampling.top_k_renorm_probs(probs, top_k)
    assert out.dtype == probs.dtype
    for c in range(3):
        keep = expected_kept(probs[c], top_k=int(top_k[c]))
        assert torch.equal(out[c] > 0, keep & (probs[c] > 0))
        torch.testing.assert_close(out[c].double(), law(probs[c], keep), atol=1e-6, rtol=0)


def test_top_p_renorm_probs_exact_set_and_values():
    probs = torch.tensor([TIED, SKEWED, FLAT], dtype=torch.float16)
    out = sampling.top_p_renorm_probs(probs, 0.5)
    assert out.dtype == torch.float32
    for c in range(3):
        keep = expected_kept(probs[c].float(), top_p=0.5)
        assert torch.equal(out[c] > 0, keep & (probs[c] > 0))
        torch.testing.assert_close(out[c].double(), law(probs[c].float(), keep), atol=1e-6, rtol=0)
    assert torch.equal(sampling.top_p_renorm_prob(probs, 0.5), out)  # FlashInfer's alias


def test_renorm_then_sample_is_the_fused_op():
    """FlashInfer: top_k_renorm_probs + sampling_from_probs is equivalent to top_k_sampling_from_probs
    (here: the same tokens, as both race the same kept weights)."""
    probs = torch.softmax(torch.randn(6, 40, generator=torch.Generator().manual_seed(0)), -1)
    seeds, offsets = seeds_for(6, 6)
    fused = sampling.top_k_sampling_from_probs(probs, 5, seed=seeds, offset=offsets)
    split = sampling.sampling_from_probs(sampling.top_k_renorm_probs(probs, 5), seed=seeds, offset=offsets)
    assert torch.equal(fused, split)


def test_top_k_mask_logits_exact():
    logits = torch.tensor(
        [
            [1.0, 3.0, 3.0, 2.0, float("nan"), -1.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [float("-inf"), 5.0, float("-inf"), float("inf"), 1.0, 2.0],
        ]
    )
    out = sampling.top_k_mask_logits(logits, torch.tensor([2, 1, 3]))
    inf = float("inf")
    expected = torch.tensor(
        [[-inf, 3.0, 3.0, -inf, -inf, -inf], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [-inf, 5.0, -inf, inf, -inf, 2.0]]
    )
    assert torch.equal(out, expected)
    half = sampling.top_k_mask_logits(logits.half(), 2)
    assert half.dtype == torch.float16 and torch.equal(half.float()[0], expected[0])
    assert torch.equal(sampling.top_k_mask_logits(logits[:1], 0), torch.nan_to_num(logits[:1], nan=-inf, posinf=inf))


def test_softmax():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(sampling.softmax(logits), torch.softmax(logits, -1))
    temps = torch.tensor([0.5, 1.0, 2.0])
    torch.testing.assert_close(sampling.softmax(logits, temps), torch.softmax(logits / temps[:, None], -1))
    torch.testing.assert_close(sampling.softmax(logits.half(), 0.7), torch.softmax(logits.half().float() / 0.7, -1))
    onehot = sampling.softmax(logits, torch.tensor([0.0, 1.0, 1.0]))
    assert torch.equal(onehot[0], torch.nn.functional.one_hot(logits[0].argmax(), 20).float())
    masked = torch.full((1, 4), float("-inf"))
    assert torch.equal(sampling.softmax(masked), torch.zeros(1, 4))


# ---------------------------------------------------------------------------------------------
# Seeds, offsets, rows.


def test_per_row_seeds_do_not_depend_on_neighbours():
    g = torch.Generator().manual_seed(7)
    probs = torch.softmax(torch.randn(6, 50, generator=g) * 2, -1)
    seeds, offsets = seeds_for(6, 7)
    top_p = torch.tensor([0.9, 0.5, 1.0, 0.7, 0.95, 0.3])
    batch = sampling.top_p_sampling_from_probs(probs, top_p, seed=seeds, offset=offsets)
    perm = torch.tensor([3, 1, 5, 0, 2, 4])
    permuted = sampling.top_p_sampling_from_probs(probs[perm], top_p[perm], seed=seeds[perm], offset=offsets[perm])
    assert torch.equal(permuted, batch[perm])
    for b in range(6):
        alone = sampling.top_p_sampling_from_probs(
            probs, top_p[b : b + 1], indices=torch.tensor([b]), seed=seeds[b : b + 1], offset=offsets[b : b + 1]
        )
        assert int(alone) == int(batch[b])
    # a neighbour's data changes nothing
    other = probs.clone()
    other[0] = torch.softmax(torch.randn(50, generator=g), -1)
    assert torch.equal(sampling.top_p_sampling_from_probs(other, top_p, seed=seeds, offset=offsets)[1:], batch[1:])


def test_scalar_seed_rows_are_distinct_streams():
    probs = torch.full((1, 1000), 1e-3)
    a = sampling.sampling_from_probs(probs, indices=torch.zeros(64, dtype=torch.int64), seed=5, offset=0)
    assert len(set(a.tolist())) > 50  # 64 draws from 1000 equal tokens: P(<= 50 distinct) < 1e-12
    b = sampling.sampling_from_probs(probs, indices=torch.zeros(64, dtype=torch.int64), seed=5, offset=0)
    assert torch.equal(a, b)
    c = sampling.sampling_from_probs(probs, indices=torch.zeros(64, dtype=torch.int64), seed=5, offset=1)
    assert (a != c).sum() > 50
    one = sampling.sampling_from_probs(
        probs, indices=torch.zeros(64, dtype=torch.int64), seed=torch.tensor([5]), offset=torch.tensor([0])
    )
    assert torch.equal(one, a)  # a length-1 tensor is FlashInfer's scalar form


def test_generator_reproduces_and_advances():
    probs = torch.full((32, 1000), 1e-3)
    g = torch.Generator().manual_seed(3)
    a = sampling.sampling_from_probs(probs, generator=g)
    b = sampling.sampling_from_probs(probs, generator=g)
    assert (a != b).sum() > 20
    assert torch.equal(sampling.sampling_from_probs(probs, generator=torch.Generator().manual_seed(3)), a)


def test_invalid_rows_give_minus_one():
    probs = torch.tensor([[0.0, 0.0, 0.0], [0.2, 0.3, 0.5], [float("nan"), -1.0, 0.0]])
    tokens, valid = sampling.top_k_sampling_from_probs(probs, 2, seed=1, offset=0, return_valid=True)
    assert valid.tolist() == [False, True, False] and tokens[0] == -1 and tokens[2] == -1 and tokens[1] in (1, 2)
    idx = torch.tensor([1, 7, -2], dtype=torch.int32)  # out-of-range indices read nothing
    tokens, valid = sampling.sampling_from_probs(probs, indices=idx, seed=1, offset=0, return_valid=True)
    assert tokens.dtype == torch.int32 and valid.tolist() == [True, False, False] and tokens[1:].tolist() == [-1, -1]
    assert sampling.sampling_from_logits(torch.full((1, 4), float("-inf")), seed=0, offset=0).tolist() == [-1]


def test_empty_batch():
    probs = torch.softmax(torch.randn(0, 8), -1)
    assert sampling.top_p_sampling_from_probs(probs, 0.9).shape == (0,)
    assert sampling.top_k_renorm_probs(probs, 3).shape == (0, 8)


# ---------------------------------------------------------------------------------------------
# chain_speculative_sampling.


def test_chain_speculative_sampling_is_the_rejection_sampler():
    g = torch.Generator().manual_seed(11)
    B, n, V = 64, 3, 12
    draft = torch.softmax(torch.randn(B, n, V, generator=g), -1)
    target = torch.softmax(torch.randn(B, n + 1, V, generator=g), -1)
    ids = torch.multinomial(draft.reshape(-1, V), 1, generator=g).view(B, n).to(torch.int32)
    seeds, offsets = seeds_for(B, 11)
    acc = torch.full((B,), 10, dtype=torch.int32)
    emi = torch.full((B,), 20, dtype=torch.int32)
    out, acc2, emi2 = sampling.chain_speculative_sampling(draft, ids, target, acc, emi, seed=seeds, offset=offsets)
    assert out.dtype == torch.int32 and out.shape == (B, n + 1) and acc2 is acc and emi2 is emi
    bonus = torch.full((B, 1), -1)
    assert torch.equal(
        out,
        rejection_reference(VerifyBatch.padded(target, bonus, draft, ids, seeds=seeds, offsets=offsets)).to(
            torch.int32
        ),
    )
    emitted = (out != -1).sum(1) - 1
    assert torch.equal(emi - 20, emitted.to(torch.int32))
    assert bool(((acc - 10) >= emitted).all()) and bool(((acc - 10) <= n).all())
    # the accepted prefix is accepted; where a draft was rejected, accepted - emitted counts later passes
    assert bool(
        (
            out[:, :n][torch.arange(n)[None, :] < emitted[:, None]] == ids[torch.arange(n)[None, :] < emitted[:, None]]
        ).all()
    )


def test_chain_counters_have_flashinfer_meaning():
    """accepted = drafts that pass on their own: mean sum_i sum_x min(p_i, q_i); emitted = the
    accepted prefix: mean sum_i prod_{j<=i} a_j. Checked within binomial_bound."""
    g = torch.Generator().manual_seed(12)
    n, V, rows = 3, 10, 20000
    p = torch.softmax(torch.randn(n, V, generator=g), -1)
    q = torch.softmax(torch.randn(n + 1, V, generator=g), -1)
    a = torch.minimum(p, q[:n]).sum(-1).double()  # acceptance per position
    draft = p.expand(rows, n, V)
    ids = torch.stack([torch.multinomial(p[i], rows, replacement=True, generator=g) for i in range(n)], 1)
    out, acc, emi = sampling.chain_speculative_sampling(
        draft, ids, q.expand(rows, n + 1, V), seed=torch.arange(rows), offset=torch.zeros(rows, dtype=torch.int64)
    )
    for got, want in (
        (acc.double().mean() / n, float(a.mean())),
        (emi.double().mean() / n, float(sum(torch.cumprod(a, 0))) / n),
    ):
        assert abs(float(got) - want) < binomial_bound(want, rows * n) * 2, (float(got), want)
    # all drafts accepted (p = q): the last token is a sample of the bonus row q[n]
    out, acc, emi = sampling.chain_speculative_sampling(
        q[:n].expand(rows, n, V), ids, q.expand(rows, n + 1, V), seed=3, offset=0
    )
    assert bool((emi == n).all()) and bool((acc == n).all())
    assert chi2_pvalue(out[:, n].long(), q[n]) > CHI2_ALPHA


# ---------------------------------------------------------------------------------------------
# Bad input: a clear error naming the argument.


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda p: sampling.top_p_sampling_from_probs(p, 0.0), "top_p"),
        (lambda p: sampling.top_p_sampling_from_probs(p, 1.5), "top_p"),
        (lambda p: sampling.top_p_renorm_probs(p, -0.1), "top_p"),
        (lambda p: sampling.top_p_sampling_from_probs(p, torch.tensor([0.5, 1.2]), check_nan=True), "top_p"),
        (lambda p: sampling.top_p_sampling_from_probs(p, torch.tensor([0.5])), "top_p"),
        (lambda p: sampling.min_p_sampling_from_probs(p, -0.1), "min_p"),
        (lambda p: sampling.min_p_sampling_from_probs(p, torch.tensor([0.1, -0.5]), check_nan=True), "min_p"),
        (lambda p: sampling.top_k_sampling_from_probs(p, 2.5), "top_k"),
        (lambda p: sampling.top_k_sampling_from_probs(p, torch.tensor([1.0, 2.0j])), "top_k"),
        (lambda p: sampling.sampling_from_probs(p[0]), "probs"),
        (lambda p: sampling.sampling_from_probs(p.to(torch.int32)), "probs"),
        (lambda p: sampling.sampling_from_probs(p.tolist()), "probs"),
        (lambda p: sampling.sampling_from_probs(p, indices=torch.tensor([0.0])), "indices"),
        (lambda p: sampling.sampling_from_probs(p, indices=torch.tensor([[0]])), "indices"),
        (lambda p: sampling.sampling_from_probs(p, indices=torch.tensor([0, 2]), check_nan=True), "indices"),
        (lambda p: sampling.sampling_from_probs(p, seed=torch.tensor([1, 2, 3])), "seed"),
        (lambda p: sampling.sampling_from_probs(p, seed=torch.tensor([1.0, 2.0])), "seed"),
        (lambda p: sampling.sampling_from_probs(p, seed=1, offset=torch.zeros(5, dtype=torch.int64)), "offset"),
        (lambda p: sampling.sampling_from_probs(p, seed=2**64), "seed"),
        (lambda p: sampling.sampling_from_probs(p, generator=3), "generator"),
        (
            lambda p: sampling.top_k_top_p_sampling_from_probs(p, 2, 0.9, filter_apply_order="top_p_first"),
            "filter_apply_order",
        ),
        (lambda p: sampling.softmax(p, temperature=-1.0), "temperature"),
        (lambda p: sampling.softmax(p, temperature=torch.ones(3)), "temperature"),
        (
            lambda p: sampling.chain_speculative_sampling(p[:, None], torch.zeros(2, 1, dtype=torch.int64), p[:, None]),
            "target_probs",
        ),
        (
            lambda p: sampling.chain_speculative_sampling(p[:, None], torch.zeros(2, 1), p[:, None].expand(2, 2, 4)),
            "draft_token_ids",
        ),
        (
            lambda p: sampling.chain_speculative_sampling(
                p[:, None], torch.zeros(2, 1, dtype=torch.int64), p[:, None].expand(2, 2, 4), torch.zeros(3)
            ),
            "maybe_output_accepted_token_num",
        ),
    ],
)
def test_bad_input_names_the_argument(call, argument):
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    with pytest.raises(SpecSamplerInputError, match=f"^{argument}: expected"):
        call(probs)


@pytest.mark.parametrize("op", ["sampling_from_probs", "top_p_sampling_from_probs", "sampling_from_logits"])
def test_check_nan(op):
    x = torch.tensor([[0.5, float("nan"), 0.5]])
    fn = getattr(sampling, op)
    args = (0.9,) if op.startswith("top_p") else ()
    name = "logits" if op.endswith("logits") else "probs"
    with pytest.raises(ValueError, match=f"^{name}: expected no NaN"):
        fn(x, *args, check_nan=True)
    fn(x, *args)  # unchecked: NaN counts as 0 (probs) / -inf (logits)


def test_fast_cpu_path_matches_the_definition():
    """The CPU shortcuts (top-k by torch.topk, races over the kept tokens only) give the tokens of
    the plain definition (sort, race over the whole row)."""
    g = torch.Generator().manual_seed(21)
    B, V = 16, 3000
    x = torch.softmax(torch.randn(B, V, generator=g) * torch.linspace(0.2, 6, B)[:, None], -1)
    x[:, :40] = x[:, :1]  # ties
    rows = torch.randint(0, B, (2 * B,), generator=g)
    seeds, offsets = seeds_for(2 * B, 21)
    k = torch.randint(-3, 60, (2 * B,), generator=g)
    p = torch.rand(2 * B, generator=g) * 1.1
    m = torch.rand(2 * B, generator=g) * 0.3
    for logits in (False, True):
        xx = torch.log(x) if logits else x
        for kw in (filter_kwargs(filters, k, p, m) for filters in FILTERS):
            slow = ref.sample_reference(xx, rows, seeds, offsets, logits, **kw, fast=False)
            fast = ref.sample_reference(xx, rows, seeds, offsets, logits, **kw, fast=True)
            assert torch.equal(slow[0], fast[0]) and torch.equal(slow[1], fast[1]), (logits, list(kw))
