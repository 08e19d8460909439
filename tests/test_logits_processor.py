"""spec_samplers.logits_processor: FlashInfer's LogitsPipe (the seed's examples as written),
compilation (legalize, type-check, validity checks, fusion), invalid pipelines and parameters,
fused == unfused, and LogitsPipe.verify (process then verify in one call).

Statistical check: chi-square at CHI2_ALPHA = 1e-3 (false-failure rate at a random seed; the
seeds are fixed, so the test is deterministic)."""

from __future__ import annotations

from typing import Any, List  # noqa: UP035 (the seed's examples, as written)

import pytest
import torch
from stats_helpers import CHI2_ALPHA, chi2_pvalue

from spec_samplers import RejectionSampler, SamplingParams, SpecSamplerInputError, TypicalAcceptanceSampler, get_sampler
from spec_samplers.logits_processor import (
    CompileError,
    FusedProbsTopKTopPSampleOp,
    FusedTemperatureSoftmaxOp,
    FusionRule,
    LogitsPipe,
    LogitsProcessor,
    LogitsSampleOp,
    LogitsTopKOp,
    MinP,
    Op,
    ProbsSampleOp,
    Sample,
    Softmax,
    SoftmaxOp,
    TaggedTensor,
    Temperature,
    TemperatureOp,
    TensorType,
    TopK,
    TopP,
)
from spec_samplers.logits_processor.compiler import pattern_matches
from spec_samplers.sampling_params import process_logits

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# -- the seed's examples, as written (device="cuda" where there is one) ---------------------------


def test_seed_pipeline_example():
    pipe = LogitsPipe(
        [
            Temperature(),  # Scale logits by temperature
            Softmax(),  # Convert logits to probabilities
            TopP(),  # Apply top-p filtering
            Sample(),  # Sample from the distribution
        ]
    )
    batch_size = 4
    vocab_size = 5
    logits = torch.randn(batch_size, vocab_size, device=DEVICE)
    output_ids = pipe(logits, temperature=0.7, top_p=0.9)
    assert output_ids.shape == (batch_size,) and not output_ids.is_floating_point()
    assert bool(((output_ids >= 0) & (output_ids < vocab_size)).all())
    assert [type(op) for op in pipe.ops] == [FusedTemperatureSoftmaxOp, type(pipe.ops[1])]


class CustomLogitsProcessor(LogitsProcessor):
    def __init__(self, **params: Any):
        super().__init__(**params)

    def legalize(self, input_type: TensorType) -> List["Op"]:  # noqa: UP006, UP037
        return [CustomOp(**self.params)]


class CustomOp(Op):
    # Define the input and output tensor types
    IN = TensorType.LOGITS
    OUT = TensorType.LOGITS

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        pass


def test_seed_custom_processor_compiles_to_custom_op():
    pipe = LogitsPipe([CustomLogitsProcessor()])  # The pipe will be compiled into [CustomOp]
    assert [type(op) for op in pipe.ops] == [CustomOp]
    assert pipe.initial_type == TensorType.LOGITS and pipe.ops[0].processor is CustomLogitsProcessor


def custom_fusion_guard(window: List[Op]) -> bool:  # noqa: UP006
    # Whether the fusion should be applied
    return True


def build_custom_fusion(window: List[Op]) -> Op:  # noqa: UP006
    # Create a fused operator by setting the parameters etc.
    return CustomOp()


