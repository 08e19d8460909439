"""``spec-samplers --help``, ``--version`` and ``list`` answer without importing torch (issue 33):
checked structurally, in a child process (no timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import contextlib, io, json, sys
from spec_samplers.cli import main
out = io.StringIO()
code = None
with contextlib.redirect_stdout(out):
    try:
        code = main({argv!r})
    except SystemExit as exc:  # argparse's --help and --version
        code = exc.code
print(json.dumps({{"code": code, "torch": "torch" in sys.modules, "out": out.getvalue()}}))
"""


def _run(argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(argv=argv)], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["list"], ["list", "--help"], ["-h"]])
def test_answers_without_torch(argv: list[str]) -> None:
    result = _run(argv)
    assert result["code"] in (0, None)
    assert not result["torch"], f"spec-samplers {' '.join(argv)} imported torch"
    assert result["out"].strip()


def test_version_and_list_content() -> None:
    from spec_samplers import __version__
    from spec_samplers.registry import available_samplers, sampler_options

    assert _run(["--version"])["out"].strip() == f"spec-samplers {__version__}"
    listed = _run(["list"])["out"]
    for name, info in available_samplers().items():
        assert name in listed
        # the options read from source are the constructor's, as the loaded class gives them
        for key, default in sampler_options(info.load()).items():
            assert f"{key}={default!r}" in listed


def test_source_options_fall_back_when_not_plain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spec_samplers.registry import source_options

    (tmp_path / "plugin_mod.py").write_text(
        "import torch\n"
        "DEFAULT = 3\n"
        "class Plain(torch.nn.Module):\n"
        "    def __init__(self, a: int = 1, *, b: str = 'x'):\n        super().__init__()\n"
        "class Computed(Plain):\n    def __init__(self, a: int = DEFAULT):\n        super().__init__()\n"
        "class Inherits(Plain):\n    pass\n"
        "class Foreign(torch.nn.Linear):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert source_options("plugin_mod:Plain") == {"a": 1, "b": "x"}
    assert source_options("plugin_mod:Inherits") == {"a": 1, "b": "x"}
    assert source_options("plugin_mod:Computed") is None  # a default that is not a literal
    assert source_options("plugin_mod:Foreign") is None  # a base outside plain source
    assert source_options("plugin_mod:Missing") is None


def test_only_the_chosen_subcommand_is_built() -> None:
    from spec_samplers.cli import build_parser

    parser = build_parser(["list"])
    sub = next(a for a in parser._actions if a.dest == "command")
    assert not any(a.dest == "vocab" for a in sub.choices["bench"]._actions)  # not built
    full = build_parser()
    sub = next(a for a in full._actions if a.dest == "command")
    assert any(a.dest == "vocab" for a in sub.choices["bench"]._actions)
