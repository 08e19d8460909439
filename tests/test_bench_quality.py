"""The benchmark's measurements: lossless theory, output-TV estimator, V0 baseline, --from-file."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from stats_helpers import binomial_bound

from spec_samplers import RejectionSampler, TypicalAcceptanceSampler
from spec_samplers.bench import quality, workloads
from spec_samplers.bench.baselines import VllmV0RejectionSampler, availability
from spec_samplers.bench.runner import BenchError, resolve_samplers

#: McDiarmid tail used for the TV bounds: P(deviation > t) <= exp(-2 n t^2) = DELTA
DELTA = 1e-6


def _tv_bound(dist: torch.Tensor, rows: int) -> float:
    """Bound on the mean over contexts of TV(empirical, dist) from ``rows`` draws per context,
    exceeded with probability <= DELTA: Jensen's bound on the mean, 0.5 * sum sqrt(d / rows),
    plus McDiarmid's deviation (each of the C * rows draws moves the mean by <= 1 / (C * rows))."""
    C = dist.shape[0]
    mean_bound = float((0.5 * dist.double().div(rows).sqrt().sum(dim=1)).mean())
    return mean_bound + math.sqrt(math.log(1 / DELTA) / (2 * C * rows))


def one_setting_per_kind(softmax_sigma: float) -> list[workloads.Setting]:
    """A softmax, a sparse (top-10) and a point-mass workload: V = 300, 3 contexts."""
    return [
        workloads.softmax_setting(softmax_sigma, 1.0, 300, 3),
        workloads.sparse_setting(2.0, 10, 300, 3),
        workloads.point_setting(1.0, 300, 3),
    ]


@pytest.mark.parametrize("setting", one_setting_per_kind(softmax_sigma=0.5), ids=lambda s: s.kind)
@pytest.mark.parametrize("sampler", [RejectionSampler(), VllmV0RejectionSampler()], ids=["ours", "vllm_v0_torch"])
def test_lossless_matches_theory(setting, sampler):
    """Acceptance and emitted within quality.Z_BOUND standard errors of the theory (false failure
    7e-6 per check), every per-position rate within stats_helpers.binomial_bound, and the first
    token's distribution within the TV bound of the target (false failure 1e-6)."""
    target, draft = workloads.make_pairs(setting, seed=3)
    rows, k = 2000, 3
    m = quality.measure(
        sampler, target, draft, k, rows, seed=5, point_mass_drafts=setting.point_mass_drafts, lossless=True
    )
    assert abs(m["z"]["acceptance"]) < quality.Z_BOUND, m
    assert abs(m["z"]["emitted"]) < quality.Z_BOUND, m
    for measured, expected in zip(m["per_position"], m["theory"]["per_position"]):
        assert abs(measured - expected) < binomial_bound(expected, m["rows"]), (measured, expected)  # Bernoulli per row
    assert m["tv_output"]["estimate"] < _tv_bound(target, rows)
    assert m["tv_output"]["noise_floor"] < _tv_bound(target, rows)
    assert abs(m["tv_output"]["excess_z"]) < quality.Z_BOUND, m["tv_output"]  # TV out is the floor's noise


@pytest.mark.parametrize("rows", [64, 1024])
def test_tv_noise_floor_is_the_exact_mean_and_sd_of_the_estimate_on_exact_draws(rows):
    """tv_noise_floor (De Moivre's closed form) equals the mean of 2000 replicate estimates on
    exact draws within 5 of its standard errors (false failure < 1e-6), and tv_noise_sd their sd
    within 25% (its own relative error is ~6%: a 4-sigma margin)."""
    target, _ = workloads.make_pairs(workloads.softmax_setting(1.0, 0.5, 300, 3), seed=1)
    gen = torch.Generator().manual_seed(11)
    replicates = 2000
    draws = torch.multinomial(target, rows * replicates, replacement=True, generator=gen)
    draws = draws.view(3, replicates, rows).transpose(0, 1)
    counts = torch.zeros(replicates, 3, 300).scatter_add_(2, draws, torch.ones(replicates, 3, rows))
    estimates = (0.5 * (counts.double() / rows - target.double()).abs().sum(-1)).mean(-1)  # [replicates]
    sd = float(estimates.std())
    assert abs(quality.tv_noise_floor(target, rows) - float(estimates.mean())) < 5 * sd / replicates**0.5
    assert abs(quality.tv_noise_sd(target, rows, gen) / sd - 1) < 0.25