def test_seed_custom_fusion_rule():
    custom_rule = FusionRule(
        pattern=(Temperature, Softmax), guard=custom_fusion_guard, build=build_custom_fusion, prio=20
    )
    pipe = LogitsPipe(
        [Temperature(), Softmax(), Sample()], custom_fusion_rules=[custom_rule]
    )  # The compiled ops in the pipeline will be [CustomOp, Sample]
    assert [type(op) for op in pipe.ops] == [CustomOp, ProbsSampleOp]
    assert pattern_matches(pipe.ops[1:], (Sample,))  # the second op is Sample's
    assert [type(op) for op in pipe.ops[0].fused_from] == [TemperatureOp, SoftmaxOp]
    # the same rule written with op classes; a lower priority than the built-in one loses
    by_ops = custom_rule._replace(pattern=(TemperatureOp, SoftmaxOp))
    assert [type(op) for op in LogitsPipe([Temperature(), Softmax(), Sample()], custom_fusion_rules=[by_ops]).ops] == [
        CustomOp,
        ProbsSampleOp,
    ]
    low = custom_rule._replace(prio=1)
    assert (
        type(LogitsPipe([Temperature(), Softmax(), Sample()], custom_fusion_rules=[low]).ops[0])
        is FusedTemperatureSoftmaxOp
    )


# -- compilation --------------------------------------------------------------------------------


def test_compile_false_keeps_the_legalized_ops_and_compile_later():
    pipe = LogitsPipe([Temperature(), Softmax(), TopK(), TopP(), Sample()], compile=False)
    assert pipe.compiled_ops is None
    assert [type(op).__name__ for op in pipe.ops] == [
        "TemperatureOp",
        "SoftmaxOp",
        "ProbsTopKOp",
        "TopPOp",
        "ProbsSampleOp",
    ]
    pipe.compile()
    assert [type(op) for op in pipe.ops] == [FusedTemperatureSoftmaxOp, FusedProbsTopKTopPSampleOp]
    assert pipe.compiled_ops == pipe.ops and len(pipe.legalized_ops) == 5
    assert "compiled_ops=[FusedTemperatureSoftmaxOp -> FusedProbsTopKTopPSampleOp]" in repr(pipe)


