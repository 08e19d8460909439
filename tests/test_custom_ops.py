"""The ``spec_samplers::*`` custom ops: torch.compile traces samplers and sampling operations into
one graph (fullgraph) with the eager tokens, and meta tensors give the output shapes."""

from __future__ import annotations

import copy

import pytest
import torch

import spec_samplers.sampling as sampling
from spec_samplers import RejectionSampler, SamplingParams, TypicalAcceptanceSampler, custom_ops
from spec_samplers.constants import SpecSamplerInputError

B, K, V = 3, 2, 40


def step_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return dict(
        target_logits=torch.randn(B, K + 1, V, generator=g),
        draft_logits=torch.randn(B, K, V, generator=g),
        draft_ids=torch.randint(0, V, (B, K), generator=g),
        bonus=torch.randint(0, V, (B, 1), generator=g),
        seeds=torch.arange(B, dtype=torch.int64) + 11,
        offsets=torch.full((B,), 3, dtype=torch.int64),
        temperature=torch.tensor([0.8, 0.0, 1.2]),
    )


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def test_compiled_step_gives_the_eager_tokens():
    """A decoding step calling a stochastic sampler and three sampling operations compiles to
    one graph (fullgraph: no break) and emits exactly the eager tokens."""
    sampler = RejectionSampler(backend="torch")

    def step(target_logits, draft_logits, draft_ids, bonus, seeds, offsets, temperature):
        out = sampler.forward_from_logits(
            target_logits, bonus, draft_logits, draft_ids, temperature, seeds=seeds, offsets=offsets
        )
        last = target_logits[:, -1]
        nxt = sampling.top_k_top_p_sampling_from_logits(last, 5, 0.9, seed=seeds, offset=offsets)
        probs = sampling.softmax(last, temperature=temperature)
        tokens, valid = sampling.top_p_sampling_from_probs(probs, 0.8, seed=seeds, offset=offsets, return_valid=True)
        return out, nxt, probs, tokens, valid

    for seed in range(3):
        inputs = step_inputs(seed)
        eager = step(**inputs)
        traced = compiled(step)(**inputs)
        for name, a, b in zip(("verify", "top_k_top_p", "softmax", "top_p", "valid"), eager, traced):
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert torch.equal(a, b), name
    # both calls counted: the compiled graph calls the very instance it traced
    assert sampler.num_draft_tokens == 2 * 3 * B * K


def test_compiled_ragged_deterministic_sampler():
    sampler = TypicalAcceptanceSampler(backend="torch")
    cu = torch.tensor([1, 1, 3])
    g = torch.Generator().manual_seed(5)
    args = (torch.softmax(torch.randn(3, V, generator=g), -1), torch.tensor([4, 5, 6]), None)
    ids = torch.randint(0, V, (3,), generator=g)

    def verify(target, bonus, draft, ids, cu):
        return sampler.forward_ragged(target, bonus, draft, ids, cu, 2)

    assert torch.equal(verify(*args, ids, cu), compiled(verify)(*args, ids, cu))


def test_copied_sampler_is_its_own_instance():
    sampler = RejectionSampler(backend="torch")
    twin = copy.deepcopy(sampler)
    assert twin._op_handle != sampler._op_handle
    inputs = step_inputs()
    args = (inputs["target_logits"], inputs["bonus"], inputs["draft_logits"], inputs["draft_ids"])
    compiled(lambda *a: twin.forward_from_logits(*a, inputs["temperature"], seeds=inputs["seeds"]))(*args)
    assert twin.num_draft_tokens == B * K and sampler.num_draft_tokens == 0


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("sampler", [RejectionSampler(), TypicalAcceptanceSampler()], ids=type)
def test_meta_shapes_of_the_sampler_entries(sampler):
    ids = dict(dtype=torch.int64)
    padded = sampler.forward(meta(4, 6, V), meta(4, 1, **ids), meta(4, 5, V), meta(4, 5, **ids))
    ragged = sampler.forward_ragged(meta(9, V), meta(4, **ids), None, meta(9, **ids), meta(4, **ids), 7)
    logits = sampler.forward_from_logits(meta(4, 6, V), meta(4, 1, **ids), None, meta(4, 5, **ids), meta(4))
    ragged_logits = sampler.forward_ragged_from_logits(
        meta(9, V), meta(4, **ids), meta(9, V), meta(9, **ids), meta(4, **ids), 3, meta(4)
    )
    for out, shape in ((padded, (4, 6)), (ragged, (4, 8)), (logits, (4, 6)), (ragged_logits, (4, 4))):
        assert out.device.type == "meta" and out.dtype == torch.int64 and tuple(out.shape) == shape
    assert sampler.num_draft_tokens == 0  # shapes only: nothing counted


def test_meta_shapes_of_the_sampling_operations():
    ids = meta(7, dtype=torch.int32)
    tokens, valid = sampling.top_k_top_p_sampling_from_probs(meta(5, V), 3, 0.9, indices=ids, return_valid=True)
    assert (tokens.shape, tokens.dtype, valid.shape, valid.dtype) == ((7,), torch.int32, (7,), torch.bool)
    assert sampling.sampling_from_logits(meta(5, V)).shape == (5,)
    assert sampling.min_p_sampling_from_probs(meta(5, V), 0.1).dtype == torch.int32
    assert sampling.softmax(meta(5, V, dtype=torch.bfloat16)).dtype == torch.float32
    assert sampling.top_k_renorm_probs(meta(5, V, dtype=torch.float16), 3).dtype == torch.float16
    assert sampling.top_p_renorm_probs(meta(5, V, dtype=torch.float16), 0.5).dtype == torch.float32
    masked = sampling.top_k_mask_logits(meta(5, V, dtype=torch.bfloat16), 3)
    assert (masked.shape, masked.dtype) == ((5, V), torch.bfloat16)


def test_meta_calls_keep_the_argument_checks():
    ids = dict(dtype=torch.int64)
    with pytest.raises(SpecSamplerInputError, match="draft_token_ids"):
        RejectionSampler().forward(meta(4, 6, V), meta(4, 1, **ids), None, meta(4, 4, **ids))
    with pytest.raises(SpecSamplerInputError, match="probs"):
        sampling.sampling_from_probs(meta(5, V, dtype=torch.int64))


def test_what_cannot_cross_an_op_is_refused_by_name():
    """Generators and SamplingParams cannot be op arguments: the error names what to pass."""
    ids = dict(dtype=torch.int64)
    args = (meta(2, 3, V), meta(2, 1, **ids), None, meta(2, 2, **ids))
    with pytest.raises(SpecSamplerInputError, match=r"seeded_seqs: .*seeds="):
        RejectionSampler().forward(*args, {0: torch.Generator()})
    with pytest.raises(SpecSamplerInputError, match=r"sampling_params: .*temperature="):
        RejectionSampler().forward_from_logits(*args, sampling_params=SamplingParams(temperature=0.5))


def test_eager_calls_do_not_go_through_the_dispatcher(monkeypatch):
    """Outside tracing the operations run their code directly (no dispatcher hop)."""

    def refuse(*args, **kwargs):
        raise AssertionError("an eager call went through the custom op")

    monkeypatch.setattr(custom_ops, "sample", refuse)
    monkeypatch.setattr(custom_ops, "verify", refuse)
    inputs = step_inputs()
    sampling.sampling_from_logits(inputs["target_logits"][:, 0], seed=1, offset=0)
    RejectionSampler().forward_from_logits(
        inputs["target_logits"], inputs["bonus"], None, inputs["draft_ids"], inputs["temperature"]
    )
