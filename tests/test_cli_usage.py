"""The ``spec-samplers`` command as a first-time user meets it: every subcommand's --help describes
it and every option, the bench's modes are subcommands (the old mode flags name their
replacement), bad demo arguments are usage errors, and the bench modules import no private name
of another module and form no import circle."""

from __future__ import annotations

import argparse
import ast
import pathlib

import pytest

from spec_samplers.cli import build_parser, main

BENCH = pathlib.Path(__file__).resolve().parents[1] / "spec_samplers" / "bench"


def _subparsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) for every subcommand, nested ones included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _subparsers(sub, (*path, name))


def test_every_subcommand_has_a_description_and_every_option_a_help():
    commands = dict(_subparsers(build_parser()))
    assert {("list",), ("demo",), ("generate",), ("bench",)} <= commands.keys()
    assert {("bench", name) for name in ("verify", "sampling", "params", "models")} <= commands.keys()
    for path, parser in commands.items():
        assert parser.description and len(parser.description) > 40, path
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, (path, action.option_strings or action.dest)


@pytest.mark.parametrize("command", [[], ["bench"], ["bench", "models"], ["demo"], ["generate"]])
def test_help_prints_the_description(capsys, command):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: spec-samplers" in out and "options:" in out


@pytest.mark.parametrize(
    ("argv", "replacement"),
    [
        (["bench", "--models", "t", "d", "--prompt", "x"], "spec-samplers bench models TARGET DRAFT"),
        (["bench", "--ops", "sampling", "--quick"], "spec-samplers bench sampling"),
        (["bench", "--ops=sampling"], "spec-samplers bench sampling"),
        (["bench", "--quick", "--sampling-params"], "spec-samplers bench params"),
    ],
)
def test_old_mode_flags_name_the_subcommand(capsys, argv, replacement):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("spec-samplers bench: error: ") and replacement in err and "is now a subcommand" in err


def test_options_before_a_subcommand_are_refused_not_dropped(capsys):
    assert main(["bench", "--quick", "sampling"]) == 2
    assert "options go after the subcommand: spec-samplers bench sampling --quick" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--k", "-1"], ["--k", "0"], ["--trials", "0"], ["--trials", "x"]])
def test_demo_rejects_bad_counts_as_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["demo", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: spec-samplers demo" in err and "expected an integer >= 1" in err


def test_bench_subcommand_takes_its_own_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "models", "--k", "0", "t", "d"])
    assert exc.value.code == 2 and "--k" in capsys.readouterr().err


def _imports(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every ``from spec_samplers... import`` in the file, lazy ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("spec_samplers"):
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def test_bench_modules_import_no_private_names():
    for path in sorted(BENCH.glob("*.py")):
        for module, names in _imports(path):
            private = [n for n in names if n.startswith("_") and n != "__version__"]
            assert not private, f"{path.name} imports {private} from {module}"


def test_bench_modules_form_no_import_circle():
    graph: dict[str, set[str]] = {}
    for path in BENCH.glob("*.py"):
        deps = set()
        for module, names in _imports(path):
            if module == "spec_samplers.bench":
                deps.update(names)
            elif module.startswith("spec_samplers.bench."):
                deps.add(module.rsplit(".", 1)[1])
        graph[path.stem] = deps

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    circles = sorted(name for name in graph if reaches(name, name, {name}))
    assert not circles, f"bench modules in an import circle: {circles}"