@pytest.mark.parametrize("setting", one_setting_per_kind(softmax_sigma=1.0), ids=lambda s: s.kind)
def test_block_verification_matches_its_theory(setting):
    """Block verification against its own theory (P(tau >= i) = E[rho_i], Monte Carlo; closed form
    for point-mass drafts): z within quality.Z_BOUND (its stderr includes the Monte Carlo's), every
    per-position rate within stats_helpers.binomial_bound, and above token-wise theory where the
    drafts are distributions."""
    from spec_samplers.block import BlockVerificationSampler

    target, draft = workloads.make_pairs(setting, seed=4)
    rows, k = 2000, 3
    m = quality.measure(
        BlockVerificationSampler(),
        target,
        draft,
        k,
        rows,
        seed=6,
        point_mass_drafts=setting.point_mass_drafts,
        lossless=True,
        law="block",
    )
    assert m["theory"]["method"] == ("closed form" if setting.point_mass_drafts else "monte carlo")
    assert abs(m["z"]["acceptance"]) < quality.Z_BOUND, m
    assert abs(m["z"]["emitted"]) < quality.Z_BOUND, m
    for measured, expected in zip(m["per_position"], m["theory"]["per_position"]):
        assert abs(measured - expected) < binomial_bound(expected, m["rows"]), (measured, expected)
    token = quality.lossless_theory(target, draft, k)
    if not setting.point_mass_drafts:
        assert m["theory"]["emitted"] > token["emitted"] + 0.01
    else:
        assert m["theory"]["emitted"] == pytest.approx(token["emitted"])
    assert m["tv_output"]["estimate"] < _tv_bound(target, rows)


def _typical_first_token_distribution(
    target: torch.Tensor, draft: torch.Tensor, threshold: float, alpha: float
) -> torch.Tensor:
    """Exact distribution of typical acceptance's first emitted token: x ~ p is kept iff
    q(x) > min(threshold, alpha * exp(-H(q))), otherwise argmax q is emitted. [C, V]."""
    q, p = target.double(), draft.double()
    entropy = -(q * torch.log(q + 1e-5)).sum(dim=1, keepdim=True)
    keep = q > torch.clamp(alpha * torch.exp(-entropy), max=threshold)
    out = p * keep
    rejected = 1 - out.sum(dim=1)
    out[torch.arange(q.shape[0]), q.argmax(dim=1)] += rejected
    return out


@pytest.mark.parametrize("threshold, alpha", [(0.09, 0.3), (0.01, 0.9)])
def test_typical_output_tv_matches_exact(threshold, alpha):
    """The TV estimate of typical acceptance is within the TV bound of the exact TV of its
    first-token distribution from the target (false failure 1e-6)."""
    setting = workloads.softmax_setting(1.0, 1.0, 200, 3)
    target, draft = workloads.make_pairs(setting, seed=11)
    rows = 4000
    sampler = TypicalAcceptanceSampler(posterior_threshold=threshold, posterior_alpha=alpha)
    m = quality.measure(sampler, target, draft, 2, rows, seed=2)
    exact_dist = _typical_first_token_distribution(target, draft, threshold, alpha)
    exact_tv = float((0.5 * (exact_dist - target.double()).abs().sum(dim=1)).mean())
    assert exact_tv > 0.05  # a lossy setting, so the check has teeth
    assert abs(m["tv_output"]["estimate"] - exact_tv) < _tv_bound(exact_dist, rows)
    assert m["theory"] is None and m["z"] is None


def test_theory_closed_form():
    target = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    draft = torch.tensor([[0.5, 0.0, 0.5], [1.0, 0.0, 0.0]])
    t = quality.lossless_theory(target, draft, k=2)
    # a = 0.5 and 1.0: per position mean(a^1), mean(a^2); emitted mean(1 + a + a^2)
    assert t["alpha"] == pytest.approx(0.75)
    assert t["per_position"] == pytest.approx([0.75, 0.625])
    assert t["acceptance"] == pytest.approx(0.6875)
    assert t["emitted"] == pytest.approx(((1 - 0.5**3) / 0.5 + 3) / 2)


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_from_file_layouts(tmp_path, suffix):
    target, draft = workloads.make_pairs(workloads.softmax_setting(1.0, 1.0, 64, 5), seed=0)
    path = str(tmp_path / f"probs{suffix}")
    if suffix == ".pt":
        torch.save({"target_probs": target.half(), "draft_probs": draft}, path)
    else:
        from safetensors.torch import save_file  # in the test extra; optional for users

        save_file({"target_probs": target, "draft_probs": draft}, path)
    setting, q, p = workloads.load_pairs(path)
    assert setting.kind == "file" and setting.contexts == 5 and setting.vocab_size == 64
    assert torch.allclose(p, draft, atol=1e-6) and torch.allclose(q, target, atol=2e-3)
    assert torch.allclose(q.sum(dim=1), torch.ones(5))


