"""``spec-samplers bench sampling``: runs, prints a row per (op, B, V), writes JSON."""

from __future__ import annotations

import json

from spec_samplers.bench import sampling_ops
from spec_samplers.cli import main


def test_bench_ops_sampling_quick(tmp_path, capsys):
    out = tmp_path / "sampling.json"
    ops = ["top_k_top_p_sampling_from_probs", "top_p_renorm_probs", "chain_speculative_sampling"]
    args = ["bench", "sampling", "--quick", "--threads", "1", "--json", str(out)]
    for op in ops:
        args += ["--op", op]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "floor" in text and all(op in text for op in ops)
    doc = json.loads(out.read_text())
    assert doc["schema"] == "spec-samplers-sampling-bench/1" and doc["bandwidth_gbps"] > 0
    assert {(e["op"], e["batch_size"]) for e in doc["entries"]} == {(op, b) for op in ops for b in (1, 4)}
    for e in doc["entries"]:
        assert e["ours"]["time_s"] > 0 and e["ours"]["floor_share"] > 0
        assert ("torch" in e) == (e["op"] != "chain_speculative_sampling")


def test_bench_ops_sampling_rejects_unknown_op(capsys):
    assert main(["bench", "sampling", "--quick", "--op", "nope"]) == 2
    assert "unknown nope" in capsys.readouterr().err


def test_baselines_mask_what_they_should():
    """The PyTorch comparison points implement the same filters (sort-based)."""
    import torch

    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    assert (sampling_ops.torch_top_k_probs(probs, torch.tensor([2])) > 0).tolist() == [[True, True, False, False]]
    assert (sampling_ops.torch_top_p_probs(probs, torch.tensor([0.65])) > 0).tolist() == [[True, True, False, False]]
    masked = sampling_ops.torch_top_k_top_p(torch.log(probs), torch.tensor([3]), torch.tensor([0.5]))
    assert torch.isfinite(masked).tolist() == [[True, True, False, False]]
