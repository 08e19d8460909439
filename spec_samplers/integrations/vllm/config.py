"""The engine flag: ``additional_config={"spec_samplers": {"acceptance_method": NAME, **options}}``.

Parsed from a ``VllmConfig``; every mistake (unknown name, unknown option, bad value, a vLLM
verification mode that cannot be combined with a replacement) raises
:class:`SpecSamplersConfigError` with what is available, so the engine fails at start, never
mid-request.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from spec_samplers.registry import (
    UnknownSamplerError,
    available_samplers,
    check_options,
    get_sampler_class,
    sampler_options,
)

#: key of our section in vLLM's ``additional_config``
CONFIG_KEY = "spec_samplers"
#: the sampler's registry name (vLLM V0's speculative-config key)
METHOD_KEY = "acceptance_method"
#: vLLM's own verification modes that our samplers replace; the others ("synthetic", "block",
#: "fly") are vLLM's own schemes and conflict
REPLACEABLE_VLLM_METHODS = ("standard",)
#: what to say instead, for vLLM's modes that have a counterpart here
_COUNTERPARTS = {
    "block": 'for block verification in both runners use {"acceptance_method": "block_verification"} '
    "with rejection_sample_method='standard'",
}


class SpecSamplersConfigError(ValueError):
    """A bad ``additional_config["spec_samplers"]`` section."""


@dataclass(frozen=True)
class SamplerChoice:
    """A validated sampler selection: registry name, constructor options and class."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    sampler_cls: type[torch.nn.Module] | None = None

    def build(self) -> torch.nn.Module:
        cls = self.sampler_cls if self.sampler_cls is not None else get_sampler_class(self.name)
        try:
            return cls(**self.options)
        except (TypeError, ValueError) as exc:
            raise SpecSamplersConfigError(
                f"{CONFIG_KEY}: sampler {self.name!r} rejected its options {self.options!r}: {exc}; "
                f"accepted options: {_describe_options(cls)}"
            ) from exc

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{self.name}({opts})"


def _describe_options(cls: type) -> str:
    opts = sampler_options(cls)
    return (
        ", ".join(f"{k}={'required' if v is inspect.Parameter.empty else repr(v)}" for k, v in opts.items()) or "(none)"
    )


def _available() -> str:
    return ", ".join(available_samplers()) or "(none)"


def parse_section(additional_config: object) -> SamplerChoice | None:
    """The sampler asked for by vLLM's ``additional_config``, or None when it asks for none.

    Builds the sampler once so that bad option values fail here too.
    """
    if not isinstance(additional_config, dict) or CONFIG_KEY not in additional_config:
        return None
    section = additional_config[CONFIG_KEY]
    if not isinstance(section, dict):
        raise SpecSamplersConfigError(
            f"additional_config[{CONFIG_KEY!r}]: expected a dict like "
            f'{{"{METHOD_KEY}": NAME, ...options}}, got {section!r}; available samplers: {_available()}'
        )
    if METHOD_KEY not in section:
        raise SpecSamplersConfigError(
            f"additional_config[{CONFIG_KEY!r}]: missing {METHOD_KEY!r}; available samplers: {_available()}"
        )
    name = section[METHOD_KEY]
    options = {k: v for k, v in section.items() if k != METHOD_KEY}
    if not isinstance(name, str):
        raise SpecSamplersConfigError(
            f"additional_config[{CONFIG_KEY!r}][{METHOD_KEY!r}]: expected a sampler name (str), got {name!r}; "
            f"available samplers: {_available()}"
        )
    try:
        cls = get_sampler_class(name)
        check_options(name, cls, options)
    except UnknownSamplerError as exc:
        raise SpecSamplersConfigError(f"additional_config[{CONFIG_KEY!r}]: {exc}") from exc
    choice = SamplerChoice(name, options, cls)
    choice.build()
    return choice


def choice_from_vllm_config(vllm_config: object) -> SamplerChoice | None:
    """Parse and validate our section of a ``vllm.config.VllmConfig`` (None: nothing asked)."""
    if vllm_config is None:
        return None
    choice = parse_section(getattr(vllm_config, "additional_config", None))
    if choice is None:
        return None
    spec = getattr(vllm_config, "speculative_config", None)
    method = getattr(spec, "rejection_sample_method", "standard") if spec is not None else "standard"
    if method not in REPLACEABLE_VLLM_METHODS:
        hint = _COUNTERPARTS.get(method)
        raise SpecSamplersConfigError(
            f"additional_config[{CONFIG_KEY!r}] selects {choice.name!r}, but speculative_config."
            f"rejection_sample_method={method!r} asks for vLLM's own {method!r} verification; "
            f"use one or the other (our samplers replace only {', '.join(REPLACEABLE_VLLM_METHODS)!s})"
            + (f"; {hint}" if hint else "")
        )
    if getattr(vllm_config, "watermark_config", None) is not None:
        # With a watermark configuration vLLM draws every resampled token with its keyed
        # watermark draw inside verification; a replacement would drop the watermark.
        raise SpecSamplersConfigError(
            f"additional_config[{CONFIG_KEY!r}] selects {choice.name!r}, but the engine has a watermark_config: "
            "vLLM's watermarked verification cannot be replaced; drop one of the two"
        )
    return choice
