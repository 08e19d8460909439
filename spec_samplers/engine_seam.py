"""The engine-neutral seam: how a caller runs a verification sampler it did not write.

Engine adapters (both vLLM runners, through :class:`spec_samplers.integrations.vllm.ragged.RaggedVerifier`),
:meth:`spec_samplers.logits_processor.LogitsPipe.verify` and the decoding loop
(:class:`spec_samplers.decoding.SpeculativeDecoder`) take any sampler: one of ours, a third-party
sampler from the registry, or a vLLM V0-style sampler that only has a padded ``forward``. What they
need to know about it is read once, by :func:`bind`, never per call:

* the entries it can run (``forward``, ``forward_ragged``, ``forward_from_logits``,
  ``forward_ragged_from_logits``; a V0-style sampler has ``forward`` only);
* the randomness keywords each entry takes (``seeds``, ``offsets``, ``is_greedy``,
  ``seeded_seqs``; an entry with ``**kwargs`` takes all four), hence how the sampler takes
  randomness: "tensors" (``seeds=`` / ``offsets=``: no host work), "generators" (vLLM V0's
  ``seeded_seqs``) or "none" (deterministic samplers, which refuse seeds);
* ``applies_filters``: whether the sampler applies per-request top-k / top-p / min-p itself.

**Adding an engine adapter** (the place to start): bind the sampler once, when the engine builds
its verification step; per step, bring the engine's tensors to one of the entries' layouts
(padded [B, k+1, V] or ragged [T, V] with ``cu_num_draft_tokens``), pick the entry with
:meth:`BoundSampler.entry` (fall back to padding for a sampler without the ragged ones, as
``RaggedVerifier`` does) and pass the randomness through :meth:`BoundSampler.randomness_for`. To
swap an engine's own function for ours, :func:`replace_engine_function` binds the engine's call to
the adapter's ``verify`` and hands the calls that use the engine's own schemes back to the engine.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

#: the four entries, in the order callers prefer them (padded probabilities first: every sampler has it)
ENTRIES = ("forward", "forward_ragged", "forward_from_logits", "forward_ragged_from_logits")
#: the keywords through which a sampler takes randomness (or the greedy mask)
RANDOMNESS_KEYWORDS = frozenset({"seeded_seqs", "seeds", "offsets", "is_greedy"})

R = TypeVar("R")


def accepted_keywords(fn: Callable[..., Any]) -> frozenset[str]:
    """The randomness keywords ``fn`` takes (all of them when it takes ``**kwargs``; none when its
    signature cannot be read)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return RANDOMNESS_KEYWORDS
    return RANDOMNESS_KEYWORDS & {p.name for p in params}


@dataclass(frozen=True)
class BoundSampler:
    """A sampler as callers see it, read once by :func:`bind`."""

    sampler: Any
    #: the entries the sampler can run, by name (bound methods)
    entries: Mapping[str, Callable[..., torch.Tensor]]
    #: entry name -> the randomness keywords it takes
    keywords: Mapping[str, frozenset[str]]
    #: "tensors" (seeds= / offsets=), "generators" (seeded_seqs, vLLM V0) or "none"
    randomness: str
    #: the sampler applies per-request top-k / top-p / min-p itself (``sampling_params=`` fused)
    applies_filters: bool

    def entry(self, name: str) -> Callable[..., torch.Tensor] | None:
        """The bound entry ``name``, or None when the sampler cannot run it."""
        return self.entries.get(name)

    def accepts(self, entry: str, keyword: str) -> bool:
        """Whether ``entry`` takes the randomness keyword ``keyword``."""
        return keyword in self.keywords.get(entry, frozenset())

    def randomness_for(self, entry: str, **values: Any) -> dict[str, Any]:
        """The keyword arguments among ``values`` (seeds=, offsets=, ...) that ``entry`` takes,
        without the None ones (so a sampler's own defaults apply)."""
        accepted = self.keywords.get(entry, frozenset())
        return {k: v for k, v in values.items() if v is not None and k in accepted}


def _supported_entries(sampler: Any) -> tuple[str, ...]:
    supported = getattr(type(sampler), "supported_entries", None)
    if callable(supported):  # our base classes: a V0-style subclass without the op has forward only
        return tuple(supported())
    return tuple(name for name in ENTRIES if callable(getattr(sampler, name, None)))


def bind(sampler: Any) -> BoundSampler:
    """Read what callers need from ``sampler`` (any callable verification sampler), once."""
    names = _supported_entries(sampler)
    entries = {name: getattr(sampler, name) for name in names}
    if "forward" not in entries and callable(sampler):
        entries["forward"] = sampler  # a callable without a forward method: called as V0's forward
    keywords = {name: accepted_keywords(fn) for name, fn in entries.items()}
    padded = keywords.get("forward", frozenset())
    if {"seeds", "offsets"} <= padded:
        randomness = "tensors"
    elif "seeded_seqs" in padded:
        randomness = "generators"
    else:
        randomness = "none"
    applies_filters = bool(getattr(type(sampler), "applies_filters", False))
    return BoundSampler(sampler, entries, keywords, randomness, applies_filters)


def replace_engine_function(
    sampler: Any,
    verifier: Any,
    verify: Callable[..., R],
    engine_function: Callable[..., R],
    engine_only: Callable[[Mapping[str, Any]], bool],
) -> Callable[..., R]:
    """A drop-in for an engine function whose signature is ``verify``'s after its first
    parameter: calls are bound as that signature binds them and run ``verify(verifier, ...)``,
    except those for which ``engine_only(arguments)`` holds (the engine's own schemes), which go
    to ``engine_function`` with the arguments as given. The result carries the sampler as
    ``__spec_samplers_sampler__`` (what the plugin and the tests read)."""
    signature = inspect.signature(verify)

    def replacement(*args: Any, **kwargs: Any) -> R:
        call = signature.bind(verifier, *args, **kwargs)
        if engine_only(call.arguments):
            return engine_function(*args, **kwargs)
        return verify(*call.args, **call.kwargs)

    replacement.__doc__ = verify.__doc__
    replacement.__spec_samplers_sampler__ = sampler  # type: ignore[attr-defined]
    return replacement
