"""Tree block verification (Traversal Verification, spec_samplers.tree.traversal): exactness of
the whole output for every tree shape and sibling policy, the chain case (block verification's
tokens), acceptance, and the entries.

Statistical tests reuse tests/test_tree.py's harness: chi-square over the V**3 = 64 cells of the
first three emitted tokens (missing tokens completed by fresh target samples), CHI2_ALPHA = 1e-3
per test, fixed seeds.
"""

from __future__ import annotations

import pytest
import torch
from stats_helpers import CHI2_ALPHA
from test_tree import B, _law_pvalue
from tree_cases import POLICIES, SHAPES, P, Q, V, depth_rows, draw_tree_tokens, ragged_from_padded, tree_workload

from spec_samplers import BlockVerificationSampler, RejectionSampler
from spec_samplers.errors import SpecSamplerInputError


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


def test_per_request_trees_with_padding_nodes_and_ragged():
    """[B, N] parents: half the batch a binary tree, half an uneven one padded with -1 parents;
    the ragged form gives the same tokens, and both have the target's law."""
    gen = torch.Generator().manual_seed(121)
    a, b = SHAPES["binary"], SHAPES["uneven"][:4]
    parents = torch.tensor([a, b + [-1, -1]] * (B // 2), dtype=torch.int64)
    tokens = draw_tree_tokens(parents, "without_replacement", gen)
    target, draft = depth_rows(Q, parents), depth_rows(P, parents)
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    sampler = BlockVerificationSampler()
    out = sampler.forward_tree(target, draft, tokens, parents, "without_replacement", seeds=seeds)
    assert _law_pvalue(out.token_ids, 123) > CHI2_ALPHA
    t, d, toks, pars, cu = ragged_from_padded(target, draft, tokens, parents, [6, 4] * (B // 2))
    ragged = sampler.forward_tree_ragged(t, d, toks, pars, cu, 6, "without_replacement", seeds=seeds)
    assert torch.equal(ragged.token_ids, out.token_ids)
    assert torch.equal(ragged.node_ids, out.node_ids)


@pytest.mark.parametrize("policy", POLICIES)
def test_ragged_equals_padded(policy):
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["uneven"], policy, 64, seed=131)
    counts = [6, 3, 0, 5] * 16
    parents = parents.clone()
    for row, n in enumerate(counts):
        parents[row, n:] = -1
    sampler = BlockVerificationSampler()
    padded = sampler.forward_tree(target, draft, tokens, parents, policy, seeds=seeds, max_depth=3)
    t, d, toks, pars, cu = ragged_from_padded(target, draft, tokens, parents, counts)
    ragged = sampler.forward_tree_ragged(t, d, toks, pars, cu, 6, policy, seeds=seeds, max_depth=3)
    assert torch.equal(ragged.token_ids, padded.token_ids) and torch.equal(ragged.node_ids, padded.node_ids)


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


def test_ragged_logits_equals_padded_logits():
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "independent", 32, seed=159)
    t = torch.rand(32) + 0.3
    t[::5] = 0.0  # greedy requests
    sampler = BlockVerificationSampler()
    padded = sampler.forward_tree_from_logits(target.log(), draft.log(), tokens, parents, t, seeds=seeds)
    tr, dr, toks, pars, cu = ragged_from_padded(target.log(), draft.log(), tokens, parents, [6] * 32)
    ragged = sampler.forward_tree_ragged_from_logits(tr, dr, toks, pars, cu, 6, t, seeds=seeds)
    assert torch.equal(ragged.token_ids, padded.token_ids)


def _chain_inputs(k: int, Bc: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(Bc, k + 1, 9, generator=gen), -1)
    draft = torch.softmax(torch.randn(Bc, k + 1, 9, generator=gen), -1)
    ids = torch.multinomial(draft[:, :k].reshape(-1, 9), 1, generator=gen).view(Bc, k)
    return target, draft, ids, torch.randint(0, 2**62, (Bc,), generator=gen)


@pytest.mark.parametrize("policy", POLICIES)
def test_chain_as_tree_is_block_verification(policy):
    """parents = [0, 1, .., k-1]: block verification's chain tokens (same random numbers; its
    bonus id out of range, so that it samples its bonus row as the tree does), hence its law."""
    k, Bc = 4, 512
    target, draft, ids, seeds = _chain_inputs(k, Bc, 167)
    sampler = BlockVerificationSampler()
    point_mass = policy == "deterministic"
    tree = sampler.forward_tree(target, None if point_mass else draft, ids, list(range(k)), policy, seeds=seeds)
    chain = sampler(target, torch.full((Bc, 1), -1), None if point_mass else draft[:, :k], ids, seeds=seeds)
    assert torch.equal(tree.token_ids, chain)


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
    """Expected accepted length: the tree's >= its first branch's alone (nodes 1 and 3). Not
    row by row: the traversal spends the uniforms differently once a node is rejected."""
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], policy, 6000, seed=161)
    sampler = BlockVerificationSampler()
    tree = sampler.forward_tree(target, draft, tokens, parents, policy, seeds=seeds)
    branch_parents = parents.clone()
    branch_parents[:, [1, 3, 4, 5]] = -1  # keep nodes 1 and 3 (= first child of 1)
    branch_parents[:, 2] = 1
    branch = sampler.forward_tree(target, draft, tokens, branch_parents, policy, seeds=seeds, max_depth=2)
    tree_len = (tree.node_ids >= 0).sum(1).float().mean()
    branch_len = (branch.node_ids >= 0).sum(1).float().mean()
    assert tree_len > branch_len + 0.02


