"""Tree block verification (Traversal Verification, spec_samplers.tree.traversal): exactness of
the whole output for every tree shape and sibling policy, the chain case (block verification's
tokens), acceptance, and the entries.

The entry tests that hold for every exact tree rule (padded with padding nodes and ragged, with
the law; ragged == padded for each policy; ragged logits == padded logits with greedy rows; the
chain given as a tree == the chain entry, here block verification, token for token; greedy rows;
counters; bad inputs; detached subtrees; NaN rows) run on this sampler too, parametrised by
``EXACT_SAMPLERS`` in tests/test_tree.py. Statistical tests reuse tests/test_tree.py's harness:
chi-square over the V**3 = 64 cells of the first three emitted tokens (missing tokens completed by
fresh target samples), CHI2_ALPHA = 1e-3 per test, fixed seeds.
"""

from __future__ import annotations

import pytest
import torch
from stats_helpers import CHI2_ALPHA
from test_tree import B, _law_pvalue, tree_and_first_branch_lengths
from tree_cases import POLICIES, SHAPES, P, Q, depth_rows, draw_tree_tokens, tree_workload

from spec_samplers import BlockVerificationSampler, RejectionSampler


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_tree_output_has_the_target_joint_law(shape, policy):
    seed = 100 + 10 * list(SHAPES).index(shape) + POLICIES.index(policy)
    target, draft, tokens, parents, seeds = tree_workload(SHAPES[shape], policy, B, seed=seed)
    out = BlockVerificationSampler().forward_tree(target, draft, tokens, parents, policy, seeds=seeds)
    assert _law_pvalue(out.token_ids, seed) > CHI2_ALPHA


def test_deterministic_policy_needs_no_draft_probs():
    target, _, tokens, parents, seeds = tree_workload(SHAPES["uneven"], "deterministic", B, seed=3)
    out = BlockVerificationSampler().forward_tree(target, None, tokens, parents, "deterministic", seeds=seeds)
    assert _law_pvalue(out.token_ids, 11) > CHI2_ALPHA


def test_a_wrong_policy_fails_the_same_test():
    """Power: siblings drawn without replacement but verified as independent are not exact."""
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "without_replacement", B, seed=9)
    out = BlockVerificationSampler().forward_tree(target, draft, tokens, parents, "independent", seeds=seeds)
    assert _law_pvalue(out.token_ids, 17) < CHI2_ALPHA


def test_logits_entry_has_the_tempered_target_law():
    T = 0.7
    q_t = torch.softmax(Q.log() / T, -1)
    p_t = torch.softmax(P.log() / T, -1)
    gen = torch.Generator().manual_seed(141)
    parents = torch.tensor(SHAPES["binary"])[None, :].expand(B, -1)
    tokens = draw_tree_tokens(parents, "without_replacement", gen, p_t)
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    out = BlockVerificationSampler().forward_tree_from_logits(
        depth_rows(Q.log(), parents), depth_rows(P.log(), parents), tokens, SHAPES["binary"],
        torch.full((B,), T), "without_replacement", seeds=seeds,
    )  # fmt: skip
    assert _law_pvalue(out.token_ids, 143, q_t) > CHI2_ALPHA


def _chain_inputs(k: int, Bc: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(Bc, k + 1, 9, generator=gen), -1)
    draft = torch.softmax(torch.randn(Bc, k + 1, 9, generator=gen), -1)
    ids = torch.multinomial(draft[:, :k].reshape(-1, 9), 1, generator=gen).view(Bc, k)
    return target, draft, ids, torch.randint(0, 2**62, (Bc,), generator=gen)


def test_chain_as_tree_accepts_at_least_rejection_sampling():
    k, Bc = 4, 4000
    target, draft, ids, seeds = _chain_inputs(k, Bc, 169)
    block = BlockVerificationSampler().forward_tree(target, draft, ids, list(range(k)), seeds=seeds)
    rejection = RejectionSampler().forward_tree(target, draft, ids, list(range(k)), seeds=seeds)
    block_len = (block.node_ids >= 0).sum(1).float().mean()
    rejection_len = (rejection.node_ids >= 0).sum(1).float().mean()
    assert block_len > rejection_len + 0.02


@pytest.mark.parametrize("policy", POLICIES)
def test_tree_accepts_at_least_its_first_branch(policy):
    """Expected accepted length: the tree's > its first branch's alone (nodes 1 and 3). Not row
    by row: the traversal spends the uniforms differently once a node is rejected."""
    tree_len, branch_len = tree_and_first_branch_lengths(BlockVerificationSampler(), policy, 6000, 161)
    assert tree_len.float().mean() > branch_len.float().mean() + 0.02
