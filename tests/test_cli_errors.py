"""User errors of the ``spec-samplers`` command end in one clear line and exit code 2, never a
traceback (issue 33): unknown names, files of another format, unwritable outputs, and runs that
would not fit in memory (refused before allocating)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from spec_samplers.cli import main


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_profile_unknown_sampler(capsys) -> None:
    err = _error(capsys, "profile", "--sampler", "bogus", "--no-sass")
    assert "--sampler" in err and "'bogus'" in err and "rejection_sampler" in err


def test_profile_bad_size(capsys) -> None:
    assert "--k: expected an integer >= 1, got 0" in _error(capsys, "profile", "--k", "0")


def test_from_file_of_another_format(capsys, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("these are notes, not tensors\n")
    err = _error(capsys, "bench", "--from-file", str(notes), "--quick")
    assert "--from-file" in err and "torch.save" in err and "notes.txt" in err
    fake = tmp_path / "pairs.safetensors"
    fake.write_text("not a safetensors file")
    assert ".safetensors" in _error(capsys, "bench", "--from-file", str(fake), "--quick")


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--quick", "--no-timing", "--json", "{file}/x.json"],
        ["bench", "trees", "--quick", "--json", "{file}/x.json"],
        ["profile", "--no-sass", "--json", "{dir}"],
        ["bench", "--quick", "--no-timing", "--plot", "{file}/x.png"],
    ],
)
def test_unwritable_output_refused_before_the_run(capsys, tmp_path: Path, argv: list[str]) -> None:
    afile = tmp_path / "a_file"
    afile.write_text("")
    argv = [a.format(file=afile, dir=tmp_path) for a in argv]
    err = _error(capsys, *argv)
    assert "--json" in err or "--plot" in err


def test_trees_vocab_too_small(capsys) -> None:
    assert "--vocab: expected an integer >= 4" in _error(capsys, "bench", "trees", "--vocab", "2", "--quick")


def test_bench_refuses_a_run_that_does_not_fit(capsys) -> None:
    """The run of the issue: 576 GB of timed inputs; refused at once, naming the options."""
    err = _error(capsys, "bench", "--vocab", "1000000000", "--quick")
    assert "--vocab" in err and "needs about" in err and "available" in err


def test_bench_refuses_rows_that_do_not_fit(capsys) -> None:
    err = _error(capsys, "bench", "--quick", "--no-timing", "--rows", "1000000000000")
    assert "--rows" in err and "needs about" in err


def test_check_fits() -> None:
    from spec_samplers.memory_budget import MemoryBudgetError, available_bytes, check_fits

    check_fits(10, "x", "--opt", available=100)
    with pytest.raises(MemoryBudgetError, match=r"--opt: x needs about 2\.0 kB .* 1\.0 kB available"):
        check_fits(2000, "x", "--opt", available=1000)
    avail = available_bytes()
    assert avail is None or avail > 0


def test_generate_refuses_models_that_do_not_fit(tmp_path: Path) -> None:
    from spec_samplers.generate_cli import check_models_fit, model_bytes
    from spec_samplers.memory_budget import MemoryBudgetError

    for name in ("target", "draft"):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text('{"torch_dtype": "bfloat16"}')
        with open(d / "model.safetensors", "wb") as f:
            f.truncate(10**12)  # sparse: a terabyte on paper, nothing on disk
    assert model_bytes(str(tmp_path / "target"), "float32") == int(2 * 10**12 * 1.25)
    args = argparse.Namespace(target=str(tmp_path / "target"), draft=str(tmp_path / "draft"), model_dtype="auto")
    with pytest.raises(MemoryBudgetError, match="--target / --draft / --model-dtype"):
        check_models_fit(args, __import__("torch").device("cpu"))


def test_from_file_directory(capsys, tmp_path: Path) -> None:
    err = _error(capsys, "bench", "--from-file", str(tmp_path), "--quick")
    assert "--from-file" in err and "expected a file" in err and "got a directory" in err


def test_demo_refuses_what_does_not_fit(capsys) -> None:
    """Issue 39: --trials 10^8 ran past 2 minutes at 5 GB, 10^9 ended in an allocation traceback."""
    assert "--trials: expected at most 10000000" in _error(capsys, "demo", "--trials", "1000000000")
    err = _error(capsys, "demo", "--trials", "10000000", "--k", "100000")
    assert "--trials / --k" in err and "needs about" in err


def test_tiny_pair_refuses_to_overwrite(capsys, tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    assert "pass --overwrite" in _error(capsys, "tiny-pair", str(tmp_path))
    assert "got a file" in _error(capsys, "tiny-pair", str(tmp_path / "target" / "config.json"))


#: the commands of issue 39's defects, each ending in exit 2 (or exit 0 for generate) with no
#: traceback under a 4 GB address-space cap ({pair}: a tiny pair written by spec-samplers tiny-pair)
CAPPED = [
    (["certify", "--engine", "spec-samplers", "--prompts", "1,2,99999", "--work-dir", "{tmp}/w"], 2),
    (["demo", "--trials", "1000000000"], 2),
    (["demo", "--trials", "100000000"], 2),
    (["generate", "--target", "{pair}/target", "--draft", "{pair}/draft", "--prompt", "hello",
      "--max-new-tokens", "1000000000", "--device", "cpu", "--seed", "0"], 0),
]  # fmt: skip

NUMPY_INTO_A_SAMPLER = """
import torch
from spec_samplers import RejectionSampler
t = torch.softmax(torch.randn(2, 4, 8), -1)
ids, bonus = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 1, dtype=torch.long)
try:
    RejectionSampler()(t.numpy(), bonus, t[:, :3], ids)
except ValueError as exc:
    print(exc)
"""


@pytest.mark.not_quick  # five fresh interpreters (torch, transformers), a tiny pair written and generated from
def test_issue_39_defects_under_a_4gb_address_space_cap(tmp_path: Path) -> None:
    import os
    import resource
    import subprocess
    import sys

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4_000_000 * 1024, 4_000_000 * 1024))

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)  # as a user runs it

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, *argv]
        return subprocess.run(command, env=env, capture_output=True, text=True, preexec_fn=capped, cwd=tmp_path)

    made = run("-m", "spec_samplers.cli", "tiny-pair", str(tmp_path / "pair"))
    assert made.returncode == 0, made.stderr[-2000:]
    for argv, code in CAPPED:
        argv = [a.format(tmp=tmp_path, pair=tmp_path / "pair") for a in argv]
        proc = run("-m", "spec_samplers.cli", *argv)
        assert proc.returncode == code and "Traceback" not in proc.stderr, (argv, proc.stderr[-2000:])
        if code == 2:
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        else:
            assert "tokens in" in proc.stdout and "stopped at EOS" in proc.stdout
    proc = run("-c", NUMPY_INTO_A_SAMPLER)
    assert proc.stdout.strip() == "target_with_bonus_probs: expected a torch.Tensor, got numpy.ndarray", proc.stderr
