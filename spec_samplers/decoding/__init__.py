"""Speculative decoding on real models: naive_speculate's inference interfaces (seed 003) and a
batched :class:`SpeculativeDecoder` that verifies drafts with any registered sampler.

Example (transformers models; any :class:`LanguageModel` works)::

    >>> from spec_samplers import SamplingParams
    >>> from spec_samplers.decoding import SpeculativeDecoder
    >>> from spec_samplers.integrations.transformers import HFLanguageModel
    >>> decoder = SpeculativeDecoder(HFLanguageModel(target_model), HFLanguageModel(draft_model),
    ...                              sampler="rejection_sampler", num_speculative_tokens=4)
    >>> out = decoder.generate(prompt_ids, max_new_tokens=32, sampling_params=SamplingParams(temperature=0.8, seed=0))
    >>> out.token_ids, out.acceptance_rate, out.stats[0].acceptance_per_position
"""

from spec_samplers.decoding.inferencer import AutoregressiveInferencer, generate_autoregressive
from spec_samplers.decoding.interfaces import (
    PAD_TOKEN_ID,
    DecodeOutput,
    Inferencer,
    KVCache,
    KVState,
    LanguageModel,
    PrefillOutput,
)
from spec_samplers.decoding.kv_cache import QueryLayout, SlotKVCache, TensorKVCache
from spec_samplers.decoding.output import GenerationOutput, RequestStats
from spec_samplers.decoding.speculative import SpeculativeDecoder
from spec_samplers.decoding.strategy import SampleStrategy

__all__ = [
    "PAD_TOKEN_ID",
    "AutoregressiveInferencer",
    "DecodeOutput",
    "GenerationOutput",
    "Inferencer",
    "KVCache",
    "KVState",
    "LanguageModel",
    "PrefillOutput",
    "QueryLayout",
    "RequestStats",
    "SampleStrategy",
    "SlotKVCache",
    "SpeculativeDecoder",
    "TensorKVCache",
    "generate_autoregressive",
]
