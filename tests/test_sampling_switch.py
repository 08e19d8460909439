"""What code written for ``flashinfer.sampling`` relies on when it switches to
``spec_samplers.sampling`` by import: FlashInfer's error sentences inside ours (our message still
names the argument, what it expected and what it got), per-request parameter tensors of every
real dtype read as FlashInfer reads them (``.float()`` for top_p / min_p / temperature, ``.int()``
for top_k), and rows without mass (NaN rows) answered with token -1 and valid False."""

from __future__ import annotations

import re

import pytest
import torch

import spec_samplers.sampling as sampling
from spec_samplers.constants import SpecSamplerInputError

B, V = 5, 40

#: every operation that takes a per-request parameter tensor: (name, how to call it with that tensor)
PARAM_CALLS = {
    "top_p": [
        lambda p, t: sampling.top_p_sampling_from_probs(p, t),
        lambda p, t: sampling.top_p_renorm_probs(p, t),
        lambda p, t: sampling.top_k_top_p_sampling_from_probs(p, 3, t),
    ],
    "top_k": [
        lambda p, t: sampling.top_k_sampling_from_probs(p, t),
        lambda p, t: sampling.top_k_renorm_probs(p, t),
        lambda p, t: sampling.top_k_mask_logits(p.log(), t),
        lambda p, t: sampling.top_k_top_p_sampling_from_logits(p.log(), t, 0.9),
    ],
    "min_p": [lambda p, t: sampling.min_p_sampling_from_probs(p, t)],
    "temperature": [lambda p, t: sampling.softmax(p.log(), temperature=t)],
}
CASES = [(name, i) for name, calls in PARAM_CALLS.items() for i in range(len(calls))]


def _probs(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(B, V, generator=g) * 2, -1)


@pytest.mark.parametrize(
    ("shape", "sentence"),
    [
        ((B, V), "Expected a 1D tensor or scalar for the sampling parameter, but got a 2D tensor."),
        ((B, 2, 2), "Expected a 1D tensor or scalar for the sampling parameter, but got a 3D tensor."),
        (
            (),
            "Expected a 1D tensor of shape (batch_size,) or scalar for the sampling parameter, "
            "but got a 0-dimensional tensor.",
        ),
        (
            (1,),
            f"Sampling parameter tensor batch size mismatch: expected length {B} to match the reference tensor "
            "batch size, but got length 1.",
        ),
    ],
)
@pytest.mark.parametrize(("name", "index"), CASES)
def test_shape_errors_name_the_argument_and_end_with_flashinfers_sentence(name, index, shape, sentence):
    value = torch.full(shape, 3 if name == "top_k" else 0.5, dtype=torch.int32 if name == "top_k" else torch.float32)
    with pytest.raises(SpecSamplerInputError) as exc:
        PARAM_CALLS[name][index](_probs(), value)
    message = str(exc.value)
    assert isinstance(exc.value, ValueError)  # what FlashInfer raises, so `except ValueError` still works
    assert message.startswith(f"{name}: expected a scalar or a tensor of shape ({B},)")
    assert f"got shape {tuple(shape)}" in message
    assert message.endswith(f"(FlashInfer: {sentence})")


def test_flashinfer_style_patterns_match_our_messages():
    """The patterns a FlashInfer user's tests match (regex over the message) find our errors."""
    probs = _probs()
    with pytest.raises(ValueError, match=r"Expected a 1D tensor or scalar.*got a 2D tensor"):
        sampling.min_p_sampling_from_probs(probs, torch.full((B, V), 0.1))
    with pytest.raises(ValueError, match=r"Expected a 1D tensor of shape \(batch_size,\) or scalar.*0-dimensional"):
        sampling.top_k_renorm_probs(probs, torch.tensor(3))
    with pytest.raises(ValueError, match="Sampling parameter.*batch size mismatch"):
        sampling.top_p_renorm_probs(probs, torch.tensor([1], dtype=torch.int32))


