"""``spec-samplers generate --tree`` / ``--node-budget`` on a tiny saved model pair, and the
tree bench's theory against its Monte Carlo."""

from __future__ import annotations

import pytest
import torch
from tiny_models import greedy_text, save_pair

from spec_samplers.bench import tree_bench
from spec_samplers.cli import main


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("pair"), draft_noise=0.1)


@pytest.mark.parametrize("tree_args", [["--tree", "2,2,1"], ["--node-budget", "6,3", "--expansion", "sampled"]])
def test_generate_with_a_tree_is_the_targets_greedy_text(model_dirs, capsys, tree_args):

    target, draft = model_dirs
    argv = ["generate", "--target", target, "--draft", draft, "--prompt", "hello there", "--temperature", "0"]
    code = main(argv + ["--max-new-tokens", "12", *tree_args, "--draft-sampling", "without_replacement"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0] == greedy_text(target, "hello there", 12)  # greedy = the target's
    assert "tokens per target pass" in out and "per depth" in out


def test_generate_rejects_a_bad_tree(model_dirs, capsys):
    target, draft = model_dirs
    code = main(["generate", "--target", target, "--draft", draft, "--prompt", "a", "--tree", "2,x"])
    assert code == 2 and "--tree" in capsys.readouterr().err


def test_tree_bench_theory_matches_its_monte_carlo():
    q, p = tree_bench.workload(16, 1.0, seed=3)
    for shape, policy in (([1, 1, 1], "independent"), ([2, 2], "independent"), ([3, 1], "deterministic")):
        mean, se = tree_bench.monte_carlo(q, p, shape, policy, rounds=4000, seed=5)
        assert abs(mean - tree_bench.theory(q, p, shape, policy)) < 5 * se + 1e-9
    # a chain's closed form: (1 - a^(k+1)) / (1 - a)
    a = float(torch.minimum(p, q).sum())
    assert tree_bench.theory(q, p, [1] * 4) == pytest.approx((1 - a**5) / (1 - a))


def test_bench_trees_prints_chain_and_tree_rows(capsys, tmp_path):
    import json

    path = tmp_path / "trees.json"
    assert main(["bench", "trees", "--quick", "--vocab", "16", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "chain 10" in out and "tree 2,2,1" in out and "without_replacement" in out
    rows = json.loads(path.read_text())
    assert {r["kind"] for r in rows} == {"chain", "tree"} and all(r["measured"] >= 1 for r in rows)
