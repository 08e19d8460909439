"""Sampler discovery through the ``spec_samplers.samplers`` entry-point group.

A third-party package adds a sampler by declaring, in its pyproject.toml::

    [project.entry-points."spec_samplers.samplers"]
    my_sampler = "my_package.module:MySampler"
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from importlib import metadata

import torch

ENTRY_POINT_GROUP = "spec_samplers.samplers"
#: built-ins, also found when the distribution's metadata is absent (a source checkout on sys.path)
BUILTIN_SAMPLERS = {
    "rejection_sampler": "spec_samplers.rejection:RejectionSampler",
    "typical_acceptance_sampler": "spec_samplers.typical:TypicalAcceptanceSampler",
    "block_verification": "spec_samplers.block:BlockVerificationSampler",
}


class UnknownSamplerError(KeyError, ValueError):
    """A sampler name or option that the registry does not know."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class SamplerInfo:
    name: str
    target: str  # "module:Class"
    package: str  # distribution that declared it
    entry_point: metadata.EntryPoint

    def load(self) -> type[torch.nn.Module]:
        return self.entry_point.load()

    def options(self) -> dict[str, object]:
        """Constructor options and their defaults (inspect.Parameter.empty when required)."""
        return sampler_options(self.load())


def sampler_options(cls: type) -> dict[str, object]:
    params = inspect.signature(cls).parameters  # the constructor's, without self
    return {
        name: p.default
        for name, p in params.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def _discover() -> dict[str, SamplerInfo]:
    found: dict[str, SamplerInfo] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        package = dist.metadata["Name"] if dist is not None else "unknown"
        found.setdefault(ep.name, SamplerInfo(ep.name, ep.value, package, ep))
    for name, target in BUILTIN_SAMPLERS.items():
        if name not in found:
            ep = metadata.EntryPoint(name=name, value=target, group=ENTRY_POINT_GROUP)
            found[name] = SamplerInfo(name, target, "spec-samplers", ep)
    return dict(sorted(found.items()))


def available_samplers() -> dict[str, SamplerInfo]:
    """Every registered sampler by name (re-read on each call, so new installs show up)."""
    return _discover()


def get_sampler_class(name: str) -> type[torch.nn.Module]:
    samplers = _discover()
    if name not in samplers:
        raise UnknownSamplerError(f"unknown sampler {name!r}; available: {', '.join(samplers) or '(none)'}")
    return samplers[name].load()


def check_options(name: str, cls: type, options: dict[str, object]) -> None:
    accepted = sampler_options(cls)
    unknown = [key for key in options if key not in accepted]
    if unknown:
        raise UnknownSamplerError(
            f"sampler {name!r} has no option {unknown[0]!r}; accepted options: {', '.join(accepted) or '(none)'}"
        )


def get_sampler(name: str, **options: object) -> torch.nn.Module:
    """Instantiate the sampler registered as ``name`` with ``options``.

    >>> from spec_samplers import get_sampler
    >>> sampler = get_sampler("typical_acceptance_sampler", posterior_threshold=0.05)
    """
    cls = get_sampler_class(name)
    check_options(name, cls, options)
    return cls(**options)
