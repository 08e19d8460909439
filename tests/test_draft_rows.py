"""The ragged logits entry's indexed draft rows (``draft_rows``: draft row t is row draft_rows[t] of
an [N, V] matrix, read in place) and their own temperature (``draft_temperature``): the kernels
against the reference token for token, the reference against the rows gathered by hand, and what
an index out of range does."""

import pytest
import torch
from conftest import DEVICE, KERNEL_BACKEND, small_split

from spec_samplers import BlockVerificationSampler, RejectionSampler, SpecSamplerInputError
from spec_samplers.kernels.verify_launch import block_triton, rejection_triton
from spec_samplers.layout import VerifyBatch
from spec_samplers.reference import block_reference, rejection_reference
from spec_samplers.torch_ops import probs_from_logits

K, V, EXTRA = 3, 200, 13
COUNTS = [3, 0, 2, 3, 1, 0, 3]  # empty requests included
TEMPERATURE = [0.7, 1.0, 0.0, 1.3, 0.5, 0.0, 1.0]  # 0: greedy requests
DRAFT_TEMPERATURE = [1.6, 0.4, 1.0, 0.8, 2.0, 1.0, 0.6]
OPS = {"rejection": (rejection_reference, rejection_triton), "block": (block_reference, block_triton)}


def cache_rows(kind: str, num_tokens: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft_rows [T], the [N, V] matrix they index as a view of a wider cache, never copied)."""
    cache = torch.randn(9, 4, V + EXTRA, generator=gen) * 1.5
    matrix = cache.view(-1, V + EXTRA)[:, :V]  # rows of stride V + EXTRA
    if kind == "permuted":
        rows = torch.randperm(matrix.shape[0], generator=gen)[:num_tokens]
    elif kind == "repeated":
        rows = torch.randint(0, 3, (num_tokens,), generator=gen)
    else:  # strided: every other row of a transposed-then-sliced view
        matrix = cache.transpose(0, 1).reshape(-1, V + EXTRA)[::2, :V]
        rows = torch.randint(0, matrix.shape[0], (num_tokens,), generator=gen)
    return rows, matrix


def make_batch(dtype: torch.dtype, kind: str, seed: int, **extra) -> tuple[VerifyBatch, torch.Tensor]:
    """A ragged logits batch with indexed draft rows; also returns the rows gathered by hand."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.tensor(COUNTS)
    T = int(counts.sum())
    rows, matrix = cache_rows(kind, T, gen)
    target = (torch.randn(T, V, generator=gen) * 1.5).to(dtype)
    matrix = matrix.to(dtype) if dtype != torch.float32 else matrix
    gathered = matrix[rows]  # [T, V]: what the indexed rows are
    # drafts sampled from the draft rows (so some are accepted), one out-of-range id
    ids = torch.multinomial(torch.softmax(gathered.float(), -1), 1, generator=gen).view(T)
    ids[4] = V + 3
    args = dict(
        temperature=torch.tensor(TEMPERATURE),
        draft_temperature=torch.tensor(DRAFT_TEMPERATURE),
        seeds=torch.arange(len(COUNTS)) * 7 + 1,
        offsets=torch.arange(len(COUNTS)) * 3,
    )
    args.update(extra)
    moved = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    bonus = torch.randint(0, V, (len(COUNTS),), generator=gen)
    tensors = [t.to(DEVICE) for t in (target, bonus, matrix, ids, counts.cumsum(0), rows)]
    batch = VerifyBatch.ragged(*tensors[:5], K, draft_rows=tensors[5], **moved)
    return batch, gathered.to(DEVICE)


