"""``spec-samplers generate`` and ``spec-samplers bench models`` on a tiny saved model pair."""

from __future__ import annotations

import json

import pytest
from tiny_models import greedy_text, save_pair

from spec_samplers.cli import main


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("pair"), draft_noise=0.1)


def test_generate_prints_text_acceptance_and_tokens_per_pass(model_dirs, capsys):

    target, draft = model_dirs
    code = main(
        [
            "generate",
            "--target",
            target,
            "--draft",
            draft,
            "--prompt",
            "hello there",
            "--temperature",
            "0",
            "--max-new-tokens",
            "12",
            "--k",
            "3",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0] == greedy_text(target, "hello there", 12)  # greedy = the target's
    assert "tokens per target pass" in out and "acceptance " in out and "lossless expectation" in out


def test_generate_reports_bad_options(model_dirs, capsys):
    target, draft = model_dirs
    assert main(["generate", "--target", target, "--draft", draft, "--prompt", "ab", "--top-p", "0"]) == 2
    assert "top_p: expected a number in (0, 1]" in capsys.readouterr().err
    assert main(["generate", "--target", target + "-missing", "--draft", draft, "--prompt", "ab"]) == 2
    assert f"--target: {target}-missing does not exist" in capsys.readouterr().err


def test_generate_names_a_missing_model_directory_before_loading_anything(capsys, monkeypatch):
    import spec_samplers.integrations.transformers as hf

    def fail(*args, **kwargs):
        raise AssertionError("nothing may be loaded for a missing directory")

    monkeypatch.setattr(hf, "require_transformers", fail)
    assert main(["generate", "--target", "/no/such/dir", "--draft", "/no/such/draft", "--prompt", "ab"]) == 2
    err = capsys.readouterr().err
    assert "--target: /no/such/dir does not exist" in err and "local model directory" in err


def test_bench_models_reports_acceptance_and_speedup(model_dirs, capsys, tmp_path):
    target, draft = model_dirs
    path = tmp_path / "models.json"
    code = main(
        [
            "bench",
            "models",
            target,
            draft,
            "--prompt",
            "hello",
            "--prompt",
            "abc",
            "--max-new-tokens",
            "8",
            "--k",
            "2",
            "--json",
            str(path),
            "--threads",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    doc = json.loads(path.read_text())
    assert doc["schema"] == "spec-samplers-models/1" and doc["prompts"] == 2
    names = {row["sampler"] for row in doc["samplers"]}
    assert {"rejection_sampler", "typical_acceptance_sampler"} <= names
    for row in doc["samplers"]:
        assert row["tokens"] == 16  # EOS ignored by default: 2 prompts x 8 tokens
        assert 0 <= row["acceptance"] <= 1 and row["speedup"] > 0 and len(row["acceptance_per_position"]) == 2
    assert doc["target_alone"]["tokens"] == 16 and doc["cost_ratio"] > 0
    assert "speedup" in out and "rejection_sampler" in out