def test_input_type_inference_and_topk_legalization():
    assert LogitsPipe([TopP()]).initial_type == TensorType.PROBS
    assert [type(op) for op in LogitsPipe([TopK()], input_type=TensorType.LOGITS).ops] == [LogitsTopKOp]
    assert [type(op) for op in LogitsPipe([Sample()], input_type=TensorType.LOGITS).ops] == [LogitsSampleOp]
    masked = LogitsPipe([TopK()], input_type=TensorType.LOGITS)(
        torch.tensor([[0.1940, 2.1614], [-0.1721, 0.8491]]), top_k=1
    )
    assert torch.equal(torch.isinf(masked), torch.tensor([[True, False], [True, False]]))
    probs = LogitsPipe([TopK()], input_type=TensorType.PROBS)(torch.tensor([[0.2, 0.8], [0.7, 0.3]]), top_k=1)
    assert torch.equal(probs, torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    scaled = LogitsPipe([Temperature()])(torch.tensor([[0.1940, 2.1614]]), temperature=0.8)
    assert torch.allclose(scaled, torch.tensor([[0.2425, 2.7017]]), atol=1e-4)


@pytest.mark.parametrize(
    "processors, kwargs, message",
    [
        ([], {}, "the pipeline is empty"),
        (
            [Softmax(), Temperature()],
            {},
            r"processor 1 \(Temperature\) cannot take PROBS \(the output of processor 0 \(Softmax\)\)",
        ),
        (
            [Temperature(), Softmax(), Sample(), TopK()],
            {},
            r"nothing may follow processor 2 \(Sample\), which outputs INDICES",
        ),
        ([Softmax(), Sample(), Softmax()], {}, "nothing may follow"),
        ([Sample(), TopK()], {"input_type": TensorType.PROBS}, "nothing may follow"),
        ([Softmax(), Softmax()], {}, r"processor 1 \(Softmax\) cannot take PROBS"),
        ([TopK(), Sample()], {}, "cannot infer the input type: TopK accepts both LOGITS and PROBS"),
        ([TopP()], {"input_type": TensorType.LOGITS}, r"processor 0 \(TopP\) cannot take LOGITS"),
        ([Temperature(), "softmax"], {}, "processor 1 must be a LogitsProcessor"),
        ([Softmax()], {"input_type": TensorType.INDICES}, "input_type must be TensorType.LOGITS or TensorType.PROBS"),
    ],
)
def test_invalid_pipelines_raise_value_error_saying_what_is_wrong(processors, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LogitsPipe(processors, **kwargs)


def test_custom_validity_checks_and_bad_rules():
    def no_topk(ops: list[Op]) -> None:
        if any(op.processor is TopK for op in ops):
            raise CompileError("no top-k here")

    LogitsPipe([Softmax(), TopP()], custom_validity_checks=[no_topk])
    with pytest.raises(ValueError, match="no top-k here"):
        LogitsPipe([Softmax(), TopK(), TopP()], custom_validity_checks=[no_topk])
    with pytest.raises(ValueError, match="FusionRule.pattern"):
        LogitsPipe([Softmax()], custom_fusion_rules=[FusionRule((int,), custom_fusion_guard, build_custom_fusion)])
    with pytest.raises(ValueError, match="build returned"):
        LogitsPipe(
            [Temperature(), Softmax()],
            custom_fusion_rules=[FusionRule((Temperature,), custom_fusion_guard, lambda w: 3, 50)],
        )

    class NoTypes(Op):
        def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
            return tensor

    with pytest.raises(TypeError, match="must define the IN and OUT"):
        NoTypes()


@pytest.mark.parametrize(
    "processors, kwargs, message",
    [
        ([Temperature()], {"temperature": -0.5}, "temperature: expected a finite number >= 0"),
        ([Temperature()], {"temperature": float("nan")}, "temperature: expected"),
        ([Temperature()], {}, "runtime parameter 'temperature' is required"),
        ([Softmax(), TopP()], {"top_p": 0.0}, r"top_p: expected a number in \(0, 1\]"),
        ([Softmax(), TopP()], {"top_p": 1.5}, "top_p: expected"),
        ([Softmax(), TopK()], {"top_k": -2}, "top_k: expected an int >= 1, or 0 / -1"),
        ([Softmax(), TopK()], {"top_k": 2.5}, "top_k: expected"),
        ([Softmax(), MinP()], {"min_p": 1.5}, r"min_p: expected a number in \[0, 1\]"),
        (
            [Softmax(), TopK()],
            {"top_k": torch.ones(3, dtype=torch.long)},
            "top_k: expected a scalar or a tensor of shape",
        ),
    ],
)
def test_invalid_runtime_parameters(processors, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LogitsPipe(processors)(torch.randn(2, 6), **kwargs)


def test_construction_params_are_defaults_that_runtime_overrides():
    x = torch.tensor([[1.0, 2.0, 3.0]])
    assert torch.allclose(LogitsPipe([Temperature(temperature=0.5)])(x), x * 2)
    assert torch.allclose(LogitsPipe([Temperature(temperature=0.5)])(x, temperature=1.0), x)
    assert torch.equal(
        LogitsPipe([Temperature()])(x, temperature=torch.tensor([0.0])), torch.tensor([[-torch.inf, -torch.inf, 0.0]])
    )


# -- what the ops compute --------------------------------------------------------------------------


def test_standard_pipe_equals_process_logits():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 40, generator=gen) * 3
    params = [
        SamplingParams(temperature=0.8, top_p=0.95),
        SamplingParams(temperature=0),
        SamplingParams(top_k=5),
        SamplingParams(min_p=0.1, top_k=20),
        SamplingParams(temperature=1.3, top_p=0.5, min_p=0.02),
        SamplingParams(),
    ]
    pipe = LogitsPipe([Temperature(), Softmax(), MinP(), TopK(), TopP()])
    out = pipe(
        logits,
        temperature=torch.tensor([0.8, 0.0, 1.0, 1.0, 1.3, 1.0]),
        min_p=torch.tensor([p.min_p for p in params]),
        top_k=torch.tensor([p.top_k for p in params]),
        top_p=torch.tensor([p.top_p for p in params]),
    )
    assert torch.equal(out, process_logits(logits, params))
    assert torch.allclose(out.sum(-1), torch.ones(6))


FUSIBLE = [
    ([Temperature(), Softmax(), TopK(), TopP(), Sample()], {"temperature": 0.8, "top_k": 10, "top_p": 0.9}),
    ([Temperature(), Softmax(), MinP(), Sample()], {"temperature": torch.linspace(0.3, 1.5, 16), "min_p": 0.1}),
    ([Softmax(), TopP(), Sample()], {"top_p": torch.linspace(0.05, 1.0, 16)}),
    ([Softmax(), TopK(), Sample()], {"top_k": torch.arange(16)}),
    ([Temperature(), Softmax()], {"temperature": torch.linspace(0.0, 2.0, 16)}),
]


@pytest.mark.parametrize(
    "processors, kwargs", FUSIBLE, ids=lambda x: "-".join(type(p).__name__ for p in x) if isinstance(x, list) else ""
)
def test_fused_equals_unfused_token_for_token(processors, kwargs):
    x = torch.randn(16, 50, generator=torch.Generator().manual_seed(1)) * 2
    sampled = isinstance(processors[-1], Sample)
    seeds = {"seed": torch.arange(16), "offset": torch.zeros(16, dtype=torch.int64)} if sampled else {}
    fused = LogitsPipe(processors)
    unfused = LogitsPipe(processors, compile=False)
    assert len(fused.ops) < len(unfused.ops)
    a, b = fused(x, **kwargs, **seeds), unfused(x, **kwargs, **seeds)
    assert torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b, atol=1e-6)


def test_kernel_backend_equals_torch_backend():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(2)) * 2
    for compile in (True, False):
        pipe = LogitsPipe([Temperature(), Softmax(), MinP(), TopK(), TopP(), Sample()], compile=compile)
        kw = {
            "temperature": torch.tensor([0.7, 0.0, 1.0, 1.3]),
            "min_p": 0.05,
            "top_k": torch.tensor([5, 0, 3, 40]),
            "top_p": 0.9,
            "seed": torch.arange(4),
            "offset": torch.zeros(4, dtype=torch.int64),
        }
        assert torch.equal(pipe(x, backend="torch", **kw), pipe(x, backend="triton", **kw))