def test_greedy_rows_follow_the_argmax_path():
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "deterministic", 64, seed=173)
    greedy = torch.ones(64, dtype=torch.bool)
    greedy[1::2] = False
    out = BlockVerificationSampler().forward_tree(target, draft, tokens, parents, is_greedy=greedy, seeds=seeds)
    ref = RejectionSampler().forward_tree(target, draft, tokens, parents, is_greedy=greedy, seeds=seeds)
    assert torch.equal(out.token_ids[greedy], ref.token_ids[greedy])
    # argmax by depth: Q[0] -> 0, Q[1] -> 3, Q[2] -> 3
    assert bool((out.token_ids[greedy, 0] == 0).all())


def test_counters_count_per_depth():
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "independent", 500, seed=179)
    sampler = BlockVerificationSampler()
    out = sampler.forward_tree(target, draft, tokens, parents, seeds=seeds)
    per_depth = (out.node_ids >= 0).sum(0)
    assert torch.equal(sampler.num_accepted_per_position, per_depth)
    assert int(sampler.num_emitted_tokens) == int((out.token_ids >= 0).sum())


def test_bad_inputs_name_the_argument():
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "independent", 2, seed=1)
    s = BlockVerificationSampler()
    with pytest.raises(SpecSamplerInputError, match="draft_token_ids"):
        s.forward_tree(target, draft, tokens[:, :3], parents, seeds=seeds)
    with pytest.raises(SpecSamplerInputError, match="parents"):
        s.forward_tree(target, draft, tokens, parents[:, :2], seeds=seeds)
    with pytest.raises(SpecSamplerInputError, match="draft_sampling"):
        s.forward_tree(target, draft, tokens, parents, "greedy", seeds=seeds)
    with pytest.raises(SpecSamplerInputError, match="draft_probs"):
        s.forward_tree(target, draft[:, :3], tokens, parents, seeds=seeds)
    with pytest.raises(SpecSamplerInputError, match="parents"):
        BlockVerificationSampler(strict_mode=True).forward_tree(target, draft, tokens, [0, 0, 1, 5, 2, 2], seeds=seeds)


def test_invalid_parents_detach_their_subtree():
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "independent", 256, seed=183)
    bad = parents.clone()
    bad[:, 0] = 4  # node 1's parent after it: node 1 and its subtree (3, 4) are never tried
    out = BlockVerificationSampler().forward_tree(target, draft, tokens, bad, seeds=seeds, max_depth=2)
    assert not bool(((out.node_ids == 1) | (out.node_ids == 3) | (out.node_ids == 4)).any())


def test_nan_rows_and_out_of_range_ids_emit_no_nan_token():
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "without_replacement", 64, seed=189)
    target = target.clone()
    target[::2, 0] = float("nan")  # root row without mass: no token at all
    tokens = tokens.clone()
    tokens[1::4, 0] = V + 3  # out of range: never accepted
    out = BlockVerificationSampler().forward_tree(target, draft, tokens, parents, "without_replacement", seeds=seeds)
    assert bool((out.token_ids[::2] == -1).all())
    assert bool((out.token_ids[1::4, 0] != V + 3).all())
    assert bool(((out.token_ids >= -1) & (out.token_ids < V)).all())
