"""The ragged logits entry with the drafts' law as probabilities (``draft_probs=``, optionally
indexed by ``draft_rows``): target logits, draft probabilities read as given. The kernels against
the reference token for token, the reference against the logits path whose softmax they are, the
statistics of the output law, and what bad inputs do."""

import pytest
import torch
from conftest import DEVICE, KERNEL_BACKEND, small_split
from test_draft_rows import COUNTS, DRAFT_TEMPERATURE, OPS, K, V, make_batch, positional

from spec_samplers import BlockVerificationSampler, RejectionSampler, SpecSamplerInputError
from spec_samplers.layout import VerifyBatch
from spec_samplers.torch_ops import probs_from_logits


def as_probs(batch: VerifyBatch, dtype: torch.dtype = torch.float32) -> VerifyBatch:
    """The same batch with its indexed draft logits replaced by probabilities: each row of the
    [N, V] matrix at the draft temperature of the request that reads it (with unique rows,
    "permuted", exactly the law the logits path verifies against; a row read by two requests
    gets one of their temperatures)."""
    counts = torch.tensor(COUNTS, device=DEVICE)
    req_of_token = torch.repeat_interleave(torch.arange(len(COUNTS), device=DEVICE), counts)
    row_t = torch.ones(batch.draft.shape[0], device=DEVICE)
    row_t[batch.draft_rows.long()] = torch.as_tensor(DRAFT_TEMPERATURE, device=DEVICE)[req_of_token]
    probs = probs_from_logits(batch.draft.float(), row_t).to(dtype)
    fields = {f: getattr(batch, f) for f in ("seeds", "offsets", "temperature", "draft_rows")}
    L = batch.layout
    args = (batch.target, batch.bonus_token_ids, probs, batch.draft_token_ids, L.cu_num_draft_tokens, K)
    return VerifyBatch.ragged(*args, draft_is_probs=True, **fields)


@pytest.mark.parametrize("method", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_match_reference_with_draft_probabilities(method, dtype):
    reference, kernel = OPS[method]
    for seed in range(3):
        batch, _ = make_batch(torch.float32, "permuted" if seed else "repeated", seed)
        probs_batch = as_probs(batch, dtype)
        expected = reference(probs_batch)
        assert torch.equal(kernel(probs_batch, split=small_split(V, probs_batch.layout.batch_size)), expected)
        assert torch.equal(kernel(probs_batch), expected)


@pytest.mark.parametrize("method", list(OPS))
def test_draft_probabilities_are_the_draft_logits_law(method):
    """Probabilities equal to the rule's softmax of the draft logits give the logits path's tokens
    (reference: the same probabilities, bit for bit)."""
    reference, _ = OPS[method]
    for seed in range(4):
        batch, _ = make_batch(torch.float32, "permuted", 20 + seed)
        assert torch.equal(reference(as_probs(batch)), reference(batch))


def test_output_law_with_draft_probabilities_is_the_target():
    """One draft per request: the first token's law is softmax(target / T) whatever q is
    (chi-square, alpha = 1e-4 per run, fixed seeds; 3 vocabulary entries). On the reference:
    the kernels give its tokens (tests above)."""
    from scipy.stats import chisquare

    n = 2000
    logits = torch.tensor([[1.0, 0.2, -0.5]], device=DEVICE).expand(n, 3).contiguous()
    q = torch.tensor([[0.1, 0.3, 0.6]], device=DEVICE).expand(n, 3).contiguous()
    gen = torch.Generator().manual_seed(5)
    ids = torch.multinomial(q[:1].cpu(), n, replacement=True, generator=gen).view(n).to(DEVICE)
    cu = torch.arange(1, n + 1, device=DEVICE)
    temperature = torch.full((n,), 0.8, device=DEVICE)
    out = RejectionSampler(backend="torch").forward_ragged_from_logits(
        logits, torch.zeros(n, dtype=torch.int64, device=DEVICE), None, ids, cu, 1,
        temperature=temperature, seeds=torch.arange(n, device=DEVICE), draft_probs=q,
    )  # fmt: skip
    first = torch.bincount(out[:, 0].cpu(), minlength=3).double()
    law = torch.softmax(logits[0].cpu().double() / 0.8, -1)
    assert chisquare(first.numpy(), (law * n).numpy()).pvalue > 1e-4


@pytest.mark.parametrize("cls", [RejectionSampler, BlockVerificationSampler])
def test_entry_takes_draft_probs_on_both_backends(cls):
    batch, _ = make_batch(torch.float32, "strided", 8)
    probs_batch = as_probs(batch, torch.bfloat16)
    args = list(positional(batch))
    args[2] = None  # no draft logits
    kw = dict(temperature=batch.temperature, seeds=batch.seeds, offsets=batch.offsets, draft_rows=batch.draft_rows)
    a = cls(backend="torch").forward_ragged_from_logits(*args, **kw, draft_probs=probs_batch.draft)
    b = cls(backend=KERNEL_BACKEND).forward_ragged_from_logits(*args, **kw, draft_probs=probs_batch.draft)
    method = "block" if cls is BlockVerificationSampler else "rejection"
    assert torch.equal(a, b) and torch.equal(a, OPS[method][0](probs_batch))


@pytest.mark.parametrize(
    "change, name",
    [
        (dict(draft_logits="same"), "draft_probs"),  # both laws given
        (dict(draft_temperature=torch.ones(len(COUNTS))), "draft_temperature"),  # probabilities have no T
        (dict(sampling_params="params"), "draft_probs"),
    ],
)
def test_bad_draft_probs_options_are_named(change, name):
    from spec_samplers import SamplingParams

    batch, _ = make_batch(torch.float32, "permuted", 3)
    args = list(positional(batch))
    probs = as_probs(batch).draft
    kw = dict(temperature=batch.temperature, seeds=batch.seeds, draft_rows=batch.draft_rows, draft_probs=probs)
    args[2] = None
    if change.get("draft_logits") == "same":
        args[2] = batch.draft
    elif "sampling_params" in change:
        del kw["temperature"], kw["draft_rows"]  # (draft_rows alone would be refused first)
        args[2] = None
        kw["draft_probs"] = probs[batch.draft_rows.long()]
        kw["sampling_params"] = SamplingParams(temperature=0.7)
    else:
        kw.update({k: v.to(DEVICE) for k, v in change.items()})
    with pytest.raises(SpecSamplerInputError, match=name):
        RejectionSampler(backend="torch").forward_ragged_from_logits(*args, **kw)


def test_bad_draft_probabilities_give_valid_tokens_and_strict_mode_names_them():
    """NaN, negative and infinite draft probabilities: a valid output without strict mode (never a
    token the target gives probability 0), the argument named with check_values."""
    batch, _ = make_batch(torch.float32, "permuted", 6)
    probs = as_probs(batch).draft.clone()
    probs[0, :7] = float("nan")
    probs[1, 3] = -1.0
    probs[2, 5] = float("inf")
    args = list(positional(batch))
    args[2] = None
    kw = dict(temperature=batch.temperature, seeds=batch.seeds, draft_rows=batch.draft_rows, draft_probs=probs)
    outs = [cls(backend=b).forward_ragged_from_logits(*args, **kw)
            for cls in (RejectionSampler, BlockVerificationSampler) for b in ("torch", KERNEL_BACKEND)]  # fmt: skip
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[2], outs[3])
    for out in outs:
        assert ((out >= -1) & (out < V)).all()
    with pytest.raises(SpecSamplerInputError, match="draft_probs"):
        RejectionSampler(backend="torch", check_values=True).forward_ragged_from_logits(*args, **kw)


