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
