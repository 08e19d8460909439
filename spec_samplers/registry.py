"""Sampler discovery through the ``spec_samplers.samplers`` entry-point group.

A third-party package adds a sampler by declaring, in its pyproject.toml::

    [project.entry-points."spec_samplers.samplers"]
    my_sampler = "my_package.module:MySampler"
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import inspect
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ENTRY_POINT_GROUP = "spec_samplers.samplers"
#: built-ins, also found when the distribution's metadata is absent (a source checkout on sys.path)
BUILTIN_SAMPLERS = {
    "rejection_sampler": "spec_samplers.rejection:RejectionSampler",
    "typical_acceptance_sampler": "spec_samplers.typical:TypicalAcceptanceSampler",
    "block_verification": "spec_samplers.block:BlockVerificationSampler",
    "multipath_block_verification": "spec_samplers.multipath:MultipathBlockVerificationSampler",
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
        """Constructor options and their defaults (inspect.Parameter.empty when required).

        Read from the source when it declares them plainly (:func:`source_options`: ``list``
        answers without importing torch), else from the loaded class."""
        found = source_options(self.target)
        return sampler_options(self.load()) if found is None else found


def sampler_options(cls: type) -> dict[str, object]:
    params = inspect.signature(cls).parameters  # the constructor's, without self
    return {
        name: p.default
        for name, p in params.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def _module_source(module: str) -> str | None:
    """The .py file of ``module``, found on sys.path without executing it or its parent packages
    (``importlib.util.find_spec`` would run the parents' ``__init__``, which may import torch)."""
    path: list[str] | None = None
    spec = None
    parts = module.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        try:  # the top level through every finder (an editable install's own), then by path
            spec = importlib.util.find_spec(name) if i == 0 else importlib.machinery.PathFinder.find_spec(name, path)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        path = list(spec.submodule_search_locations or [])
    origin = None if spec is None else spec.origin
    return origin if origin is not None and origin.endswith(".py") else None


def _class_node(module: str, name: str) -> tuple[ast.ClassDef, ast.Module, str] | None:
    """The class ``name`` of ``module`` as parsed source (module not executed), or None."""
    origin = _module_source(module)
    if origin is None:
        return None
    try:
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node, tree, module
    for node in tree.body:  # re-exported: ``from x import name``
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _class_node(node.module, alias.name)
    return None


def _init_options(cls: ast.ClassDef, tree: ast.Module, module: str, depth: int = 0) -> dict[str, object] | bool | None:
    """The options of ``cls.__init__`` from source, following its bases depth first (the first
    ``__init__`` found wins; the MRO of mixins without ``__init__`` before one base class); False
    when neither the class nor a base defines ``__init__``; None when anything is not plain
    source: a base that is not a class of a Python module, a default that is not a literal, or a
    class with a metaclass or ``__new__``."""
    if depth > 8 or cls.keywords:
        return None
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    if "__new__" in methods:
        return None
    init = methods.get("__init__")
    if init is not None:
        a = init.args
        positional = [*a.posonlyargs, *a.args][1:]  # without self
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
        params = list(zip(positional, defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
        options: dict[str, object] = {}
        for arg, default in params:
            try:
                options[arg.arg] = inspect.Parameter.empty if default is None else ast.literal_eval(default)
            except ValueError:
                return None
        return options
    for base in cls.bases:
        if not isinstance(base, ast.Name):
            return None
        found = _base_node(base.id, tree, module)
        if found is None:
            return None
        inherited = _init_options(*found, depth + 1)
        if inherited is not False:  # an __init__ found (or an unknown): it decides
            return inherited
    return False


def _base_node(name: str, tree: ast.Module, module: str) -> tuple[ast.ClassDef, ast.Module, str] | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node, tree, module
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _class_node(node.module, alias.name)
    return None


def source_options(target: str) -> dict[str, object] | None:
    """The constructor options of the class ``"module:Class"`` read from its source without
    importing it (what :func:`sampler_options` gives for a plainly written class), or None when
    the source does not say them plainly (the caller then loads the class)."""
    module, _, name = target.partition(":")
    found = _class_node(module, name) if name and "." not in name else None
    options = None if found is None else _init_options(*found)
    return options if isinstance(options, dict) else None


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


_known: dict[str, SamplerInfo] = {}  # what get_sampler_class last read


def get_sampler_class(name: str) -> type[torch.nn.Module]:
    # Scanning every installed distribution's entry points costs about 0.1 s, paid by each
    # ``generate`` call that names its sampler; a name seen once is served from memory, and an
    # unknown name re-reads the entry points (so a package installed since still shows up).
    global _known
    if name not in _known:
        _known = _discover()
    samplers = _known
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
