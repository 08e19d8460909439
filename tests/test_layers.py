"""Imports run downward and round no loop: a module may import modules of its own layer or below,
never above, and the import graph has no cycle (inside a layer either).

The layer table has one source, the table in docs/architecture.md, which this test reads. A new
module must be given a layer there (the test fails for a module it does not know), so the layering
is a decision made once, when it is added. Every import counts, including the lazy ones inside
functions.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "spec_samplers"

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def read_layers(text: str) -> list[tuple[int, tuple[str, ...]]]:
    """(layer, module prefixes) from the layer table of docs/architecture.md: each row's first
    cell is the layer, every backquoted name in its second cell a module (``x/``: the package x)."""
    layers = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        names = re.findall(r"`([^`]+)`", cells[1])
        prefixes = tuple("spec_samplers." + n.rstrip("/").replace("/", ".") for n in names)
        layers.append((int(cells[0]), prefixes))
    return layers


#: (layer, module prefixes), bottom to top
LAYERS: list[tuple[int, tuple[str, ...]]] = read_layers(ARCHITECTURE.read_text())
TOP_LAYER = max(layer for layer, _ in LAYERS)

#: same-or-lower imports that are still forbidden: (importer prefix, imported prefix, why)
FORBIDDEN = [
    ("spec_samplers.kernels", "spec_samplers.reference", "kernels mirror the reference; they must not depend on it"),
    (
        "spec_samplers.kernels",
        "spec_samplers.sampling.reference",
        "kernels mirror the reference; they must not depend on it",
    ),
    ("spec_samplers.integrations", "spec_samplers.reference", "engine adapters call samplers, not the reference"),
]


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer): the longest prefix wins
    for layer, prefixes in LAYERS:
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), layer)
    if best is None:
        raise AssertionError(f"{module}: no layer assigned; add it to the layer table of docs/architecture.md")
    return best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 2:
        parts.pop()
    return ".".join(parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``: annotations only, never run, so they neither
    couple layers at run time nor close a loop."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def imported_modules(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skipped = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # "from pkg import sub" may import a submodule: count pkg.sub when it is one
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                if (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists() or (
                    PACKAGE.parent / Path(*candidate.split(".")) / "__init__.py"
                ).exists():
                    found.add(candidate)
                else:
                    found.add(base)
    return {m for m in found if m == "spec_samplers" or m.startswith("spec_samplers.")}


def test_every_import_runs_downward():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        own = layer_of(module)
        for imported in sorted(imported_modules(path, module)):
            if imported == "spec_samplers":
                if module != "spec_samplers.__init__" and own < TOP_LAYER:
                    problems.append(f"{module} imports the top-level package (layer {TOP_LAYER})")
                continue
            their = layer_of(imported)
            if their > own:
                problems.append(f"{module} (layer {own}) imports {imported} (layer {their})")
            for importer, target, why in FORBIDDEN:
                if module.startswith(importer) and imported.startswith(target):
                    problems.append(f"{module} imports {imported}: {why}")
    assert not problems, "\n".join(problems)


def test_the_checker_sees_a_violation(tmp_path):
    """The checker itself: a kernel importing the reference is reported."""
    path = PACKAGE / "kernels" / "backend.py"
    fake = "from spec_samplers.reference import rejection_reference\nfrom spec_samplers import bench\n"
    tmp = tmp_path / "x.py"
    tmp.write_text(fake)
    found = imported_modules(tmp, module_name(path))
    assert "spec_samplers.reference" in found and "spec_samplers.bench" in found
    assert layer_of("spec_samplers.bench.runner") > layer_of("spec_samplers.kernels.backend")


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (a package by its ``__init__``'s name)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        graph[module] = {
            "spec_samplers.__init__" if m == "spec_samplers" else m for m in imported_modules(path, module)
        }
    for module in graph:
        graph[module] = {m for m in graph[module] if m in graph and m != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    """No loop of imports, inside a layer too (a loop across layers is also an upward import)."""
    found = cycles(import_graph())
    problems = [f"layer {layer_of(c[0])}: {' <-> '.join(c)}" for c in found]
    assert not problems, "\n".join(problems)


def test_the_cycle_finder_sees_a_loop():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_table_is_read_from_the_architecture_page():
    """Every layer 0..TOP_LAYER has modules, and the modules the issues name are placed."""
    assert sorted(layer for layer, _ in LAYERS) == list(range(TOP_LAYER + 1))
    for module in ("spec_samplers.custom_ops", "spec_samplers.engine_seam", "spec_samplers.sampling.api"):
        layer_of(module)
    assert (
        layer_of("spec_samplers.kernels.backend") < layer_of("spec_samplers.base") < layer_of("spec_samplers.rejection")
    )


def test_tooling_stays_off_the_samplers_import_path():
    """Importing the package, every sampler and the sampling operations loads none of the tooling
    (bench/, certify/, the CLIs: layers 8-9 but the namespace), in a fresh process."""
    import os
    import subprocess
    import sys

    code = (
        "import sys, spec_samplers\n"
        "from spec_samplers import BlockVerificationSampler, MultipathBlockVerificationSampler\n"
        "from spec_samplers import RejectionSampler, TypicalAcceptanceSampler, get_sampler\n"
        "import spec_samplers.sampling, spec_samplers.tree\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('spec_samplers'))))\n"
    )
    env_path = str(PACKAGE.parent)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=env_path),
    )
    loaded = out.stdout.split()
    assert "spec_samplers.rejection" in loaded and "spec_samplers.sampling.api" in loaded
    tooling = ("spec_samplers.bench", "spec_samplers.certify", "spec_samplers.cli", "spec_samplers.generate_cli")
    tooling += ("spec_samplers.profile_cli",)
    assert [m for m in loaded if m.startswith(tooling)] == []
