"""Bad input: what each gets.

* rank, shape, dtype, device or V mismatches: SpecSamplerInputError (a ValueError and an
  AssertionError) naming the argument, expected and actual value, with or without strict mode;
* token ids outside [0, V): the same error in strict mode (vLLM V0's checks); NaN/Inf/negative
  probabilities, rows not summing to 1: the same error with check_values=True (strict mode alone
  accepts them, as V0's does); without the checks, out-of-range draft ids are rejected (never
  indexed), an out-of-range bonus id is replaced by a sample of the bonus row, bad probabilities
  count as 0, unnormalised rows are used as given, and a row without probability mass emits no
  token (-1). Never a NaN-derived or out-of-range token.
"""

import pytest
import torch

from spec_samplers import RejectionSampler, SpecSamplerInputError, TypicalAcceptanceSampler

B, K, V = 4, 3, 10
SAMPLERS = [RejectionSampler, TypicalAcceptanceSampler]


def good():
    gen = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(B, K + 1, V, generator=gen), -1)
    draft = torch.softmax(torch.randn(B, K, V, generator=gen), -1)
    ids = torch.randint(0, V, (B, K), generator=gen)
    bonus = torch.randint(0, V, (B, 1), generator=gen)
    return target, bonus, draft, ids


def assert_valid_output(out: torch.Tensor) -> None:
    assert out.dtype == torch.int64
    emitted = out[out != -1]
    assert bool(((emitted >= 0) & (emitted < V)).all())
    # layout: tokens then -1 only
    n = (out != -1).sum(1)
    assert bool((n >= 1).all())
    pos = torch.arange(out.shape[1])[None, :]
    assert torch.equal(out != -1, pos < n[:, None])


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize(
    "mutate,argument,fragment",
    [
        (lambda t, b, d, i: (t[0], b, d, i), "target_with_bonus_probs", "3-d tensor"),
        (lambda t, b, d, i: (t, b, d, i[:, :, None]), "draft_token_ids", "2-d tensor"),
        (lambda t, b, d, i: (t[:, :K], b, d, i), "target_with_bonus_probs", f"shape ({B}, {K + 1}, V)"),
        (lambda t, b, d, i: (t, b[:2], d, i), "bonus_token_ids", f"shape ({B}, 1)"),
        (lambda t, b, d, i: (t, b, d[..., :-1], i), "draft_probs", f"shape ({B}, {K}, {V})"),
        (lambda t, b, d, i: (t.double(), b, d, i), "target_with_bonus_probs", "dtype in"),
        (lambda t, b, d, i: (t, b, d, i.float()), "draft_token_ids", "dtype in"),
        (lambda t, b, d, i: (t, b.to(torch.int16), d, i), "bonus_token_ids", "dtype in"),
        (lambda t, b, d, i: (t, b, d.to(torch.int64), i), "draft_probs", "dtype in"),
        (lambda t, b, d, i: (t, b, d, i.to("meta")), "draft_token_ids", "device"),
        (lambda t, b, d, i: (t, b, d.to("meta"), i), "draft_probs", "device"),
        (lambda t, b, d, i: (t, b, d, i.tolist()), "draft_token_ids", "torch.Tensor"),
    ],
)
def test_metadata_errors(cls, strict, mutate, argument, fragment):
    args = mutate(*good())
    with pytest.raises(SpecSamplerInputError, match=argument) as info:
        cls(strict_mode=strict)(*args)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, AssertionError)


@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize("bad_id", [-1, V, 10**6])
def test_out_of_range_draft_ids(cls, bad_id):
    target, bonus, draft, ids = good()
    ids[1, 0] = bad_id
    with pytest.raises(
        SpecSamplerInputError, match=rf"draft_token_ids: expected token ids in \[0, {V}\), got id {bad_id}"
    ):
        cls(strict_mode=True)(target, bonus, draft, ids)
    out = cls()(target, bonus, draft, ids)  # non-strict: rejected at that position
    assert_valid_output(out)
    assert int(out[1, 1]) == -1 and int(out[1, 0]) != bad_id


