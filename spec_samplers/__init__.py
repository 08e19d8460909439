"""spec-samplers: the verification step of speculative decoding as a swappable part.

The public names below are imported on first use (PEP 562), so that the ``spec-samplers`` command
answers ``--help``, ``--version`` and ``list`` without importing torch (about 2-4 s)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from spec_samplers._version import __version__

if TYPE_CHECKING:
    from spec_samplers.base import (
        SpecDecodeBaseSampler,
        SpecDecodeDeterministicBaseSampler,
        SpecDecodeStochasticBaseSampler,
    )
    from spec_samplers.block import BlockVerificationSampler
    from spec_samplers.constants import SpecSamplerInputError
    from spec_samplers.multipath import MultipathBlockVerificationSampler
    from spec_samplers.output import PLACEHOLDER_TOKEN_ID, build_output
    from spec_samplers.registry import UnknownSamplerError, available_samplers, get_sampler
    from spec_samplers.rejection import RejectionSampler
    from spec_samplers.sampling_params import SamplingParams
    from spec_samplers.typical import TypicalAcceptanceSampler

#: public name -> the module that defines it
_EXPORTS = {
    "SpecDecodeBaseSampler": "spec_samplers.base",
    "SpecDecodeDeterministicBaseSampler": "spec_samplers.base",
    "SpecDecodeStochasticBaseSampler": "spec_samplers.base",
    "BlockVerificationSampler": "spec_samplers.block",
    "SpecSamplerInputError": "spec_samplers.constants",
    "MultipathBlockVerificationSampler": "spec_samplers.multipath",
    "PLACEHOLDER_TOKEN_ID": "spec_samplers.output",
    "build_output": "spec_samplers.output",
    "UnknownSamplerError": "spec_samplers.registry",
    "available_samplers": "spec_samplers.registry",
    "get_sampler": "spec_samplers.registry",
    "RejectionSampler": "spec_samplers.rejection",
    "SamplingParams": "spec_samplers.sampling_params",
    "TypicalAcceptanceSampler": "spec_samplers.typical",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'spec_samplers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "__version__",
    "BlockVerificationSampler",
    "MultipathBlockVerificationSampler",
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