def test_sampled_tokens_follow_the_processed_distribution():
    n, v = 20000, 12
    logits = torch.randn(1, v, generator=torch.Generator().manual_seed(3)) * 2
    pipe = LogitsPipe([Temperature(), Softmax(), MinP(), TopK(), TopP(), Sample()])
    kw = {"temperature": 0.9, "min_p": 0.02, "top_k": 8, "top_p": 0.9}
    probs = LogitsPipe([Temperature(), Softmax(), MinP(), TopK(), TopP()])(logits, **kw)[0]
    tokens = pipe(logits.expand(n, v), seed=torch.arange(n), offset=torch.zeros(n, dtype=torch.int64), **kw)
    assert chi2_pvalue(tokens.long(), probs) > CHI2_ALPHA


# -- process then verify ------------------------------------------------------------------------


def verify_inputs(seed: int, B: int = 4, k: int = 3, V: int = 24):
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(B, k + 1, V, generator=gen) * 2
    draft = target[:, :k] + torch.randn(B, k, V, generator=gen)
    ids = torch.randint(0, V, (B, k), generator=gen)
    bonus = torch.randint(0, V, (B, 1), generator=gen)
    return target, bonus, draft, ids


PARAMS = [
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=0),
    SamplingParams(top_k=5, min_p=0.05),
    SamplingParams(temperature=1.2, top_k=8, top_p=0.8),
]