@pytest.mark.parametrize("cls", SAMPLERS)
def test_out_of_range_bonus_id(cls):
    target, bonus, draft, ids = good()
    target[:, :K] = torch.nn.functional.one_hot(ids, V).float()  # every draft accepted
    draft = target[:, :K].clone()
    bonus[2, 0] = V + 3
    with pytest.raises(SpecSamplerInputError, match="bonus_token_ids"):
        cls(strict_mode=True)(target, bonus, draft, ids)
    out = cls()(target, bonus, draft, ids)
    assert_valid_output(out)
    assert torch.equal(out[:, :K], ids)
    assert 0 <= int(out[2, K]) < V and target[2, K, int(out[2, K])] > 0  # drawn from the bonus row


@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.5])
@pytest.mark.parametrize("where", ["target", "draft"])
def test_bad_probability_values(cls, value, where):
    target, bonus, draft, ids = good()
    if where == "target":
        target[0, 0, :3] = value
        name = "target_with_bonus_probs"
    else:
        draft[0, 0, :3] = value
        name = "draft_probs"
    expected = "finite probabilities" if value != -0.5 else "non-negative probabilities"
    with pytest.raises(SpecSamplerInputError, match=f"{name}: expected {expected}"):
        cls(check_values=True)(target, bonus, draft, ids)
    assert_valid_output(cls(strict_mode=True)(target, bonus, draft, ids))  # V0's strict mode: no value checks
    for _ in range(5):
        assert_valid_output(cls()(target, bonus, draft, ids))


@pytest.mark.parametrize("cls", SAMPLERS)
def test_all_nan_rows_emit_no_token(cls):
    target, bonus, draft, ids = good()
    target[:] = float("nan")
    draft[:] = float("nan")
    out = cls()(target, bonus, draft, ids)
    # no target row has a distribution: nothing is accepted and nothing can be recovered
    assert out.tolist() == [[-1] * (K + 1)] * B


@pytest.mark.parametrize("cls", SAMPLERS)
def test_rows_not_summing_to_one(cls):
    target, bonus, draft, ids = good()
    target[1, 2] *= 1.5
    with pytest.raises(
        SpecSamplerInputError,
        match=r"target_with_bonus_probs: expected rows summing to 1 \(tolerance 0.001\), "
        r"got row \[1, 2\] summing to 1.5 \(the worst row\)",
    ):
        cls(check_values=True)(target, bonus, draft, ids)
    assert_valid_output(cls(strict_mode=True)(target, bonus, draft, ids))
    assert_valid_output(cls()(target, bonus, draft, ids))


def test_bf16_rounding_passes_strict_mode():
    target, bonus, draft, ids = good()
    out = RejectionSampler(strict_mode=True, check_values=True)(target.bfloat16(), bonus, draft.bfloat16(), ids.int())
    assert_valid_output(out)


