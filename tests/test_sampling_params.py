"""SamplingParams validation and process_logits against a row-by-row reference written here."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from params_reference import reference_row

from spec_samplers import SamplingParams, SpecSamplerInputError
from spec_samplers.sampling_params import process_logits, sampling_tensors


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.1),
        ("temperature", math.inf),
        ("temperature", math.nan),
        ("temperature", "1"),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", -1.0),
        ("top_p", None),
        ("top_k", -2),
        ("top_k", 2.0),
        ("top_k", True),
        ("min_p", -0.01),
        ("min_p", 1.01),
        ("seed", 1.5),
        ("seed", 2**64),
        ("seed", -(2**63) - 1),
        ("seed", True),
    ],
)
def test_invalid_fields_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field}: expected .*, got ") as info:
        SamplingParams(**{field: value})
    assert isinstance(info.value, SpecSamplerInputError)


def test_valid_fields_and_greedy_reset():
    assert SamplingParams() == SamplingParams(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None)
    for field, value in [
        ("top_k", -1),
        ("top_k", 0),
        ("top_k", 1),
        ("top_p", 1.0),
        ("min_p", 0.0),
        ("min_p", 1.0),
        ("temperature", 0),
        ("temperature", 5.0),
        ("seed", 0),
        ("seed", 2**64 - 1),
        ("seed", -(2**63)),
    ]:
        assert getattr(SamplingParams(**{field: value}), field) == value
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2)
    assert greedy.is_greedy and (greedy.top_p, greedy.top_k, greedy.min_p) == (1.0, 0, 0.0)  # as vLLM
    assert SamplingParams(temperature=1e-6).is_greedy and not SamplingParams(temperature=1e-4).is_greedy
    assert SamplingParams(seed=2**64 - 1).seed_int64 == -1
    duck = SimpleNamespace(temperature=0.8, top_p=0.95, top_k=-1, min_p=0.0, seed=7)  # e.g. vllm.SamplingParams
    assert SamplingParams.from_any(duck) == SamplingParams(temperature=0.8, top_p=0.95, top_k=-1, seed=7)


def test_process_logits_matches_the_row_reference():
    gen = torch.Generator().manual_seed(0)
    V = 40
    params = [
        SamplingParams(),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.5, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(min_p=0.1),
        SamplingParams(top_k=50),
        SamplingParams(temperature=0.8, top_p=0.95, top_k=20, min_p=0.05),
        SamplingParams(top_k=1),
        SamplingParams(top_p=0.01),
        SamplingParams(temperature=2.0, min_p=1.0),
    ]
    logits = torch.randn(len(params), V, generator=gen) * 3
    logits[3, :5] = -math.inf  # masked tokens
    out = process_logits(logits, params)
    assert out.dtype == torch.float32 and out.shape == logits.shape
    for n, p in enumerate(params):
        assert torch.allclose(out[n].double(), reference_row(logits[n], p), atol=1e-6), f"row {n}: {p}"
    assert torch.allclose(out.sum(-1), torch.ones(len(params)))


def test_ties_at_the_thresholds_are_kept_and_order_is_vllms():
    logits = torch.log(torch.tensor([[0.3, 0.2, 0.2, 0.2, 0.1]]))
    assert (process_logits(logits, SamplingParams(top_k=2))[0] > 0).tolist() == [True, True, True, True, False]
    # mass before 0.2 is 0.3 < 0.4: every token at 0.2 is kept, not one of them
    assert (process_logits(logits, SamplingParams(top_p=0.4))[0] > 0).tolist() == [True, True, True, True, False]
    # min-p before top-k: 0.5 * 0.3 drops 0.1; then top-k=4 keeps 4 of the rest
    probs = process_logits(logits, SamplingParams(min_p=0.5, top_k=4))[0]
    assert torch.allclose(probs, torch.tensor([0.3, 0.2, 0.2, 0.2, 0.0]) / 0.9)
    # top-k before top-p: after top-k=1 the single token has all the mass
    assert process_logits(logits, SamplingParams(top_k=1, top_p=0.5))[0].tolist() == [1.0, 0, 0, 0, 0]
    # greedy ties go to the lowest index
    assert process_logits(torch.tensor([[1.0, 3.0, 3.0]]), SamplingParams(temperature=0))[0].tolist() == [0, 1, 0]


def test_per_row_tensors_and_errors():
    logits = torch.randn(6, 9)
    tensors = sampling_tensors([SamplingParams(top_k=3), SamplingParams(temperature=0)], 2, "cpu")
    as_tensors = process_logits(logits.view(2, 3, 9).reshape(6, 9), tensors.repeat_rows(3))
    as_list = process_logits(logits, [SamplingParams(top_k=3)] * 3 + [SamplingParams(temperature=0)] * 3)
    assert torch.equal(as_tensors, as_list)
    assert torch.equal(
        process_logits(logits.half(), SamplingParams(temperature=0)),
        torch.nn.functional.one_hot(logits.half().argmax(-1), 9).float(),
    )
    assert process_logits(torch.empty(0, 9), None).shape == (0, 9)
    with pytest.raises(ValueError, match="logits: expected a 2-d tensor"):
        process_logits(torch.randn(2, 3, 4), None)
    with pytest.raises(ValueError, match="sampling_params: expected one SamplingParams or a list of 6"):
        process_logits(logits, [SamplingParams()] * 5)
    with pytest.raises(ValueError, match="sampling_params: expected parameters for 6 rows"):
        process_logits(logits, tensors)
    with pytest.raises(ValueError, match="logits: expected a floating-point tensor"):
        process_logits(torch.ones(2, 3, dtype=torch.int64), None)
