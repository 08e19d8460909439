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

``WRAPS`` lists the few other vLLM functions wrapped on import (min_p_logit_bias.py: min_p and
logit_bias with speculative decoding; V1's ``expand_batch_to_tokens``, broken on vLLM's CPU build
(vLLM issue #55005); V1's ``RejectionSampler.forward`` and Model Runner V2's
``RejectionSampler._verify``, whose plain steps skip vLLM's glue when our sampler is installed at
the seam, and V2's ``Sampler.add_request``, which records what they read); each wrapper reads the
configuration it is given (or the seam) and, without our section, is vLLM's function.

Each replaced or wrapped function's signature is compared, when it is installed, with the ones our
code was written against (``Seam.signatures``, ``Wrap.signatures``: parameter names, kinds and
defaults, annotations aside). On a mismatch (say a keyword added in a patch release) that function
is left as vLLM's and a warning names it with both signatures: the engine runs vLLM's own path
there, and a bad signature shows at engine start, not as a ``TypeError`` at the first speculative
step. The wraps of one feature (``Wrap.feature``) are used together or not at all
(:func:`feature_installed`).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
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
    #: vLLM's signatures the replacement was written against (:func:`signature_text`), one per
    #: supported version where they differ
    signatures: tuple[str, ...]

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.attribute}"


_V1_REJECTION_SAMPLE_032 = (
    "(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits, "
    "bonus_token_ids, sampling_metadata, synthetic_mode=False, synthetic_conditional_rates=None, "
    "use_fp64_gumbel=False"
)
_V2_REJECTION_SAMPLE_032 = (
    "(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping, "
    "expanded_local_pos, temperature, seed, num_speculative_steps, synthetic_conditional_rates=None, "
    "use_fp64=False, use_block_verification=False, contexts=None, watermarking=None, "
    "watermarking_skip_mask=None, watermark_key=None"
)
SEAMS = (
    Seam(
        "v1",
        "vllm.v1.sample.rejection_sampler",
        "rejection_sample",
        "spec_samplers.integrations.vllm.v1_runner:make_rejection_sample",
        signatures=(
            _V1_REJECTION_SAMPLE_032 + ")",  # vLLM 0.32
            _V1_REJECTION_SAMPLE_032 + ", fly_window_size=None, fly_entropy_threshold=None, fly_entropy_top_k=3)",
        ),
    ),
    Seam(
        "v2",
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
        "rejection_sample",
        "spec_samplers.integrations.vllm.v2_runner:make_rejection_sample",
        signatures=(
            _V2_REJECTION_SAMPLE_032 + ")",  # vLLM 0.32
            _V2_REJECTION_SAMPLE_032 + ", fly_window_size=0, fly_entropy_threshold=0.3, fly_entropy_top_k=3)",
        ),
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
    #: vLLM's signatures the wrapper was written against (:func:`signature_text`)
    signatures: tuple[str, ...]
    #: the wraps of one feature work together: one left as vLLM's turns the feature off
    #: (:func:`feature_installed`)
    feature: str
    #: where vLLM defines the function when ``module`` only imports it, so that a process that
    #: does not import ``module`` (the front end) can check it: :func:`feature_installed`
    defined_in: str | None = None

    @property
    def qualname(self) -> str:
        return ".".join(part for part in (self.module, self.owner, self.attribute) if part)


_MIN_P = "spec_samplers.integrations.vllm.min_p_logit_bias"
_V1 = "spec_samplers.integrations.vllm.v1_runner"
_V2 = "spec_samplers.integrations.vllm.v2_runner"
_V1_SEAM_MODULE = "vllm.v1.sample.rejection_sampler"
#: features made of several wraps (:func:`feature_installed`)
MIN_P_LOGIT_BIAS = "min_p_logit_bias"
WRAPS = (
    # min_p and logit_bias with speculative decoding (min_p_logit_bias.py): validation in the
    # front end, V1's logits processors in the worker (Model Runner V2 processes every row itself)
    Wrap(
        "vllm.sampling_params",
        "SamplingParams",
        "_validate_spec_decode",
        f"{_MIN_P}:validate_spec_decode",
        signatures=("(self, speculative_config)",),
        feature=MIN_P_LOGIT_BIAS,
    ),
    Wrap(
        "vllm.v1.engine.input_processor",
        "InputProcessor",
        "_validate_params",
        f"{_MIN_P}:validate_params",
        signatures=("(self, params, supported_tasks)",),
        feature=MIN_P_LOGIT_BIAS,
    ),
    Wrap(
        "vllm.v1.worker.gpu_model_runner",
        None,
        "build_logitsprocs",
        f"{_MIN_P}:build_logitsprocs",
        signatures=("(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs=())",),
        feature=MIN_P_LOGIT_BIAS,
        defined_in="vllm.v1.sample.logits_processor",
    ),
    Wrap(
        _V1_SEAM_MODULE,
        "RejectionSampler",
        "apply_logits_processors",
        f"{_MIN_P}:apply_logits_processors",
        signatures=("(self, logits, sampling_metadata, metadata)",),
        feature=MIN_P_LOGIT_BIAS,
    ),
    # V1's plain steps verified from the model's logits, bonus rows included (fast_path.py)
    Wrap(
        _V1_SEAM_MODULE,
        "RejectionSampler",
        "forward",
        f"{_V1}:forward",
        signatures=("(self, metadata, draft_probs, logits, sampling_metadata)",),
        feature="v1_plain_steps",
    ),
    # vLLM issue #55005: its CPU build's per-row temperatures are uninitialised memory; ours while
    # our section is installed (v1_runner.expand_batch_to_tokens)
    Wrap(
        _V1_SEAM_MODULE,
        None,
        "expand_batch_to_tokens",
        f"{_V1}:expand_batch_to_tokens",
        signatures=("(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0)",),
        feature="v1_cpu_temperatures",
    ),
    # Model Runner V2's plain chunks verified from the raw logits (fast_path.py), from a
    # per-request flag recorded when the Sampler adds the request (v2_runner.add_request); either
    # one left as vLLM's, no chunk is plain (no flags, or vLLM's _verify)
    Wrap(
        "vllm.v1.worker.gpu.sample.sampler",
        "Sampler",
        "add_request",
        f"{_V2}:add_request",
        signatures=("(self, req_idx, sampling_params)",),
        feature="v2_plain_chunks",
    ),
    Wrap(
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
        "RejectionSampler",
        "_verify",
        f"{_V2}:verify_chunk",
        signatures=(
            "(self, logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping, idx_mapping_np, "
            "expanded_idx_mapping, expanded_local_pos, seq_lens_upper_bound_np, verify_draft_sampled)",
        ),
        feature="v2_plain_chunks",
    ),
)
_WRAPPED_MARK = "__spec_samplers_wraps__"
#: the class, in each seam's module, whose construction tells us the configuration (its
#: ``__init__`` is wrapped by a pass-through that reads none of its arguments: not checked)
OBSERVED_CLASS = "RejectionSampler"
_OBSERVER_MARK = "__spec_samplers_observer__"

_lock = threading.RLock()
_registered = False
_originals: dict[str, Callable[..., Any]] = {}  # seam qualname -> vLLM's function
_installed: dict[str, str] = {}  # seam qualname -> description of our sampler
_logged: set[tuple[str, str]] = set()
_mismatched: dict[str, str] = {}  # qualname -> vLLM's signature, for the functions left as vLLM's
_features: dict[str, bool] = {}  # feature -> feature_installed's answer, once per process


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
    if not signature_matches(wrap.qualname, vllm_function, wrap.signatures, f"feature {wrap.feature!r}"):
        return
    factory_module, factory_name = wrap.factory.split(":")
    wrapper = getattr(importlib.import_module(factory_module), factory_name)(vllm_function)
    setattr(wrapper, _WRAPPED_MARK, True)
    setattr(owner, wrap.attribute, wrapper)


# --- signature checks -------------------------------------------------------------------------


def signature_text(fn: Callable[..., Any]) -> str:
    """``fn``'s signature as ``str(inspect.signature(fn))`` prints it, without annotations
    (names, kinds and defaults are what a call depends on); "(unreadable)" when it has none."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return "(unreadable)"
    bare = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=signature.empty))


def signature_matches(qualname: str, vllm_function: Callable[..., Any], expected: tuple[str, ...], what: str) -> bool:
    """Whether vLLM's function has one of the ``expected`` signatures; if not, a warning (once
    per function and signature) names it, both signatures and what stays vLLM's (``what``)."""
    actual = signature_text(vllm_function)
    if actual in expected:
        return True
    with _lock:
        _mismatched[qualname] = actual
        if (qualname, actual) in _logged:
            return False
        _logged.add((qualname, actual))
    logger.warning(
        "spec_samplers: vLLM's %s has the signature %s, but ours was written against %s; "
        "not installed: vLLM's own %s runs (%s)",
        qualname,
        actual,
        " or ".join(expected),
        qualname.rsplit(".", 1)[-1],
        what,
    )
    return False


def mismatched() -> dict[str, str]:
    """Qualname -> vLLM's signature, for the functions left as vLLM's because their signature
    is not one ours was written against."""
    return dict(_mismatched)


def feature_installed(feature: str) -> bool:
    """Whether every wrap of ``feature`` (``Wrap.feature``) has a signature it was written
    against, so the feature may be used: answered once per process, importing the modules it
    needs (``Wrap.defined_in`` where given) if this process has not. Called by the wrappers when
    our section is set, never on import. A feature whose wraps live in two processes (min_p /
    logit_bias: validation in the front end, processors in the worker) is so on or off in both."""
    answer = _features.get(feature)
    if answer is None:
        answer = True
        for wrap in WRAPS:
            if wrap.feature != feature:
                continue
            module = importlib.import_module(wrap.defined_in or wrap.module)
            owner: Any = module if wrap.owner is None else getattr(module, wrap.owner, None)
            # (inspect.signature reads vLLM's function through our wrapper's __wrapped__)
            vllm_function = getattr(owner, wrap.attribute, None)
            what = f"feature {feature!r}"
            answer &= vllm_function is not None and signature_matches(
                wrap.qualname, vllm_function, wrap.signatures, what
            )
        _features[feature] = answer
    return answer


def _current_vllm_config() -> Any:
    from vllm.config import get_current_vllm_config_or_none

    return get_current_vllm_config_or_none()


def configure_seam(module: ModuleType, vllm_config: Any) -> bool:
    """Install our sampler at ``module``'s seam if ``vllm_config`` asks for one and vLLM's
    function has a signature ours was written against (otherwise a warning, and vLLM's function
    stays), else make sure vLLM's own function is there. Returns whether ours is installed.
    Raises ``SpecSamplersConfigError`` for a bad section."""
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
        if not signature_matches(seam.qualname, original, seam.signatures, f"{seam.runner} runner"):
            if seam.qualname in _installed:
                setattr(module, seam.attribute, original)
                del _installed[seam.qualname]
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