def test_draft_probs_cross_the_custom_op():
    """Meta tensors give the output's shape, and torch.compile (fullgraph) the eager tokens."""
    T, B, N = 4, 3, 11
    args = (
        torch.randn(T, V),
        torch.zeros(B, dtype=torch.int64),
        None,
        torch.randint(0, V, (T,)),
        torch.tensor([2, 2, 4]),
    )
    probs = torch.rand(N, V).softmax(-1)
    kw = dict(temperature=torch.tensor([0.5, 1.0, 0.0]), seeds=torch.arange(B), draft_rows=torch.randint(0, N, (T,)),
              draft_probs=probs)  # fmt: skip
    meta = [None if a is None else a.to("meta") for a in args]
    out = RejectionSampler().forward_ragged_from_logits(*meta, K, **{k: v.to("meta") for k, v in kw.items()})
    assert out.shape == (B, K + 1) and out.device.type == "meta"
    sampler = RejectionSampler(backend="torch")

    def call(*a, **k):
        return sampler.forward_ragged_from_logits(*a, K, **k)

    assert torch.equal(torch.compile(call, fullgraph=True, backend="eager")(*args, **kw), call(*args, **kw))


def test_strided_expanded_and_low_precision_draft_probs_read_as_their_contiguous_copy():
    """``draft_probs`` as a strided view (every other row of a wider matrix), expanded (one row,
    row stride 0) and in bf16: the tokens of its contiguous fp32-equal copy, on both backends."""
    batch, _ = make_batch(torch.float32, "permuted", 12)
    probs = as_probs(batch).draft  # [N, V]
    wide = torch.zeros(2 * probs.shape[0], V + 5, device=DEVICE)
    wide[::2, :V] = probs
    strided = wide[::2, :V]
    expanded = probs[:1].expand(probs.shape[0], V)
    assert strided.stride() == (2 * (V + 5), 1) and expanded.stride(0) == 0
    args = list(positional(batch))
    args[2] = None
    kw = dict(temperature=batch.temperature, seeds=batch.seeds, offsets=batch.offsets, draft_rows=batch.draft_rows)
    for backend in ("torch", KERNEL_BACKEND):
        sampler = RejectionSampler(backend=backend)
        for view in (strided, expanded, probs.to(torch.bfloat16)):
            out = sampler.forward_ragged_from_logits(*args, **kw, draft_probs=view)
            expected = sampler.forward_ragged_from_logits(*args, **kw, draft_probs=view.float().contiguous())
            assert torch.equal(out, expected)