@pytest.mark.parametrize("method", list(OPS))
@pytest.mark.parametrize("kind", ["permuted", "repeated", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_match_reference_with_indexed_draft_rows(method, kind, dtype):
    reference, kernel = OPS[method]
    for seed in range(3):
        batch, _ = make_batch(dtype, kind, seed)
        expected = reference(batch)
        assert torch.equal(kernel(batch, split=small_split(V, batch.layout.batch_size)), expected)
        assert torch.equal(kernel(batch), expected)  # the default split too


@pytest.mark.parametrize("method", list(OPS))
def test_indexed_rows_are_the_gathered_rows(method):
    """Indexing is only where the rows come from: the same tokens as the rows gathered by hand."""
    reference, kernel = OPS[method]
    batch, gathered = make_batch(torch.float32, "permuted", 11)
    by_hand = VerifyBatch(**{**batch.__dict__, "draft": gathered, "draft_rows": None})
    assert torch.equal(reference(batch), reference(by_hand))
    assert torch.equal(kernel(batch), kernel(by_hand))


def test_draft_temperature_is_the_draft_rows_temperature():
    """p = softmax(draft / T_draft), q = softmax(target / T): the probability entry on those gives
    the same tokens (greedy requests verify against the target's argmax either way)."""
    batch, gathered = make_batch(torch.float32, "repeated", 5)
    t, dt = batch.temperature, batch.draft_temperature
    counts = torch.tensor(COUNTS, device=DEVICE)
    q = probs_from_logits(batch.target, t.repeat_interleave(counts))
    p = probs_from_logits(gathered, dt.repeat_interleave(counts))
    probs = VerifyBatch(**{**batch.__dict__, "target": q, "draft": p, "draft_rows": None, "temperature": None,
                           "draft_temperature": None, "is_greedy": t == 0})  # fmt: skip
    assert torch.equal(rejection_reference(batch), rejection_reference(probs))
    # and it matters: the draft rows at the request's T give other tokens for some seed
    same_t = [VerifyBatch(**{**make_batch(torch.float32, "repeated", s)[0].__dict__, "draft_temperature": None})
              for s in range(6)]  # fmt: skip
    assert any(
        not torch.equal(rejection_reference(b), rejection_reference(make_batch(torch.float32, "repeated", s)[0]))
        for s, b in enumerate(same_t)
    )


@pytest.mark.parametrize("method", list(OPS))
@pytest.mark.parametrize("bad", [-1, 36, 10**12])
def test_out_of_range_row_rejects_that_draft(method, bad):
    """Without strict mode an index outside [0, N) is never read: that draft is rejected as an
    out-of-range id is, on both backends."""
    reference, kernel = OPS[method]
    batch, gathered = make_batch(torch.bfloat16, "permuted", 3)
    rows = batch.draft_rows.clone()
    rows[[0, 6]] = bad  # request 0's first draft, request 3's second
    bad_batch = VerifyBatch(**{**batch.__dict__, "draft_rows": rows})
    ids = batch.draft_token_ids.clone()
    ids[[0, 6]] = -1
    expected = reference(VerifyBatch(**{**batch.__dict__, "draft_token_ids": ids}))
    assert torch.equal(reference(bad_batch), expected)
    assert torch.equal(kernel(bad_batch, split=small_split(V, batch.layout.batch_size)), expected)


def positional(batch: VerifyBatch) -> tuple:
    """The ragged logits entry's positional arguments for ``batch`` (before temperature)."""
    return (
        batch.target,
        batch.bonus_token_ids,
        batch.draft,
        batch.draft_token_ids,
        batch.layout.cu_num_draft_tokens,
        K,
    )


@pytest.mark.parametrize("cls", [RejectionSampler, BlockVerificationSampler])
def test_entry_takes_draft_rows_on_both_backends(cls):
    batch, _ = make_batch(torch.bfloat16, "strided", 8)
    args = positional(batch)
    kw = dict(temperature=batch.temperature, seeds=batch.seeds, offsets=batch.offsets,
              draft_rows=batch.draft_rows.to(torch.int32), draft_temperature=batch.draft_temperature)  # fmt: skip
    a = cls(backend="torch").forward_ragged_from_logits(*args, **kw)
    b = cls(backend=KERNEL_BACKEND).forward_ragged_from_logits(*args, **kw)
    assert torch.equal(a, b) and torch.equal(
        a, OPS["block" if cls is BlockVerificationSampler else "rejection"][0](batch)
    )


def test_strided_and_expanded_options_read_as_contiguous():
    """A strided ``draft_rows`` and an expanded (stride 0) ``draft_temperature`` give the tokens of
    their contiguous copies, on both backends."""
    batch, _ = make_batch(torch.float32, "permuted", 9)
    args = positional(batch)
    rows = torch.stack([batch.draft_rows, -batch.draft_rows], 1)[:, 0]  # stride 2
    t = torch.full((), 0.45, device=DEVICE).expand(len(COUNTS))
    assert rows.stride(0) == 2 and t.stride(0) == 0
    for backend in ("torch", KERNEL_BACKEND):
        sampler = RejectionSampler(backend=backend)
        kw = dict(temperature=batch.temperature, seeds=batch.seeds)
        out = sampler.forward_ragged_from_logits(*args, **kw, draft_rows=rows, draft_temperature=t)
        expected = sampler.forward_ragged_from_logits(
            *args, **kw, draft_rows=rows.contiguous(), draft_temperature=t.contiguous()
        )
        assert torch.equal(out, expected)


def test_bad_draft_temperatures_count_as_one_without_strict_mode():
    """Without strict mode a draft temperature that is not > 0 (0, negative, NaN) counts as 1, as
    for ``temperature``: the tokens of T = 1 there, on both backends (+inf stays: the uniform limit)."""
    batch, _ = make_batch(torch.float32, "permuted", 11)
    args = positional(batch)
    bad = torch.tensor([0.0, -2.0, float("nan"), 0.8, float("inf"), -0.0, 1.3], device=DEVICE)
    fixed = torch.tensor([1.0, 1.0, 1.0, 0.8, float("inf"), 1.0, 1.3], device=DEVICE)
    for backend in ("torch", KERNEL_BACKEND):
        sampler = RejectionSampler(backend=backend)
        kw = dict(temperature=batch.temperature, seeds=batch.seeds, draft_rows=batch.draft_rows)
        out = sampler.forward_ragged_from_logits(*args, **kw, draft_temperature=bad)
        assert torch.equal(out, sampler.forward_ragged_from_logits(*args, **kw, draft_temperature=fixed))
        assert bool(((out >= -1) & (out < V)).all())


def entry_args():
    batch, _ = make_batch(torch.float32, "permuted", 2)
    # ids in range: strict mode checks the ids before the rows
    args = list(positional(VerifyBatch(**{**batch.__dict__, "draft_token_ids": batch.draft_token_ids % V})))
    kw = dict(temperature=batch.temperature, seeds=batch.seeds, draft_rows=batch.draft_rows,
              draft_temperature=batch.draft_temperature)  # fmt: skip
    return args, kw


BAD = [
    (dict(draft_rows=torch.zeros(12)), "draft_rows", "dtype"),
    (dict(draft_rows=torch.zeros(4, dtype=torch.int64)), "draft_rows", "shape (12,)"),
    (dict(draft_rows=torch.zeros(12, 1, dtype=torch.int64)), "draft_rows", "1-d"),
    (dict(draft_temperature=torch.ones(3)), "draft_temperature", "shape (7,)"),
    (dict(draft_temperature=torch.ones(7, dtype=torch.int64)), "draft_temperature", "dtype"),
    (dict(draft_temperature=torch.ones(7, device="meta")), "draft_temperature", "device"),
]


@pytest.mark.parametrize("change, name, expected", BAD)
def test_bad_draft_options_are_named(change, name, expected):
    args, kw = entry_args()
    kw.update({k: v.to(DEVICE) if v.device.type != "meta" else v for k, v in change.items()})
    with pytest.raises(SpecSamplerInputError, match=name) as info:
        RejectionSampler().forward_ragged_from_logits(*args, **kw)
    assert expected in str(info.value)


def test_draft_rows_need_a_draft_matrix_of_the_target_vocabulary():
    args, kw = entry_args()
    with pytest.raises(SpecSamplerInputError, match="draft_rows"):
        RejectionSampler().forward_ragged_from_logits(*args[:2], None, *args[3:], **kw)
    wide = torch.zeros(5, V + 1, device=DEVICE)
    with pytest.raises(SpecSamplerInputError, match="draft_logits") as info:
        RejectionSampler().forward_ragged_from_logits(*args[:2], wide, *args[3:], **kw)
    assert f"(N, {V})" in str(info.value)


def test_strict_mode_refuses_out_of_range_rows_and_bad_draft_temperature():
    args, kw = entry_args()
    rows = kw["draft_rows"].clone()
    rows[2] = args[2].shape[0]
    with pytest.raises(SpecSamplerInputError, match="draft_rows") as info:
        RejectionSampler(strict_mode=True).forward_ragged_from_logits(*args, **{**kw, "draft_rows": rows})
    assert f"[0, {args[2].shape[0]})" in str(info.value) and "at [2]" in str(info.value)
    bad_t = kw["draft_temperature"].clone()
    bad_t[1] = 0.0
    with pytest.raises(SpecSamplerInputError, match="draft_temperature") as info:
        RejectionSampler(strict_mode=True).forward_ragged_from_logits(*args, **{**kw, "draft_temperature": bad_t})
    assert "> 0" in str(info.value)


def test_draft_rows_need_temperature_and_a_sampler_that_reads_them():
    from spec_samplers import SamplingParams
    from spec_samplers.base import SpecDecodeStochasticBaseSampler

    args, kw = entry_args()
    with pytest.raises(SpecSamplerInputError, match="draft_rows") as info:
        RejectionSampler().forward_ragged_from_logits(
            *args, **{**kw, "temperature": None, "sampling_params": SamplingParams(temperature=0.8)}
        )
    assert "sampling_params" in str(info.value)

    class ThirdParty(SpecDecodeStochasticBaseSampler):
        reference_op = staticmethod(rejection_reference)

    with pytest.raises(SpecSamplerInputError, match="draft_rows") as info:
        ThirdParty().forward_ragged_from_logits(*args, **kw)
    assert "takes_draft_rows" in str(info.value)


def test_draft_options_cross_the_custom_op():
    """Meta tensors give the output's shape, and torch.compile (fullgraph) the eager tokens: both
    go through ``spec_samplers::verify`` with the two options."""
    T, B, N = 4, 3, 11
    i64 = dict(dtype=torch.int64)
    args = (
        torch.randn(T, V),
        torch.zeros(B, **i64),
        torch.randn(N, V),
        torch.randint(0, V, (T,)),
        torch.tensor([2, 2, 4]),
    )
    kw = dict(temperature=torch.tensor([0.5, 1.0, 0.0]), seeds=torch.arange(B), draft_rows=torch.randint(0, N, (T,)),
              draft_temperature=torch.tensor([1.5, 0.3, 1.0]))  # fmt: skip
    meta = [a.to("meta") for a in args]
    out = RejectionSampler().forward_ragged_from_logits(*meta, K, **{k: v.to("meta") for k, v in kw.items()})
    assert out.shape == (B, K + 1) and out.device.type == "meta"
    sampler = RejectionSampler(backend="torch")

    def call(*a, **k):
        return sampler.forward_ragged_from_logits(*a, K, **k)

    assert torch.equal(torch.compile(call, fullgraph=True, backend="eager")(*args, **kw), call(*args, **kw))


@pytest.mark.parametrize("method", list(OPS))
def test_ops_refuse_draft_rows_outside_the_ragged_logits_layout(method):
    """Only the ragged logits entry passes ``draft_rows``; a batch built by hand with them in the
    padded or probability layout is refused by name on both backends, never misread."""
    g = torch.Generator().manual_seed(4)
    probs = torch.rand(2, 3, 10, generator=g).to(DEVICE)
    ids = torch.zeros(2, 2, dtype=torch.int64, device=DEVICE)
    batch = VerifyBatch.padded(probs, ids[:, :1], probs[:, :2], ids, seeds=torch.arange(2, device=DEVICE),
                               draft_rows=torch.zeros(4, dtype=torch.int64, device=DEVICE))  # fmt: skip
    for op in OPS[method]:
        with pytest.raises(SpecSamplerInputError, match="draft_rows"):
            op(batch)
