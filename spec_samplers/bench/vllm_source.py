"""Import a few of vLLM's Triton kernel modules from a directory of its Python files, without vLLM.

The GPU check (``benchmarks/gpu_check.py --quick --vllm-src DIR``) times vLLM's Model Runner V2
kernels on machines where vLLM is not installed, and the cost calibration
(``benchmarks/cost_calibration.py``) profiles a kernel of an older vLLM release unpacked from its
wheel next to the installed one. Both need vLLM's kernel files, not vLLM: importing the ``vllm``
package would pull in its engine and its compiled extensions.

:func:`load` imports the named modules from ``DIR/vllm/...``: every ``vllm`` package on the way is
an empty package (its ``__init__.py`` is not run), ``vllm.triton_utils`` is a stub that hands out
Triton itself (what vLLM's module does when Triton is installed), and the ``vllm`` modules already
imported in this process are set aside while it runs and put back afterwards, so the kernels of two
vLLM versions can live in one process. A module missing from ``DIR`` is an ``ImportError`` (never a
silent fall-back to an installed vLLM). :func:`export` copies the modules' files, and those they
import from ``vllm`` (found by reading the source), from the installed vLLM into ``DIR``: the copy
to carry to a GPU machine (never committed: it is vLLM's code).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import shutil
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path

#: Model Runner V2's verification (``rejection_sample``) and its temperature glue
MRV2_MODULES = (
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
    "vllm.v1.worker.gpu.sample.gumbel",
)
#: stubbed, never read from the directory (it resolves vLLM's platform at import)
STUBBED = ("vllm.triton_utils",)


def _triton_utils() -> types.ModuleType:
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice

    stub = types.ModuleType("vllm.triton_utils")
    stub.__dict__.update(triton=triton, tl=tl, tldevice=tldevice, HAS_TRITON=True, LOG2E=1.4426950408889634)
    return stub


class _Given(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType):
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _EmptyPackage(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _SourceTree(importlib.abc.MetaPathFinder):
    """Serves ``vllm`` and its submodules from ``root/vllm`` (packages empty, stubs as given)."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] != "vllm":
            return None
        if fullname in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, _Given(_triton_utils()))
        where = self.root.joinpath(*fullname.split("."))
        if where.is_dir():
            package = importlib.machinery.ModuleSpec(fullname, _EmptyPackage(), is_package=True)
            package.submodule_search_locations = [str(where)]
            return package
        file = where.with_suffix(".py")
        if file.is_file():
            return importlib.util.spec_from_file_location(fullname, file)
        raise ModuleNotFoundError(f"vllm_source: {fullname} is not in {self.root} (expected {file})", name=fullname)


def _vllm_names() -> list[str]:
    return [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]


@contextlib.contextmanager
def _set_aside() -> Iterator[None]:
    saved = {name: sys.modules.pop(name) for name in _vllm_names()}
    try:
        yield
    finally:
        for name in _vllm_names():
            del sys.modules[name]
        sys.modules.update(saved)


def load(root: str | Path, modules: Sequence[str] = MRV2_MODULES) -> dict[str, types.ModuleType]:
    """{name: module} of ``modules`` imported from ``root/vllm`` (see the module docstring)."""
    root = Path(root)
    if not (root / "vllm").is_dir():
        raise FileNotFoundError(f"vllm_source: root must hold a vllm/ directory of vLLM's Python files, got {root}")
    finder = _SourceTree(root)
    with _set_aside():
        sys.meta_path.insert(0, finder)
        try:
            return {name: importlib.import_module(name) for name in modules}
        finally:
            sys.meta_path.remove(finder)


def _imports(file: Path) -> set[str]:
    """The ``vllm`` modules a file imports (anywhere in it), as dotted names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "vllm":
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "vllm")
    return found


def export(dest: str | Path, modules: Sequence[str] = MRV2_MODULES, source: str | Path | None = None) -> list[Path]:
    """Copy ``modules`` and the ``vllm`` modules they import from ``source`` (a directory holding
    ``vllm/``; default the installed vLLM's) into ``dest/vllm``, and the version into
    ``dest/VLLM_VERSION``; returns the Python files written."""
    if source is None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("vllm_source.export: vLLM is not installed; pass source=")
        source = Path(next(iter(spec.submodule_search_locations))).parent
        version = importlib.metadata.version("vllm")
    else:
        version = "unknown"
    source, dest = Path(source), Path(dest)
    todo, seen, written = list(modules), set(STUBBED), []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        file = source.joinpath(*name.split(".")).with_suffix(".py")
        if not file.is_file():  # a name imported from a module (a function), or a package
            continue
        target = dest.joinpath(*name.split(".")).with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, target)
        written.append(target)
        todo.extend(_imports(file) - seen)
    (dest / "VLLM_VERSION").write_text(version + "\n")  # read by the GPU check's report
    return written