def runtime_of(params: list[SamplingParams]) -> dict[str, torch.Tensor]:
    return {
        "temperature": torch.tensor([0.0 if p.is_greedy else p.temperature for p in params]),
        "min_p": torch.tensor([p.min_p for p in params]),
        "top_k": torch.tensor([p.top_k for p in params]),
        "top_p": torch.tensor([p.top_p for p in params]),
    }


def test_verify_equals_forward_from_logits_with_sampling_params():
    target, bonus, draft, ids = verify_inputs(4)
    seeds = torch.arange(4) + 100
    pipe = LogitsPipe([Temperature(), Softmax(), MinP(), TopK(), TopP()])
    sampler = get_sampler("rejection_sampler", backend="torch")
    out = pipe.verify(sampler, target, bonus, draft, ids, seeds=seeds, **runtime_of(PARAMS))
    expected = RejectionSampler(backend="torch").forward_from_logits(
        target, bonus, draft, ids, seeds=seeds, sampling_params=PARAMS
    )
    assert torch.equal(out, expected)
    # ragged layout: requests with 3, 0, 2, 1 drafts
    counts = torch.tensor([3, 0, 2, 1])
    keep = torch.arange(3)[None, :] < counts[:, None]
    cu = counts.cumsum(0)
    ragged = pipe.verify(
        sampler,
        target[:, :3][keep],
        bonus[:, 0],
        draft[keep],
        ids[keep],
        cu_num_draft_tokens=cu,
        max_spec_len=3,
        seeds=seeds,
        **runtime_of(PARAMS),
    )
    expected = sampler.forward_ragged_from_logits(
        target[:, :3][keep], bonus[:, 0], draft[keep], ids[keep], cu, 3, seeds=seeds, sampling_params=PARAMS
    )
    assert torch.equal(ragged, expected)
    # a deterministic sampler takes no seeds
    typical = TypicalAcceptanceSampler(backend="torch")
    assert torch.equal(
        pipe.verify(typical, target, bonus, None, ids, **runtime_of(PARAMS)),
        typical.forward_from_logits(target, bonus, None, ids, sampling_params=PARAMS),
    )


def test_verify_logits_output_pipe_and_errors():
    target, bonus, draft, ids = verify_inputs(6)
    seeds = torch.arange(4)
    sampler = RejectionSampler(backend="torch")
    # a pipe ending in LOGITS gets a softmax before verification
    out = LogitsPipe([Temperature()]).verify(sampler, target, bonus, draft, ids, seeds=seeds, temperature=0.7)
    assert torch.equal(out, sampler.forward_from_logits(target, bonus, draft, ids, torch.full((4,), 0.7), seeds=seeds))
    # k = 0: no draft rows, only the bonus
    none = torch.zeros(4, 0, dtype=torch.long)
    out = LogitsPipe([Temperature(), Softmax(), TopK()]).verify(
        sampler, target[:, :1], bonus, draft[:, :0], none, seeds=seeds, temperature=0.5, top_k=3
    )
    assert torch.equal(out, bonus)
    with pytest.raises(ValueError, match="ends in Sample"):
        LogitsPipe([Softmax(), Sample()]).verify(sampler, target, bonus, draft, ids)
    with pytest.raises(SpecSamplerInputError, match="seeds: expected None"):
        LogitsPipe([Softmax()]).verify(TypicalAcceptanceSampler(), target, bonus, None, ids, seeds=seeds)
    with pytest.raises(SpecSamplerInputError, match="sampler: expected a verification sampler"):
        LogitsPipe([Softmax()]).verify("rejection_sampler", target, bonus, draft, ids)
    with pytest.raises(SpecSamplerInputError, match=r"temperature: expected a scalar or a tensor of shape \(4,\)"):
        LogitsPipe([Temperature(), Softmax()]).verify(sampler, target, bonus, draft, ids, temperature=torch.ones(3))
    with pytest.raises(SpecSamplerInputError, match="draft_logits: expected shape"):
        LogitsPipe([Softmax()]).verify(sampler, target, bonus, draft[:, :2], ids)
