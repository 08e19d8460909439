"""``spec-samplers bench params``: acceptance with drafts processed alike vs by
temperature only; measured acceptance within Z_BOUND (4.5, false-failure rate 7e-6 per check)
standard errors of the lossless theory sum min(p, q'); JSON document; argument errors."""

from __future__ import annotations

import json

import torch

from spec_samplers.bench import params_bench
from spec_samplers.bench.quality import Z_BOUND
from spec_samplers.cli import main
from spec_samplers.sampling_params import SamplingParams, process_logits


def test_quick_run_tables_and_json(tmp_path, capsys):
    path = tmp_path / "p.json"
    code = main(["bench", "params", "--quick", "--rows", "64", "--vocab", "64", "--k", "2", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "trace: T=0.8 top_p=0.95" in out and "temperature only" in out and "Gain of drafting alike" in out
    doc = json.loads(path.read_text())
    assert doc["schema"] == params_bench.SCHEMA and doc["config"]["vocab_size"] == 64
    results = doc["results"]
    assert len(results) == 2 * len(params_bench.PARAM_SETTINGS)
    for r in results:
        assert abs(r["z"]["acceptance"]) < Z_BOUND and abs(r["z"]["emitted"]) < Z_BOUND, r
        assert r["draft"] in params_bench.DRAFTS and len(r["per_position"]) == 2


def test_theory_is_sum_min_of_the_processed_pair():
    params = SamplingParams(temperature=0.8, top_k=5, min_p=0.05)
    target, draft = params_bench.logits_pairs(3, 40, 2.0, 1.0, seed=0)
    q = process_logits(target, params)
    drafts = params_bench.draft_distributions(draft, params)
    assert torch.equal(drafts["alike"], process_logits(draft, params))
    assert torch.allclose(drafts["temperature only"], torch.softmax(draft / 0.8, -1), atol=1e-6)
    results = params_bench.run(
        k=1, rows=16, vocab_size=40, contexts=3, scales=(2.0,), sigmas=(1.0,), settings=(("x", params),)
    )
    for r in results:
        alpha = float(torch.minimum(q.double(), drafts[r["draft"]].double()).sum(1).mean())
        assert abs(r["theory"]["alpha"] - alpha) < 1e-9


def test_bad_rows(capsys):
    assert main(["bench", "params", "--rows", "1"]) == 2
    assert "--rows: expected an integer >= 2" in capsys.readouterr().err
