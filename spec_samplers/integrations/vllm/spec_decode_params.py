"""``min_p`` and ``logit_bias`` under speculative decoding (vLLM 0.32 and 0.33), when our section is set.

vLLM refuses both with speculative decoding on (``SamplingParams._validate_spec_decode``: "not yet
supported with speculative decoding") and its V1 model runner then builds only the min-tokens
logits processor. Our samplers verify against the processed target exactly and judge each draft
against the law it was drawn from, so with ``additional_config["spec_samplers"]`` set these
requests are served losslessly:

- validation: vLLM's own ``_validate_spec_decode`` runs on a copy of the request with ``min_p``
  and ``logit_bias`` neutral, so exactly those two refusals are lifted (a bias on a token outside
  the vocabulary is still refused by ``_validate_logit_bias``); the engine's input processor
  says, for the duration of its own validation, whether its configuration holds our section;
- V1 runner: ``build_logitsprocs`` builds vLLM's three built-in processors (min-tokens, logit
  bias, min-p) as without speculative decoding, so vLLM's Sampler applies them to the bonus rows;
  the draft rows get them from :func:`spec_samplers.integrations.vllm.v1_runner.apply_logits_processors`;
- Model Runner V2 needs nothing more: its ``Sampler.apply_sampling_params`` already applies logit
  bias, penalties, temperature, min-p and top-k/top-p to every logits row, draft rows included.

Without our section every wrapped function is vLLM's, called with the arguments as given.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from spec_samplers.integrations.vllm.config import CONFIG_KEY

#: whether the input processor validating the current request belongs to an engine with our section
_section_set: ContextVar[bool] = ContextVar("spec_samplers_section_set", default=False)


def section_set(vllm_config: Any) -> bool:
    """Whether ``vllm_config.additional_config`` holds our section (validated at engine start)."""
    additional = getattr(vllm_config, "additional_config", None)
    return isinstance(additional, dict) and CONFIG_KEY in additional


def neutral_copy(params: Any) -> Any:
    """A shallow copy of a ``SamplingParams`` with ``min_p`` and ``logit_bias`` at their defaults."""
    neutral = copy.copy(params)
    neutral.min_p = 0.0
    neutral.logit_bias = None
    return neutral


def validate_params(vllm_validate_params: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps ``InputProcessor._validate_params``: vLLM's, run while :func:`validate_spec_decode`
    knows whether this engine has our section."""

    @functools.wraps(vllm_validate_params)
    def _validate_params(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _section_set.set(section_set(getattr(self, "vllm_config", None)))
        try:
            return vllm_validate_params(self, *args, **kwargs)
        finally:
            _section_set.reset(token)

    return _validate_params


def validate_spec_decode(vllm_validate_spec_decode: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps ``SamplingParams._validate_spec_decode``: with our section, vLLM's checks run on
    :func:`neutral_copy` of the request (min_p and logit_bias are served); otherwise vLLM's as is."""

    @functools.wraps(vllm_validate_spec_decode)
    def _validate_spec_decode(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _section_set.get():
            return vllm_validate_spec_decode(neutral_copy(self), *args, **kwargs)
        return vllm_validate_spec_decode(self, *args, **kwargs)

    return _validate_spec_decode


def build_logitsprocs(vllm_build_logitsprocs: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps V1's ``build_logitsprocs`` (as the V1 model runner imported it): with our section
    and speculative decoding, vLLM's built-in processors (min-tokens, logit bias, min-p) are built
    as vLLM builds them without speculative decoding. Custom processors and pooling models go to
    vLLM's function, which refuses the first and builds none for the second."""

    @functools.wraps(vllm_build_logitsprocs)
    def _build_logitsprocs(
        vllm_config: Any,
        device: Any,
        is_pin_memory: bool,
        is_pooling_model: bool,
        custom_logitsprocs: Any = (),
    ) -> Any:
        if (
            is_pooling_model
            or custom_logitsprocs
            or getattr(vllm_config, "speculative_config", None) is None
            or not section_set(vllm_config)
        ):
            return vllm_build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs)
        from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, LogitsProcessors

        return LogitsProcessors(ctor(vllm_config, device, is_pin_memory) for ctor in BUILTIN_LOGITS_PROCESSORS)

    return _build_logitsprocs
