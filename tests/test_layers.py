"""Imports run downward: a module may import modules of its own layer or below, never above.

The table is the one in docs/architecture.md. A new module must be given a layer here (the test
fails for a module it does not know), so the layering is a decision made once, when it is added.
Every import counts, including the lazy ones inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "spec_samplers"

#: (layer, module prefixes), bottom to top
LAYERS: list[tuple[int, tuple[str, ...]]] = [
    (0, ("spec_samplers.constants", "spec_samplers.errors", "spec_samplers._version")),
    (
        1,
        (
            "spec_samplers.layout",
            "spec_samplers.torch_ops",
            "spec_samplers.rng",
            "spec_samplers.output",
            "spec_samplers.rng_sampling",
            "spec_samplers.tree.layout",
            "spec_samplers.tree.output",
        ),
    ),
    (2, ("spec_samplers.validation", "spec_samplers.seeding")),
    # the sampling operations, the logits pipe over them and SamplingParams' processing sit with the
    # references: base runs sampling_params= through them
    (
        3,
        (
            "spec_samplers.reference",
            "spec_samplers.kernels",
            "spec_samplers.sampling.reference",
            "spec_samplers.sampling.api",
            "spec_samplers.sampling.checks",
            "spec_samplers.logits_processor",
            "spec_samplers.sampling_params",
            "spec_samplers.tree.reference",
        ),
    ),
    (4, ("spec_samplers.base", "spec_samplers.tree")),
    (5, ("spec_samplers.rejection", "spec_samplers.typical", "spec_samplers.block", "spec_samplers.sampling")),
    (6, ("spec_samplers.registry",)),
    (7, ("spec_samplers.integrations", "spec_samplers.decoding")),
    (8, ("spec_samplers.bench",)),
    (9, ("spec_samplers.cli", "spec_samplers.__init__", "spec_samplers.__main__", "spec_samplers.generate_cli")),
]

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
        raise AssertionError(f"{module}: no layer assigned; add it to tests/test_layers.py and docs/architecture.md")
    return best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 2:
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
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
                if module != "spec_samplers.__init__" and own < 9:
                    problems.append(f"{module} imports the top-level package (layer 9)")
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
