"""The earlier name of :mod:`spec_samplers.integrations.vllm.min_p_logit_bias` (min_p and
logit_bias with speculative decoding), kept so that imports of it keep working."""

from spec_samplers.integrations.vllm.min_p_logit_bias import (
    build_logitsprocs,
    neutral_copy,
    section_set,
    validate_params,
    validate_spec_decode,
)

__all__ = ["build_logitsprocs", "neutral_copy", "section_set", "validate_params", "validate_spec_decode"]
