"""Every python snippet of README.md and of every docs/*.md page runs as pasted, each in a fresh
interpreter on the CPU; every ``spec-samplers`` command line in their bash blocks parses.

* A snippet written as a doctest (lines starting with ``>>>``) runs through doctest, so its shown
  output must match too.
* A snippet that loads transformers models from ``/models/NAME`` directories runs on the tiny test
  pair (tests/tiny_models.py): the first path it names becomes the target, the second the draft.
* A snippet that starts a vLLM engine (``LLM(``) needs a GPU and a model; without CUDA it is
  skipped (benchmarks/gpu_check.py says how to run it on a GPU machine).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
MODEL_PATH = re.compile(r"/models/[\w.\-]+")
#: the model pair the pages write with `spec-samplers tiny-pair pair`
TINY_PAIR_DIR = re.compile(r"[\"']pair/(target|draft)[\"']")

pytestmark = pytest.mark.slow


def _blocks(language: str) -> list[tuple[str, str]]:
    """(page:line, code) of every fenced block of ``language`` in the pages."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text.count("\n", 0, match.start()) + 1
                found.append((f"{page.relative_to(REPO)}:{line}", match.group(2)))
    return found


PYTHON = _blocks("python")
SHELL = _blocks("bash")


def test_the_pages_have_snippets():
    assert len(PYTHON) >= 10 and any(where.startswith("README.md") for where, _ in PYTHON)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """What ``spec-samplers tiny-pair DIR`` writes (the pages' examples use DIR = ``pair``)."""
    from spec_samplers.certify.tiny_models import tiny_pair_with_tokenizer

    pair = tiny_pair_with_tokenizer(tmp_path_factory.mktemp("snippet-models"))
    return pair.target, pair.draft


@pytest.mark.parametrize(("where", "code"), PYTHON, ids=[where for where, _ in PYTHON])
def test_python_snippet_runs_as_pasted(where, code, tmp_path, request):
    if "LLM(" in code and not torch.cuda.is_available():
        pytest.skip("starts a vLLM engine: needs a GPU (benchmarks/gpu_check.py runs it: check_engine_snippets)")
    paths = list(dict.fromkeys(MODEL_PATH.findall(code)))
    if paths:
        assert len(paths) <= 2, f"{where}: a snippet names at most a target and a draft, got {paths}"
        for path, tiny in zip(paths, request.getfixturevalue("tiny_pair"), strict=False):
            code = code.replace(path, tiny)
    if TINY_PAIR_DIR.search(code):  # the pages' `spec-samplers tiny-pair pair`, run in the snippet's folder
        (tmp_path / "pair").symlink_to(Path(request.getfixturevalue("tiny_pair")[0]).parent)
    script = tmp_path / "snippet.py"
    if code.lstrip().startswith(">>>"):
        script = tmp_path / "snippet.txt"
        command = [sys.executable, "-m", "doctest", str(script)]
    else:
        command = [sys.executable, str(script)]
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)  # as a user runs it: PyTorch path on the CPU
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, (
        f"{where} failed:\n{code}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )


def _command_lines(code: str) -> list[list[str]]:
    """The ``spec-samplers`` command lines of a bash block, continuations joined, comments dropped."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words and words[0] == "spec-samplers":
                commands.append(words[1:])
    return commands


SHELL_COMMANDS = [(f"{where} {' '.join(argv)}", argv) for where, code in SHELL for argv in _command_lines(code)]


@pytest.mark.parametrize(("where", "argv"), SHELL_COMMANDS, ids=[where for where, _ in SHELL_COMMANDS])
def test_spec_samplers_command_lines_parse(where, argv, capsys):
    from spec_samplers.bench.cli import moved_flag_message
    from spec_samplers.cli import build_parser

    assert moved_flag_message(argv) is None, where
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 0, f"{where}: {capsys.readouterr().err}"
