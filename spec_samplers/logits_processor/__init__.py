"""A declarative, pluggable framework for logits-processing pipelines, with FlashInfer's names
and behaviour (``flashinfer.logits_processor``): processors legalize into typed ops, which are
type-checked, validated and fused by priority; ops run :mod:`spec_samplers.sampling` (PyTorch on
CPU, Triton kernels on CUDA). Beyond FlashInfer, :meth:`LogitsPipe.verify` ends a pipe in a
verification sampler: "process then verify" in one call. See docs/logits.md.

Example::

    >>> import torch
    >>> from spec_samplers.logits_processor import LogitsPipe, Temperature, Softmax, TopP, Sample
    >>> pipe = LogitsPipe([Temperature(), Softmax(), TopP(), Sample()])
    >>> output_ids = pipe(torch.randn(4, 5), temperature=0.7, top_p=0.9)
"""

from spec_samplers.logits_processor.compiler import (
    Compiler,
    FusionRule,
    LegalizationError,
    ValidityCheck,
    compile_pipeline,
    default_fusion_rules,
    default_validity_checks,
    infer_initial_type,
    legalize_processors,
)
from spec_samplers.logits_processor.op import CompileError, Op, ParameterizedOp
from spec_samplers.logits_processor.operators import (
    FusedProbsMinPSampleOp,
    FusedProbsTopKSampleOp,
    FusedProbsTopKTopPSampleOp,
    FusedProbsTopPSampleOp,
    FusedTemperatureSoftmaxOp,
    LogitsSampleOp,
    LogitsTopKOp,
    MinPOp,
    ProbsSampleOp,
    ProbsTopKOp,
    SoftmaxOp,
    TemperatureOp,
    TopPOp,
    min_p_renorm_probs,
)
from spec_samplers.logits_processor.pipe import PER_REQUEST_PARAMS, LogitsPipe
from spec_samplers.logits_processor.processors import LogitsProcessor, MinP, Sample, Softmax, Temperature, TopK, TopP
from spec_samplers.logits_processor.types import TaggedTensor, TensorType

__all__ = [
    "PER_REQUEST_PARAMS",
    "CompileError",
    "Compiler",
    "FusedProbsMinPSampleOp",
    "FusedProbsTopKSampleOp",
    "FusedProbsTopKTopPSampleOp",
    "FusedProbsTopPSampleOp",
    "FusedTemperatureSoftmaxOp",
    "FusionRule",
    "LegalizationError",
    "LogitsPipe",
    "LogitsProcessor",
    "LogitsSampleOp",
    "LogitsTopKOp",
    "MinP",
    "MinPOp",
    "Op",
    "ParameterizedOp",
    "ProbsSampleOp",
    "ProbsTopKOp",
    "Sample",
    "Softmax",
    "SoftmaxOp",
    "TaggedTensor",
    "Temperature",
    "TemperatureOp",
    "TensorType",
    "TopK",
    "TopP",
    "TopPOp",
    "ValidityCheck",
    "compile_pipeline",
    "default_fusion_rules",
    "default_validity_checks",
    "infer_initial_type",
    "legalize_processors",
    "min_p_renorm_probs",
]
