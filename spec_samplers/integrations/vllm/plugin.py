"""vLLM general plugin (vLLM 0.32.x and 0.33.x): swap vLLM's verification step for a registered
sampler, when asked.

vLLM calls ``register()`` in every process (front end, engine core, workers) and passes it no
configuration. So ``register()`` only arranges to look at the configuration where vLLM builds a
rejection sampler: once vLLM imports one of the two modules below (in the worker, never at
registration: importing them costs seconds), their ``RejectionSampler`` constructor is wrapped by
a pass-through observer that, after vLLM's own constructor, reads ``additional_config`` from the
current ``VllmConfig`` (vLLM builds its model runner inside ``set_current_vllm_config``). Only if
it holds our section is the module's ``rejection_sample`` replaced (logged once per attribute);
otherwise vLLM's own function stays, or is put back. Bad sections raise there: at engine start.

``WRAPS`` lists the few other vLLM functions wrapped on import (spec_decode_params.py: min_p and
logit_bias with speculative decoding; V1's ``expand_batch_to_tokens``, broken on vLLM's CPU build
(vLLM issue #55005); V1's ``RejectionSampler.forward`` and Model Runner V2's
``RejectionSampler._verify``, whose plain steps skip vLLM's glue when our sampler is installed at
the seam, and V2's ``Sampler.add_request``, which records what they read); each wrapper reads the
configuration it is given (or the seam) and, without our section, is vLLM's function.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

#: under "vllm" so that vLLM's log handler prints it
logger = logging.getLogger("vllm.plugins.spec_samplers")

#: vLLM minor versions whose seams this plugin knows. The `vllm` extra in pyproject.toml installs
#: the newest (0.33, what CI tests); 0.32's seams differ only by keywords the wrappers accept, and
#: .ci/check_vllm_032 runs the plugin tests against it.
SUPPORTED_VLLM_MINOR_VERSIONS = ((0, 32), (0, 33))
SUPPORTED_VLLM_SPEC = "vllm>=0.32,<0.34"


@dataclass(frozen=True)
class Seam:
    runner: str  # "v1" or "v2"
    module: str  # module whose global `attribute` the runner calls
    attribute: str
    factory: str  # "module:function" building our replacement from (sampler, vLLM's function)

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.attribute}"


SEAMS = (
    Seam(
        "v1",
        "vllm.v1.sample.rejection_sampler",
        "rejection_sample",
        "spec_samplers.integrations.vllm.v1_runner:make_rejection_sample",
    ),
    Seam(
        "v2",
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
        "rejection_sample",
        "spec_samplers.integrations.vllm.v2_runner:make_rejection_sample",
    ),
)
_SEAMS_BY_MODULE = {seam.module: seam for seam in SEAMS}


@dataclass(frozen=True)
class Wrap:
    """A vLLM function or method wrapped once its module is imported; the wrapper (built by
    ``factory`` from vLLM's function) checks the configuration itself and, without our section,
    calls vLLM's function with the arguments as given."""

    module: str
    owner: str | None  # the class in ``module`` holding ``attribute``; None: a module global
    attribute: str
    factory: str  # "module:function" building the wrapper from vLLM's function


_PARAMS = "spec_samplers.integrations.vllm.spec_decode_params"
_V2 = "spec_samplers.integrations.vllm.v2_runner"
#: min_p and logit_bias with speculative decoding (spec_decode_params.py): validation in the
#: front end, V1's logits processors in the worker
WRAPS = (
    Wrap("vllm.sampling_params", "SamplingParams", "_validate_spec_decode", f"{_PARAMS}:validate_spec_decode"),
    Wrap("vllm.v1.engine.input_processor", "InputProcessor", "_validate_params", f"{_PARAMS}:validate_params"),
    Wrap("vllm.v1.worker.gpu_model_runner", None, "build_logitsprocs", f"{_PARAMS}:build_logitsprocs"),
    Wrap(
        "vllm.v1.sample.rejection_sampler",
        "RejectionSampler",
        "apply_logits_processors",
        "spec_samplers.integrations.vllm.v1_runner:apply_logits_processors",
    ),
    # V1's plain steps verified from the model's logits, bonus rows included (v1_runner.forward)
    Wrap(
        "vllm.v1.sample.rejection_sampler",
        "RejectionSampler",
        "forward",
        "spec_samplers.integrations.vllm.v1_runner:forward",
    ),
    # vLLM issue #55005: its CPU build's per-row temperatures are uninitialised memory; ours while
    # our section is installed (v1_runner.expand_batch_to_tokens)
    Wrap(
        "vllm.v1.sample.rejection_sampler",
        None,
        "expand_batch_to_tokens",
        "spec_samplers.integrations.vllm.v1_runner:expand_batch_to_tokens",
    ),
    # Model Runner V2's plain chunks verified from the raw logits (v2_runner.verify_chunk), from a
    # per-request flag recorded when the Sampler adds the request (v2_runner.add_request)
    Wrap("vllm.v1.worker.gpu.sample.sampler", "Sampler", "add_request", f"{_V2}:add_request"),
    Wrap("vllm.v1.worker.gpu.spec_decode.rejection_sampler", "RejectionSampler", "_verify", f"{_V2}:verify_chunk"),
)
_WRAPPED_MARK = "__spec_samplers_wraps__"
#: the class, in each seam's module, whose construction tells us the configuration
OBSERVED_CLASS = "RejectionSampler"
_OBSERVER_MARK = "__spec_samplers_observer__"

_lock = threading.RLock()
_registered = False
_originals: dict[str, Callable[..., Any]] = {}  # seam qualname -> vLLM's function
_installed: dict[str, str] = {}  # seam qualname -> description of our sampler
_logged: set[tuple[str, str]] = set()


def vllm_version() -> str | None:
    module = sys.modules.get("vllm")
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    try:
        from importlib.metadata import version as dist_version

        return dist_version("vllm")
    except Exception:
        return None


def version_supported(version: str | None) -> bool:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return match is not None and (int(match[1]), int(match[2])) in SUPPORTED_VLLM_MINOR_VERSIONS


def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point: idempotent, cheap, changes no behaviour."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
        version = vllm_version()
        if not version_supported(version):
            logger.warning(
                "spec_samplers: vLLM %s is not supported (supported: %s); vLLM's own rejection sampler stays",
                version,
                SUPPORTED_VLLM_SPEC,
            )
            return
        for module_name in _SEAMS_BY_MODULE:
            _when_imported(module_name, _observe_module)
        for wrap in WRAPS:
            _when_imported(wrap.module, functools.partial(_apply_wrap, wrap))


def is_registered() -> bool:
    return _registered


# --- post-import hook -------------------------------------------------------------------------


class _ImportWatcher(importlib.abc.MetaPathFinder):
    """Runs a hook right after one of a few named modules is executed; ignores every other import."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable[[ModuleType], None]]] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        hooks = self.hooks.pop(fullname, None)
        if hooks is None:
            return None
        spec = None
        for finder in sys.meta_path:  # whoever would have found it (path, editable installs, ...)
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_hook(module: ModuleType) -> None:
            vars(loader).pop("exec_module", None)  # one-shot: a shared loader is left as it was
            exec_module(module)
            if module.__name__ == fullname:
                for hook in hooks:
                    hook(module)

        try:
            loader.exec_module = exec_then_hook
        except (AttributeError, TypeError):  # a loader without instance attributes: stay out of the way
            logger.warning("spec_samplers: cannot observe %s (loader %r); the plugin stays inactive", fullname, loader)
        return spec


_watcher = _ImportWatcher()


def _when_imported(module_name: str, hook: Callable[[ModuleType], None]) -> None:
    module = sys.modules.get(module_name)
    if module is not None:
        hook(module)
        return
    _watcher.hooks.setdefault(module_name, []).append(hook)
    if _watcher not in sys.meta_path:
        sys.meta_path.insert(0, _watcher)


# --- constructor observer and seam installation -----------------------------------------------


def _observe_module(module: ModuleType) -> None:
    seam = _SEAMS_BY_MODULE[module.__name__]
    with _lock:
        _originals.setdefault(seam.qualname, getattr(module, seam.attribute))
        cls = getattr(module, OBSERVED_CLASS, None)
        if cls is None or getattr(cls.__init__, _OBSERVER_MARK, False):
            return
        vllm_init = cls.__init__

        @functools.wraps(vllm_init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            vllm_init(self, *args, **kwargs)
            configure_seam(module, _current_vllm_config())

        setattr(__init__, _OBSERVER_MARK, True)
        cls.__init__ = __init__


def _apply_wrap(wrap: Wrap, module: ModuleType) -> None:
    owner: Any = module if wrap.owner is None else getattr(module, wrap.owner, None)
    vllm_function = getattr(owner, wrap.attribute, None)
    if vllm_function is None:  # vLLM's own behaviour (the refusal) stays
        logger.warning("spec_samplers: %s has no %s.%s; not wrapped", wrap.module, wrap.owner, wrap.attribute)
        return
    if getattr(vllm_function, _WRAPPED_MARK, False):
        return
    factory_module, factory_name = wrap.factory.split(":")
    wrapper = getattr(importlib.import_module(factory_module), factory_name)(vllm_function)
    setattr(wrapper, _WRAPPED_MARK, True)
    setattr(owner, wrap.attribute, wrapper)


def _current_vllm_config() -> Any:
    from vllm.config import get_current_vllm_config_or_none

    return get_current_vllm_config_or_none()


def configure_seam(module: ModuleType, vllm_config: Any) -> bool:
    """Install our sampler at ``module``'s seam if ``vllm_config`` asks for one, else make sure
    vLLM's own function is there. Returns whether ours is installed. Raises
    ``SpecSamplersConfigError`` for a bad section."""
    from spec_samplers.integrations.vllm.config import choice_from_vllm_config

    seam = _SEAMS_BY_MODULE[module.__name__]
    choice = choice_from_vllm_config(vllm_config)
    with _lock:
        original = _originals.setdefault(seam.qualname, getattr(module, seam.attribute))
        if choice is None:
            if seam.qualname in _installed:
                setattr(module, seam.attribute, original)
                del _installed[seam.qualname]
                logger.info("spec_samplers: restored vLLM's %s", seam.qualname)
            return False
        factory_module, factory_name = seam.factory.split(":")
        factory = getattr(importlib.import_module(factory_module), factory_name)
        setattr(module, seam.attribute, factory(choice.build(), original))
        description = choice.describe()
        _installed[seam.qualname] = description
        if (seam.qualname, description) not in _logged:
            _logged.add((seam.qualname, description))
            logger.info("spec_samplers: replaced %s with %s (%s runner)", seam.qualname, description, seam.runner)
        return True


def installed() -> dict[str, str]:
    """Seam qualname -> the sampler installed there, for the seams currently replaced."""
    return dict(_installed)


def original(qualname: str) -> Callable[..., Any] | None:
    """vLLM's own function at a seam (None until vLLM has imported its module)."""
    return _originals.get(qualname)
