"""One benchmark run: which samplers with which options, over which settings, and the result.

Sampler selection: every registered sampler with its defaults, or the ``--sampler`` names. An
``--option key=value`` applies to every selected sampler that has that constructor option (an
option no selected sampler has is an error); values are Python literals (``0.05``, ``True``,
``'torch'``), a bare word is a string, and each is checked against the type of the option's
default. Sweeps: a sampler named explicitly with ``--sampler`` that has an entry in
:data:`SWEEPS` is run over the grid of the swept options not given with ``--option`` (the
typical-acceptance explorer); the timing runs once per sampler, with its default options for
the swept ones (timing does not depend on thresholds).
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from spec_samplers.base import SpecDecodeBaseSampler
from spec_samplers.bench import quality, timing, workloads
from spec_samplers.registry import available_samplers, sampler_options
from spec_samplers.typical import TypicalAcceptanceSampler

#: sampler name -> {option: values swept when the sampler is named with --sampler}
SWEEPS: dict[str, dict[str, tuple[float, ...]]] = {
    "typical_acceptance_sampler": {
        "posterior_threshold": (0.01, 0.05, 0.09, 0.3),
        "posterior_alpha": (0.05, 0.1, 0.3, 0.9),
    },
}


class BenchError(ValueError):
    """A bad command-line choice (unknown sampler or option, bad value); printed as is."""


@dataclass
class SamplerSpec:
    name: str
    options: dict[str, Any]
    lossless: bool | None
    sampler: torch.nn.Module
    swept: tuple[str, ...] = ()  # options set by a sweep
    timed: bool = True
    law: str = "token"  # which lossless theory applies: "token" (rejection) or "block" (block verification)

    @property
    def label(self) -> str:
        if not self.options:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "options": dict(self.options),
            "label": self.label,
            "lossless": self.lossless,
            "swept": list(self.swept),
            "law": self.law,
        }


def sampler_class(name: str, cls: Any) -> type[SpecDecodeBaseSampler]:
    """A registered entry's class; BenchError unless it is a spec_samplers sampler (the bench
    reads its declarations: ``lossless``, ``acceptance_law``)."""
    if not (isinstance(cls, type) and issubclass(cls, SpecDecodeBaseSampler)):
        raise BenchError(f"sampler {name!r}: {cls!r} is not a subclass of spec_samplers.base.SpecDecodeBaseSampler")
    return cls


def parse_option(text: str) -> tuple[str, object, str]:
    """'key=value' -> (key, value, raw value text)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise BenchError(f"--option: expected key=value (e.g. posterior_threshold=0.05), got {text!r}")
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        value = raw.strip()
    return key, value, raw