INT_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", INT_DTYPES + FLOAT_DTYPES)
@pytest.mark.parametrize(("name", "index"), [c for c in CASES if c[0] != "top_k"])
def test_float_parameters_accept_every_real_dtype_as_its_float_value(name, index, dtype):
    """top_p / min_p / temperature tensors of any real dtype mean their value as float32
    (FlashInfer: ``.float()``): same output as the float32 tensor, same seeds."""
    values = {"top_p": [1, 0.5, 1, 0.25, 1], "min_p": [0, 0.5, 1, 0, 0.25], "temperature": [1, 0.5, 2, 1, 0]}[name]
    if dtype in INT_DTYPES:
        values = [float(int(v)) for v in values]  # what an integer tensor can hold
    given = torch.tensor(values).to(dtype)
    reference = given.to(torch.float32)
    call = PARAM_CALLS[name][index]
    torch.manual_seed(3)
    ours = call(_probs(1), given)
    torch.manual_seed(3)
    expected = call(_probs(1), reference)
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("dtype", INT_DTYPES + FLOAT_DTYPES)
@pytest.mark.parametrize("index", range(len(PARAM_CALLS["top_k"])))
def test_top_k_accepts_every_real_dtype_truncated_toward_zero(index, dtype):
    """top_k tensors mean ``.int()`` of their values: 2.9 keeps 2 tokens, booleans keep 1 token or
    all (0 disables), NaN keeps all."""
    values = [2.9, 1.0, 0.0, 7.5, 1.2] if dtype in FLOAT_DTYPES else [2, 1, 0, 7, 1]
    if dtype == torch.bool:
        values = [1, 0, 1, 1, 0]
    given = torch.tensor(values).to(dtype)
    truncated = torch.tensor(values).to(dtype).to(torch.float64).trunc().to(torch.int64)
    call = PARAM_CALLS["top_k"][index]
    torch.manual_seed(5)
    ours = call(_probs(2), given)
    torch.manual_seed(5)
    expected = call(_probs(2), truncated)
    assert torch.equal(ours, expected)


def test_top_k_nan_and_infinite_values_keep_every_token():
    probs = _probs(3)
    given = torch.tensor([float("nan"), float("inf"), float("-inf"), -3.0, 1e30])
    renorm = sampling.top_k_renorm_probs(probs, given)
    assert torch.allclose(renorm, probs / probs.sum(-1, keepdim=True), atol=1e-6)


def test_complex_parameter_tensors_are_refused_by_name():
    with pytest.raises(SpecSamplerInputError, match=r"^top_p: expected a real dtype"):
        sampling.top_p_renorm_probs(_probs(), torch.full((B,), 0.5 + 0j))


@pytest.mark.parametrize(
    "op",
    [
        lambda p: sampling.sampling_from_probs(p, return_valid=True),
        lambda p: sampling.top_k_sampling_from_probs(p, top_k=5, return_valid=True),
        lambda p: sampling.top_p_sampling_from_probs(p, top_p=0.9, return_valid=True),
        lambda p: sampling.min_p_sampling_from_probs(p, min_p=0.1, return_valid=True),
        lambda p: sampling.top_k_top_p_sampling_from_probs(
            p, top_k=5, top_p=0.9, filter_apply_order="joint", return_valid=True
        ),
    ],
)
def test_nan_rows_give_minus_one_and_invalid(op):
    """A row of NaN has no mass: token -1 (FlashInfer gives 0, a real token) and valid False (as
    FlashInfer); the other rows are valid tokens."""
    probs = _probs(4)
    nan_rows = [0, 2, B - 1]
    probs[nan_rows] = float("nan")
    tokens, valid = op(probs)
    for row in range(B):
        if row in nan_rows:
            assert tokens[row] == -1 and not valid[row]
        else:
            assert valid[row] and 0 <= tokens[row] < V


def test_the_nan_behaviour_is_documented_next_to_check_nan():
    doc = sampling.sampling_from_probs.__doc__ or ""
    assert "check_nan" in doc and re.search(r"-1 with valid False", " ".join(doc.split()))
