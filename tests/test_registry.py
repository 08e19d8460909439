"""Entry-point registry, including a third-party sampler installed through a real entry point."""

import subprocess
import sys
import textwrap

import pytest
import torch

import spec_samplers
from spec_samplers import (
    RejectionSampler,
    TypicalAcceptanceSampler,
    UnknownSamplerError,
    available_samplers,
    get_sampler,
)


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    """A throwaway distribution on sys.path: a module plus a dist-info declaring the entry point."""
    (tmp_path / "toy_sampler_pkg.py").write_text(
        textwrap.dedent('''
        import torch
        from spec_samplers import SpecDecodeDeterministicBaseSampler, build_output

        class AcceptAllSampler(SpecDecodeDeterministicBaseSampler):
            """Accepts every draft (for tests)."""
            def __init__(self, bonus_override: int = -1, strict_mode: bool = False):
                super().__init__(strict_mode=strict_mode)
                self.bonus_override = bonus_override

            def forward(self, target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids):
                shapes = self._validate(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)
                n = torch.full((shapes.batch_size,), shapes.num_draft_tokens, dtype=torch.int64)
                override = torch.full_like(bonus_token_ids[:, 0], self.bonus_override)
                final = bonus_token_ids[:, 0] if self.bonus_override < 0 else override
                out = build_output(draft_token_ids, n, final)
                self._update_counters(out)
                return out
    ''')
    )
    dist = tmp_path / "toy_sampler_pkg-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-sampler-pkg\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text("[spec_samplers.samplers]\naccept_all = toy_sampler_pkg:AcceptAllSampler\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("toy_sampler_pkg", None)


def test_builtins_registered():
    samplers = available_samplers()
    assert samplers["rejection_sampler"].load() is RejectionSampler
    assert samplers["typical_acceptance_sampler"].load() is TypicalAcceptanceSampler
    assert samplers["rejection_sampler"].package == "spec-samplers"


def test_get_sampler_with_options():
    s = get_sampler("typical_acceptance_sampler", posterior_threshold=0.05, posterior_alpha=0.2)
    assert isinstance(s, TypicalAcceptanceSampler)
    assert (s.posterior_threshold, s.posterior_alpha) == (0.05, 0.2)
    assert get_sampler("rejection_sampler", strict_mode=True).strict_mode


def test_unknown_name_lists_available():
    with pytest.raises(
        UnknownSamplerError,
        match="unknown sampler 'nope'; available: block_verification, multipath_block_verification, rejection_sampler, "
        "typical_acceptance_sampler",
    ):
        get_sampler("nope")


def test_unknown_option_names_it_and_accepted_ones():
    with pytest.raises(
        UnknownSamplerError,
        match="sampler 'typical_acceptance_sampler' has no option 'temperature'; "
        "accepted options: posterior_threshold, posterior_alpha, strict_mode",
    ):
        get_sampler("typical_acceptance_sampler", temperature=1.0)


def test_bad_option_value_is_a_value_error():
    with pytest.raises(ValueError, match="posterior_alpha"):
        get_sampler("typical_acceptance_sampler", posterior_alpha=-1)


def test_third_party_sampler_found_by_name(third_party):
    info = available_samplers()["accept_all"]
    assert info.package == "toy-sampler-pkg"
    assert info.options() == {"bonus_override": -1, "strict_mode": False}
    sampler = get_sampler("accept_all", bonus_override=3)
    target = torch.softmax(torch.randn(2, 3, 5), -1)
    out = sampler(target, torch.zeros(2, 1, dtype=torch.long), None, torch.tensor([[1, 2], [3, 4]]))
    assert out.tolist() == [[1, 2, 3], [3, 4, 3]]
    assert int(sampler.num_accepted_tokens) == 4


def test_cli_list_shows_builtins_and_third_party(third_party):
    import contextlib
    import io

    from spec_samplers.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["list"]) == 0
    text = buf.getvalue()
    assert "rejection_sampler  (spec_samplers.rejection:RejectionSampler, package spec-samplers)" in text
    assert "posterior_threshold=0.09, posterior_alpha=0.3" in text
    assert "accept_all  (toy_sampler_pkg:AcceptAllSampler, package toy-sampler-pkg)" in text


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "spec_samplers.cli", "list"], capture_output=True, text=True, check=True
    )
    assert "typical_acceptance_sampler" in out.stdout


def test_demo_prints_measured_next_to_theory():
    from spec_samplers.bench.presets import run_demo

    rows = run_demo(trials=2000, k=2)
    for r in rows:
        a = r["theory_acceptance"]
        # 2000 rows: 5 standard errors of a proportion
        assert abs(r["measured_acceptance"] - a) <= 5 * (a * (1 - a) / 2000) ** 0.5 + 1e-3


def test_import_without_engines():
    code = "import sys; import spec_samplers; assert 'vllm' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_version():
    assert spec_samplers.__version__