def test_rejection_keyword_argument_errors():
    target, bonus, draft, ids = good()
    s = RejectionSampler()
    with pytest.raises(SpecSamplerInputError, match=r"seeds: expected shape \(4,\)"):
        s(target, bonus, draft, ids, seeds=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(SpecSamplerInputError, match="offsets: expected dtype"):
        s(target, bonus, draft, ids, offsets=torch.zeros(B))
    with pytest.raises(SpecSamplerInputError, match="is_greedy: expected dtype"):
        s(target, bonus, draft, ids, is_greedy=torch.zeros(B, dtype=torch.int64))
    with pytest.raises(SpecSamplerInputError, match=r"seeded_seqs: expected row indices in \[0, 4\), got 7"):
        s(target, bonus, draft, ids, seeded_seqs={7: torch.Generator()})
    with pytest.raises(SpecSamplerInputError, match=r"seeded_seqs\[1\]: expected a torch.Generator"):
        s(target, bonus, draft, ids, seeded_seqs={1: 5})
    with pytest.raises(TypeError, match="strict_mode"):
        RejectionSampler(strict_mode="yes")


def test_ragged_errors():
    target, bonus, draft, ids = good()
    flat_t, flat_d, flat_i = target[:, :K].reshape(-1, V), draft.reshape(-1, V), ids.reshape(-1)
    cu = torch.arange(1, B + 1) * K
    s = RejectionSampler(strict_mode=True)
    with pytest.raises(
        SpecSamplerInputError,
        match="max_spec_len: expected counts|cu_num_draft_tokens: expected counts <= max_spec_len",
    ):
        s.forward_ragged(flat_t, bonus, flat_d, flat_i, cu, K - 1)
    with pytest.raises(SpecSamplerInputError, match=f"cu_num_draft_tokens: expected a last entry equal to T = {B * K}"):
        s.forward_ragged(flat_t, bonus, flat_d, flat_i, cu - 1, K)
    with pytest.raises(SpecSamplerInputError, match="draft_token_ids: expected shape"):
        s.forward_ragged(flat_t, bonus, flat_d, flat_i[:-1], cu, K)
    with pytest.raises(SpecSamplerInputError, match=r"max_spec_len: expected an int in \[0, 1024\]"):
        s.forward_ragged(flat_t, bonus, flat_d, flat_i, cu, -1)
    # non-strict, invalid bonus id in the ragged layout (no bonus row): a missing token, never a wrong one
    flat_t = torch.nn.functional.one_hot(flat_i, V).float()
    bonus[0, 0] = -5
    out = RejectionSampler().forward_ragged(flat_t, bonus, flat_t, flat_i, cu, K)
    assert out[0].tolist() == ids[0].tolist() + [-1]


@pytest.mark.parametrize(
    ("draft_shape", "hint"),
    [
        ((2, 2, 10), "(k = 2 where draft_token_ids gives 3)"),
        ((2, 3, 11), "(V = 11 where target_with_bonus_probs gives 10)"),
        ((3, 2, 10), "(B = 3 where draft_token_ids gives 2; k = 2 where draft_token_ids gives 3)"),
    ],
)
def test_draft_probs_shape_error_names_what_differs(draft_shape, hint):
    target = torch.softmax(torch.randn(2, 4, 10), -1)
    draft = torch.softmax(torch.randn(*draft_shape), -1)
    with pytest.raises(SpecSamplerInputError) as exc:
        RejectionSampler()(target, torch.zeros(2, 1, dtype=torch.long), draft, torch.zeros(2, 3, dtype=torch.long))
    assert str(exc.value) == f"draft_probs: expected shape (2, 3, 10), got shape {draft_shape} {hint}"


def _entry_calls():
    """(label, callable, kwargs): a valid call of every public entry and operation, every tensor
    argument by its name (tests/test_bad_input.py: each is then replaced by a non-tensor)."""
    from spec_samplers import BlockVerificationSampler, sampling
    from spec_samplers.logits_processor import LogitsPipe, Sample, Softmax, Temperature

    gen = torch.Generator().manual_seed(3)
    target, bonus, draft, ids = good()
    T = B * K
    cu = torch.arange(1, B + 1) * K
    ragged = {
        "bonus_token_ids": bonus[:, 0],
        "draft_token_ids": ids.reshape(T),
        "cu_num_draft_tokens": cu,
        "max_spec_len": K,
    }
    seeds = {"seeds": torch.arange(B)}
    calls = []
    for cls in (RejectionSampler, TypicalAcceptanceSampler, BlockVerificationSampler):
        s = cls()
        d = {} if cls is TypicalAcceptanceSampler else seeds
        padded = {"bonus_token_ids": bonus, "draft_token_ids": ids, **d}
        draft_kw = {"draft_probs": draft} if cls is not TypicalAcceptanceSampler else {"draft_probs": None}
        calls += [
            (f"{cls.__name__}.forward", s.forward, {"target_with_bonus_probs": target, **draft_kw, **padded}),
            (
                f"{cls.__name__}.forward_ragged",
                s.forward_ragged,
                {"target_probs": target[:, :K].reshape(T, V), "draft_probs": None, **ragged, **d},
            ),
            (
                f"{cls.__name__}.forward_from_logits",
                s.forward_from_logits,
                {"target_logits": target.log(), "draft_logits": None, "temperature": torch.ones(B), **padded},
            ),
            (
                f"{cls.__name__}.forward_ragged_from_logits",
                s.forward_ragged_from_logits,
                {
                    "target_logits": target[:, :K].reshape(T, V).log(),
                    "draft_logits": None,
                    "temperature": torch.ones(B),
                    **ragged,
                    **d,
                },
            ),  # fmt: skip
        ]
    N = 3
    tree_t = torch.softmax(torch.randn(B, N + 1, V, generator=gen), -1)
    tree_ids = torch.randint(0, V, (B, N), generator=gen)
    parents = torch.tensor([0, 0, 1])
    tree = RejectionSampler()
    flat_t = tree_t.reshape(B * (N + 1), V)
    tree_ragged = {
        "draft_token_ids": tree_ids.reshape(B * N),
        "parents": parents.repeat(B),
        "cu_num_nodes": torch.arange(1, B + 1) * N,
        "max_nodes": N,
        **seeds,
    }
    calls += [
        ("forward_tree", tree.forward_tree,
         {"target_probs": tree_t, "draft_probs": tree_t, "draft_token_ids": tree_ids, "parents": parents, **seeds}),
        ("forward_tree_ragged", tree.forward_tree_ragged,
         {"target_probs": flat_t, "draft_probs": flat_t, **tree_ragged}),
        ("forward_tree_from_logits", tree.forward_tree_from_logits,
         {"target_logits": tree_t.log(), "draft_logits": tree_t.log(), "draft_token_ids": tree_ids,
          "parents": parents, "temperature": torch.ones(B), **seeds}),
        ("forward_tree_ragged_from_logits", tree.forward_tree_ragged_from_logits,
         {"target_logits": flat_t.log(), "draft_logits": flat_t.log(), "temperature": torch.ones(B), **tree_ragged}),
    ]  # fmt: skip
    probs = torch.softmax(torch.randn(B, V, generator=gen), -1)
    ops = {
        "sampling_from_probs": {"probs": probs},
        "sampling_from_logits": {"logits": probs.log()},
        "softmax": {"logits": probs.log()},
        "top_p_sampling_from_probs": {"probs": probs, "top_p": 0.9},
        "top_k_sampling_from_probs": {"probs": probs, "top_k": 3},
        "min_p_sampling_from_probs": {"probs": probs, "min_p": 0.1},
        "top_k_top_p_sampling_from_logits": {"logits": probs.log(), "top_k": 3, "top_p": 0.9},
        "top_k_top_p_sampling_from_probs": {"probs": probs, "top_k": 3, "top_p": 0.9},
        "top_p_renorm_probs": {"probs": probs, "top_p": 0.9},
        "top_k_renorm_probs": {"probs": probs, "top_k": 3},
        "top_k_mask_logits": {"logits": probs.log(), "top_k": 3},
        "chain_speculative_sampling": {"draft_probs": draft, "draft_token_ids": ids, "target_probs": target},
    }
    calls += [(name, getattr(sampling, name), kwargs) for name, kwargs in ops.items()]
    pipe = LogitsPipe([Temperature(), Softmax(), Sample()])
    calls.append(("LogitsPipe", lambda x: pipe(x, temperature=1.0), {"x": probs.log()}))
    return calls


def test_every_entry_names_a_non_tensor_argument():
    """Issue 39: a numpy array or a list where a tensor belongs fails at the edge with the
    argument's own name (``target_with_bonus_probs: expected a torch.Tensor, got
    numpy.ndarray``), for every sampler entry, tree entry, sampling operation and LogitsPipe,
    never deeper in (an AttributeError on ``.device``)."""
    checked = 0
    for label, fn, kwargs in _entry_calls():
        fn(**kwargs)  # the call is valid as given
        for name, value in kwargs.items():
            if not isinstance(value, torch.Tensor) or name == "parents":  # parents may be a list
                continue
            expected_any = "a torch.Tensor or TaggedTensor" if label == "LogitsPipe" else "a torch.Tensor"
            for bad, shown in ((value.numpy(), "numpy.ndarray"), (value.tolist(), "list")):
                with pytest.raises(SpecSamplerInputError) as info:
                    fn(**{**kwargs, name: bad})
                assert str(info.value) == f"{name}: expected {expected_any}, got {shown}", label
                checked += 1
    assert checked >= 100