def test_from_file_errors(tmp_path, monkeypatch):
    path = str(tmp_path / "bad.pt")
    torch.save({"target_probs": torch.ones(2, 4)}, path)
    with pytest.raises(ValueError, match="missing \\['draft_probs'\\]"):
        workloads.load_pairs(path)
    torch.save({"target_probs": torch.ones(2, 4), "draft_probs": torch.ones(3, 4)}, path)
    with pytest.raises(ValueError, match="draft_probs: expected the shape of target_probs \\(2, 4\\), got \\(3, 4\\)"):
        workloads.load_pairs(path)
    torch.save({"target_probs": -torch.ones(2, 4), "draft_probs": torch.ones(2, 4)}, path)
    with pytest.raises(ValueError, match="target_probs: expected finite, non-negative"):
        workloads.load_pairs(path)
    torch.save({"target_probs": torch.ones(2, 4, dtype=torch.int64), "draft_probs": torch.ones(2, 4)}, path)
    with pytest.raises(ValueError, match="target_probs: expected a float tensor"):
        workloads.load_pairs(path)
    st_path = tmp_path / "x.safetensors"
    st_path.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ValueError, match="pip install safetensors"):
        workloads.load_pairs(str(st_path))


def test_from_file_cli_end_to_end(tmp_path, capsys):
    from spec_samplers.cli import main

    target, draft = workloads.make_pairs(workloads.softmax_setting(0.5, 1.0, 128, 3), seed=1)
    path = str(tmp_path / "probs.pt")
    torch.save({"target_probs": target, "draft_probs": draft}, path)
    assert main(["bench", "--from-file", path, "--rows", "64", "--batch-sizes", "2", "--min-time", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "file probs.pt V=128" in out and "rejection_sampler" in out


def test_option_value_coercion():
    (spec,) = resolve_samplers(
        ["typical_acceptance_sampler"], ["posterior_threshold=1", "posterior_alpha=0.5"], sweep=False
    )
    assert spec.options == {"posterior_threshold": 1.0, "posterior_alpha": 0.5}
    assert isinstance(spec.options["posterior_threshold"], float)
    with pytest.raises(BenchError, match="strict_mode=yes: sampler 'rejection_sampler' expects True or False"):
        resolve_samplers(["rejection_sampler"], ["strict_mode=yes"])
    specs = resolve_samplers(None, ["posterior_alpha=0.2"])  # applies only to the sampler that has it
    assert {s.name: s.options for s in specs} == {
        "block_verification": {},
        "multipath_block_verification": {},
        "rejection_sampler": {},
        "typical_acceptance_sampler": {"posterior_alpha": 0.2},
    }


def test_baseline_availability_reports_reasons():
    status = availability(torch.device("cpu"))
    assert status["vllm_v0_torch"] == {"available": True, "reason": ""}
    for name in ("vllm_v1", "flashinfer"):
        assert status[name]["available"] is False and status[name]["reason"]


def test_typical_first_token_law_is_exact():
    """The law the report uses for typical acceptance's exact TV equals the sampler's output over
    every possible draft token at position 0, weighted by p (typical acceptance is deterministic)."""
    from spec_samplers import TypicalAcceptanceSampler
    from spec_samplers.bench.quality import typical_first_token_law

    g = torch.Generator().manual_seed(11)
    C, V, k = 4, 12, 2
    target = torch.softmax(torch.randn(C, V, generator=g) * torch.tensor([[0.3], [1.0], [3.0], [8.0]]), -1)
    draft = torch.softmax(torch.randn(C, V, generator=g) * 2, -1)
    sampler = TypicalAcceptanceSampler(0.09, 0.3)
    law = typical_first_token_law(target, draft, 0.09, 0.3)
    for c in range(C):
        tgt = target[c].expand(V, k + 1, V)  # one row per possible draft token
        ids = torch.arange(V)[:, None].expand(V, k)
        first = sampler(tgt, torch.zeros(V, 1, dtype=torch.long), None, ids)[:, 0]
        enumerated = torch.zeros(V, dtype=torch.float64).index_add_(0, first, draft[c].double())
        assert torch.allclose(law[c], enumerated, atol=1e-12), (c, law[c], enumerated)
