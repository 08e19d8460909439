"""spec-samplers: the verification step of speculative decoding as a swappable part."""

from spec_samplers._version import __version__
from spec_samplers.base import (
    SpecDecodeBaseSampler,
    SpecDecodeDeterministicBaseSampler,
    SpecDecodeStochasticBaseSampler,
)
from spec_samplers.block import BlockVerificationSampler
from spec_samplers.errors import SpecSamplerInputError
from spec_samplers.output import PLACEHOLDER_TOKEN_ID, build_output
from spec_samplers.registry import UnknownSamplerError, available_samplers, get_sampler
from spec_samplers.rejection import RejectionSampler
from spec_samplers.sampling_params import SamplingParams
from spec_samplers.typical import TypicalAcceptanceSampler

__all__ = [
    "__version__",
    "BlockVerificationSampler",
    "PLACEHOLDER_TOKEN_ID",
    "RejectionSampler",
    "SamplingParams",
    "SpecDecodeBaseSampler",
    "SpecDecodeDeterministicBaseSampler",
    "SpecDecodeStochasticBaseSampler",
    "SpecSamplerInputError",
    "TypicalAcceptanceSampler",
    "UnknownSamplerError",
    "available_samplers",
    "build_output",
    "get_sampler",
]