def _coerce(sampler: str, key: str, value: Any, raw: str, default: object) -> object:
    """Check ``value`` against the type of the option's default (no default: taken as given)."""
    if default is inspect.Parameter.empty or default is None:
        return value
    if isinstance(default, bool):
        ok, expected = isinstance(value, bool), "True or False"
    elif isinstance(default, (int, float)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        expected = "a number"
        if ok and isinstance(default, float):
            value = float(value)
        elif ok and isinstance(value, float):
            ok, expected = value.is_integer(), "an integer"
            value = int(value) if ok else value
    elif isinstance(default, str):
        ok, expected = isinstance(value, str), "a string"
    else:
        return value
    if not ok:
        raise BenchError(
            f"--option {key}={raw}: sampler {sampler!r} expects {expected} for {key} (default {default!r}), got {raw!r}"
        )
    return value


def resolve_samplers(names: list[str] | None, option_texts: Iterable[str], sweep: bool = True) -> list[SamplerSpec]:
    """The sampler variants of a run (module docstring). Raises BenchError on bad choices."""
    registered = available_samplers()
    explicit = bool(names)
    names = list(dict.fromkeys(names or registered))  # de-duplicated, in order
    for name in names:
        if name not in registered:
            raise BenchError(f"--sampler: unknown sampler {name!r}; available: {', '.join(registered) or '(none)'}")
    classes = {name: sampler_class(name, registered[name].load()) for name in names}
    accepted = {name: sampler_options(cls) for name, cls in classes.items()}
    given: dict[str, dict[str, Any]] = {name: {} for name in names}
    for text in option_texts:
        key, value, raw = parse_option(text)
        takers = [name for name in names if key in accepted[name]]
        if not takers:
            known = "; ".join(f"{n}: {', '.join(accepted[n]) or '(none)'}" for n in names)
            raise BenchError(f"--option {key}: no selected sampler has this option; accepted options: {known}")
        for name in takers:
            given[name][key] = _coerce(name, key, value, raw, accepted[name][key])

    specs = []
    for name in names:
        grid = {k: v for k, v in SWEEPS.get(name, {}).items() if k not in given[name]} if (sweep and explicit) else {}
        variants = [dict(zip(grid, values)) for values in itertools.product(*grid.values())] or [{}]
        defaults = {k: accepted[name][k] for k in grid}
        timed_variant = defaults if defaults in variants else variants[0]
        for swept in variants:
            options = {**given[name], **swept}
            try:
                sampler = classes[name](**options)
            except (TypeError, ValueError) as exc:
                raise BenchError(f"--option for sampler {name!r}: {exc}") from exc
            specs.append(
                SamplerSpec(
                    name,
                    options,
                    classes[name].lossless,
                    sampler,
                    tuple(grid),
                    swept == timed_variant,
                    classes[name].acceptance_law,
                )
            )
    return specs


@dataclass
class BenchConfig:
    specs: list[SamplerSpec]
    settings: list[workloads.Setting]
    k: int = 4
    rows: int = 1024
    seed: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    batch_sizes: tuple[int, ...] = (1, 4, 16, 64)
    timing_vocab: int = 32000
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    min_time_s: float = 0.2
    progress: bool = False
    loaded_pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # setting name -> pairs
    quick: bool = False


def _pairs(config: BenchConfig, index: int, setting: workloads.Setting) -> tuple[torch.Tensor, torch.Tensor]:
    if setting.name in config.loaded_pairs:
        return config.loaded_pairs[setting.name]
    return workloads.make_pairs(setting, config.seed + 1000 * index)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        print("spec-samplers bench: --progress needs tqdm (pip install tqdm); continuing without", file=sys.stderr)
        return None
    return tqdm(total=total, desc="bench", unit="task", file=sys.stderr, leave=False)


def _first_token_law(sampler: object):
    """The exact law of the first emitted token where it is computable (typical acceptance)."""
    if isinstance(sampler, TypicalAcceptanceSampler):
        return functools.partial(
            quality.typical_first_token_law,
            posterior_threshold=sampler.posterior_threshold,
            posterior_alpha=sampler.posterior_alpha,
        )
    return None


def run(config: BenchConfig) -> dict[str, Any]:
    """Quality over every (variant, setting), then timing over every timed sampler x batch size x
    dtype. Returns the result dict (the JSON's ``acceptance``, ``timing`` and ``samplers``)."""
    timed = [s for s in config.specs if s.timed]
    total = len(config.specs) * len(config.settings) + len(timed) * len(config.batch_sizes) * len(config.dtypes)
    bar = _progress(total, config.progress)
    acceptance, timings = [], []
    pairs = [_pairs(config, i, s) for i, s in enumerate(config.settings)]
    started = time.perf_counter()

    def stage(text: str) -> None:
        """One line per stage on stderr when there is no bar (a pipe, a log file): never silent
        for a minute."""
        if bar is None:
            print(f"[bench {time.perf_counter() - started:6.1f} s] {text}", file=sys.stderr, flush=True)

    try:
        for i, spec in enumerate(config.specs):
            stage(f"acceptance {i + 1}/{len(config.specs)}: {spec.label} over {len(config.settings)} settings")
            for setting, (target, draft) in zip(config.settings, pairs):
                if bar is not None:
                    bar.set_postfix_str(f"{spec.name} {setting.name}", refresh=False)
                measured = quality.measure(
                    spec.sampler,
                    target,
                    draft,
                    config.k,
                    config.rows,
                    seed=config.seed,
                    device=config.device,
                    point_mass_drafts=setting.point_mass_drafts,
                    lossless=spec.lossless,
                    law=spec.law,
                    first_token_law=_first_token_law(spec.sampler),
                )
                acceptance.append(
                    {
                        "sampler": spec.label,
                        "name": spec.name,
                        "options": dict(spec.options),
                        "setting": setting.describe(),
                        "k": config.k,
                        **measured,
                    }
                )
                if bar is not None:
                    bar.update()
        for i, spec in enumerate(timed):
            stage(
                f"timing {i + 1}/{len(timed)}: {spec.label} at B = {','.join(map(str, config.batch_sizes))}, "
                f"V = {config.timing_vocab}"
            )
            for dtype in config.dtypes:
                for batch_size in config.batch_sizes:
                    if bar is not None:
                        bar.set_postfix_str(f"{spec.name} B={batch_size} {dtype}", refresh=False)
                    t = timing.time_sampler(
                        spec.sampler,
                        batch_size,
                        config.k,
                        config.timing_vocab,
                        dtype,
                        config.device,
                        min_time_s=config.min_time_s,
                        seed=config.seed,
                    )
                    timings.append({"sampler": spec.label, "name": spec.name, "options": dict(spec.options), **t})
                    if bar is not None:
                        bar.update()
        stage("done")
    finally:
        if bar is not None:
            bar.close()
    return {
        "samplers": [s.describe() for s in config.specs],
        "settings": [s.describe() for s in config.settings],
        "acceptance": acceptance,
        "timing": timings,
    }
