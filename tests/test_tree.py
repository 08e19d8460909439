"""Tree verification (spec_samplers.tree): exactness of the whole output, power, and the entries.

Statistical tests: chi-square over the V**3 = 64 cells of the first three emitted tokens (each
missing token completed by a fresh target sample), at CHI2_ALPHA = 1e-3 per test, fixed seeds.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from stats_helpers import CHI2_ALPHA, chi2_pvalue
from tree_cases import (
    POLICIES,
    SHAPES,
    P,
    Q,
    V,
    complete_three,
    depth_rows,
    draw_tree_tokens,
    joint_three,
    ragged_from_padded,
    tree_workload,
)

from spec_samplers import BlockVerificationSampler, RejectionSampler, SamplingParams, TypicalAcceptanceSampler
from spec_samplers.constants import SpecSamplerInputError

B = 12000
#: the exact tree rules: the entry tests run on each (their laws: here and tests/test_tree_block.py)
EXACT_SAMPLERS = (RejectionSampler, BlockVerificationSampler)


def stable_seed(*names: str) -> int:
    """A fixed seed per parameter set (Python's ``hash`` of a string changes with every process)."""
    return zlib.crc32("/".join(names).encode()) % 1000


def _law_pvalue(token_ids: torch.Tensor, seed: int, q_by_position: torch.Tensor = Q) -> float:
    cells = complete_three(token_ids, torch.Generator().manual_seed(seed + 1), q_by_position)
    return chi2_pvalue(cells, joint_three(q_by_position))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_tree_output_has_the_target_joint_law(shape, policy):
    target, draft, tokens, parents, seeds = tree_workload(SHAPES[shape], policy, B, seed=stable_seed(shape, policy))
    out = RejectionSampler().forward_tree(target, draft, tokens, parents, policy, seeds=seeds)
    assert _law_pvalue(out.token_ids, 7) > CHI2_ALPHA


def test_deterministic_policy_needs_no_draft_probs():
    target, _, tokens, parents, seeds = tree_workload(SHAPES["binary"], "deterministic", B, seed=3)
    out = RejectionSampler().forward_tree(target, None, tokens, parents, "deterministic", seeds=seeds)
    assert _law_pvalue(out.token_ids, 11) > CHI2_ALPHA


def _naive_tree(target, draft, tokens, parents, seeds):
    """TensorRT-LLM's dynamic-tree rule: every sibling tested against the unmodified target,
    min(1, q(c) / p(c)), then a draw of (q - p)+ when all fail. Not exact with >1 sibling."""
    gen = torch.Generator().manual_seed(int(seeds[0]) % 2**31)
    Bn, N = tokens.shape
    cur = torch.zeros(Bn, dtype=torch.int64)
    out = torch.full((Bn, 3), -1, dtype=torch.int64)
    length = torch.zeros(Bn, dtype=torch.int64)
    rows = torch.arange(Bn)
    for j in range(1, N + 1):
        tried = parents[:, j - 1] == cur
        q = target[rows, cur]
        p = draft[rows, cur]
        c = tokens[:, j - 1]
        accept = tried & (torch.rand(Bn, generator=gen) < (q[rows, c] / p[rows, c]))
        out[rows[accept], length[accept].clamp(max=2)] = c[accept]
        length = length + accept.long()
        cur = torch.where(accept, j, cur)
    q, p = target[rows, cur], draft[rows, cur]
    is_leaf = ~(parents == cur[:, None]).any(1)
    weights = torch.where(is_leaf[:, None], q, (q - p).clamp_min(0) + 1e-12)
    final = torch.multinomial(weights, 1, generator=gen).squeeze(1)
    out[rows, length.clamp(max=2)] = torch.where(length < 3, final, out[rows, length.clamp(max=2)])
    return out


@pytest.mark.parametrize("shape", ["binary", "wide_root"])
def test_a_naive_verifier_fails_the_same_test(shape):
    """Power: siblings judged against the unmodified target fail the joint-law test."""
    target, draft, tokens, parents, seeds = tree_workload(SHAPES[shape], "independent", B, seed=5)
    assert _law_pvalue(_naive_tree(target, draft, tokens, parents, seeds), 13) < CHI2_ALPHA


def test_a_wrong_policy_fails_the_same_test():
    """Power: siblings drawn without replacement but verified as independent are not exact."""
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "without_replacement", B, seed=9)
    out = RejectionSampler().forward_tree(target, draft, tokens, parents, "independent", seeds=seeds)
    assert _law_pvalue(out.token_ids, 17) < CHI2_ALPHA


@pytest.mark.parametrize("sampler_cls", EXACT_SAMPLERS)
def test_per_request_trees_with_padding_nodes_and_ragged(sampler_cls):
    """[B, N] parents: half the batch a binary tree, half an uneven one padded with -1 parents;
    the ragged form of the same trees gives the same tokens, and both have the target's law."""
    gen = torch.Generator().manual_seed(21)
    a, b = SHAPES["binary"], SHAPES["uneven"][:4]
    parents = torch.tensor([a, b + [-1, -1]] * (B // 2), dtype=torch.int64)

    tokens = draw_tree_tokens(parents, "independent", gen)
    target, draft = depth_rows(Q, parents), depth_rows(P, parents)
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    sampler = sampler_cls()
    out = sampler.forward_tree(target, draft, tokens, parents, "independent", seeds=seeds)
    assert _law_pvalue(out.token_ids, 23) > CHI2_ALPHA
    counts = [6, 4] * (B // 2)
    t, d, toks, pars, cu = ragged_from_padded(target, draft, tokens, parents, counts)
    ragged = sampler.forward_tree_ragged(t, d, toks, pars, cu, 6, "independent", seeds=seeds)
    assert torch.equal(ragged.token_ids, out.token_ids)
    assert torch.equal(ragged.node_ids, out.node_ids)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("sampler_cls", EXACT_SAMPLERS)
def test_ragged_equals_padded(sampler_cls, policy):
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["uneven"], policy, 64, seed=31)
    counts = [6, 3, 0, 5] * 16
    parents = parents.clone()
    for row, n in enumerate(counts):
        parents[row, n:] = -1
    sampler = sampler_cls()
    padded = sampler.forward_tree(target, draft, tokens, parents, policy, seeds=seeds, max_depth=3)
    t, d, toks, pars, cu = ragged_from_padded(target, draft, tokens, parents, counts)
    ragged = sampler.forward_tree_ragged(t, d, toks, pars, cu, 6, policy, seeds=seeds, max_depth=3)
    assert torch.equal(ragged.token_ids, padded.token_ids) and torch.equal(ragged.node_ids, padded.node_ids)


@pytest.mark.parametrize("policy", ["independent", "without_replacement"])
def test_logits_entry_has_the_tempered_target_law(policy):
    T = 0.7
    q_t = torch.softmax(Q.log() / T, -1)
    p_t = torch.softmax(P.log() / T, -1)

    gen = torch.Generator().manual_seed(41)
    parents = torch.tensor(SHAPES["binary"])[None, :].expand(B, -1)
    tokens = draw_tree_tokens(parents, policy, gen, p_t)
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    target_logits = depth_rows(Q.log(), parents)
    draft_logits = depth_rows(P.log(), parents)
    temperature = torch.full((B,), T)
    out = RejectionSampler().forward_tree_from_logits(
        target_logits, draft_logits, tokens, SHAPES["binary"], temperature, policy, seeds=seeds
    )
    assert _law_pvalue(out.token_ids, 43, q_t) > CHI2_ALPHA


def test_logits_entry_with_sampling_params_top_k():
    """top_k = 2 on target and draft alike: exact for the processed target."""
    params = SamplingParams(temperature=1.0, top_k=2)

    def top2(d: torch.Tensor) -> torch.Tensor:
        keep = d >= d.topk(2, dim=-1).values[:, -1:]
        return torch.where(keep, d, 0.0) / torch.where(keep, d, 0.0).sum(-1, keepdim=True)

    q_k, p_k = top2(Q), top2(P)

    gen = torch.Generator().manual_seed(47)
    parents = torch.tensor(SHAPES["wide_root"])[None, :].expand(B, -1)
    tokens = draw_tree_tokens(parents, "independent", gen, p_k)
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    out = RejectionSampler().forward_tree_from_logits(
        depth_rows(Q.log(), parents), depth_rows(P.log(), parents), tokens, SHAPES["wide_root"],
        sampling_params=params, seeds=seeds,
    )  # fmt: skip
    assert _law_pvalue(out.token_ids, 53, q_k) > CHI2_ALPHA


@pytest.mark.parametrize("sampler_cls", EXACT_SAMPLERS)
def test_ragged_logits_equals_padded_logits(sampler_cls):
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "independent", 32, seed=59)
    t = torch.rand(32) + 0.3
    t[::5] = 0.0  # greedy requests
    sampler = sampler_cls()
    padded = sampler.forward_tree_from_logits(target.log(), draft.log(), tokens, parents, t, seeds=seeds)
    tr, dr, toks, pars, cu = ragged_from_padded(target.log(), draft.log(), tokens, parents, [6] * 32)
    ragged = sampler.forward_tree_ragged_from_logits(tr, dr, toks, pars, cu, 6, t, seeds=seeds)
    assert torch.equal(ragged.token_ids, padded.token_ids)


def tree_and_first_branch_lengths(sampler, policy: str, Bt: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted lengths [Bt] of the binary tree and of its first branch alone (nodes 1 and 3,
    the first child of 1) on the same inputs and seeds."""
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], policy, Bt, seed=seed)
    tree = sampler.forward_tree(target, draft, tokens, parents, policy, seeds=seeds)
    branch_parents = parents.clone()
    branch_parents[:, [1, 3, 4, 5]] = -1
    branch_parents[:, 2] = 1
    branch = sampler.forward_tree(target, draft, tokens, branch_parents, policy, seeds=seeds, max_depth=2)
    return (tree.node_ids >= 0).sum(1), (branch.node_ids >= 0).sum(1)


@pytest.mark.parametrize("policy", POLICIES)
def test_tree_accepts_at_least_its_first_branch(policy):
    """Same seeds: the first branch alone (first children only) is tested with the same numbers,
    so the tree's accepted length is >= the branch's on every row, and larger on average."""
    tree_len, branch_len = tree_and_first_branch_lengths(RejectionSampler(), policy, 4000, 61)
    assert bool((tree_len >= branch_len).all())
    assert tree_len.float().mean() > branch_len.float().mean() + 0.05


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("sampler_cls", EXACT_SAMPLERS)
def test_chain_as_tree_is_the_chain_entry(sampler_cls, policy):
    """parents = [0, 1, .., k-1]: the chain entry's tokens (its bonus id out of range, so that it
    samples its bonus row as the tree does), hence its law."""
    k, Bc = 4, 256
    gen = torch.Generator().manual_seed(67)
    target = torch.softmax(torch.randn(Bc, k + 1, 9, generator=gen), -1)
    draft = torch.softmax(torch.randn(Bc, k + 1, 9, generator=gen), -1)
    ids = torch.multinomial(draft[:, :k].reshape(-1, 9), 1, generator=gen).view(Bc, k)
    seeds = torch.randint(0, 2**62, (Bc,), generator=gen)
    sampler = sampler_cls()
    point_mass = policy == "deterministic"
    tree = sampler.forward_tree(target, None if point_mass else draft, ids, list(range(k)), policy, seeds=seeds)
    bonus = torch.full((Bc, 1), -1)
    chain = sampler(target, bonus, None if point_mass else draft[:, :k], ids, seeds=seeds)
    assert torch.equal(tree.token_ids, chain)


def test_typical_chain_as_tree_is_the_chain_entry():
    gen = torch.Generator().manual_seed(71)
    target = torch.softmax(3 * torch.randn(64, 4, 7, generator=gen), -1)
    ids = torch.argmax(target[:, :3] + 0.3 * torch.rand(64, 3, 7, generator=gen), -1)
    sampler = TypicalAcceptanceSampler()
    tree = sampler.forward_tree(target, None, ids, [0, 1, 2])
    chain = sampler(target, torch.full((64, 1), -1), None, ids)
    assert torch.equal(tree.token_ids, chain)


def test_typical_tree_takes_the_longest_passing_path():
    q = torch.full((1, 6, 5), 0.01)
    q[..., 0] = 0.96  # every row confident in token 0
    parents = [0, 0, 1, 2, 4]  # node 1 -> 3; node 2 -> 4 -> 5
    ids = torch.tensor([[0, 0, 3, 0, 0]])  # node 3 fails (token 3); path 2 -> 4 -> 5 passes
    out = TypicalAcceptanceSampler().forward_tree(q, None, ids, parents)
    assert out.node_ids.tolist() == [[2, 4, 5]]
    assert out.token_ids.tolist() == [[0, 0, 0, 0]]


@pytest.mark.parametrize("sampler_cls", EXACT_SAMPLERS)
def test_greedy_rows_follow_the_argmax_path(sampler_cls):
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "deterministic", 64, seed=73)
    greedy = torch.ones(64, dtype=torch.bool)
    out = sampler_cls().forward_tree(target, draft, tokens, parents, is_greedy=greedy, seeds=seeds)
    # argmax by depth: Q[0] -> 0, Q[1] -> 3, Q[2] -> 3
    for row in range(64):
        expect, node = [], 0
        for best in [0, 3, 3]:
            kids = [j for j in range(1, 7) if parents[row, j - 1] == node and tokens[row, j - 1] == best]
            expect.append(best)
            if not kids:
                break
            node = kids[0]
        assert out.token_ids[row, : len(expect)].tolist() == expect


@pytest.mark.parametrize("sampler_cls", EXACT_SAMPLERS)
def test_counters_count_per_depth(sampler_cls):
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "independent", 500, seed=79)
    sampler = sampler_cls()
    out = sampler.forward_tree(target, draft, tokens, parents, seeds=seeds)
    per_depth = (out.node_ids >= 0).sum(0)
    assert torch.equal(sampler.num_accepted_per_position, per_depth)
    assert int(sampler.num_accepted_tokens) == int(per_depth.sum())
    assert int(sampler.num_emitted_tokens) == int((out.token_ids >= 0).sum())
    assert sampler.num_draft_tokens == 500 * 6


@pytest.mark.parametrize("sampler_cls", EXACT_SAMPLERS)
def test_bad_inputs_name_the_argument(sampler_cls):
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "independent", 2, seed=1)
    s = sampler_cls()
    with pytest.raises(SpecSamplerInputError, match="draft_token_ids"):
        s.forward_tree(target, draft, tokens[:, :3], parents, seeds=seeds)
    with pytest.raises(SpecSamplerInputError, match="parents"):
        s.forward_tree(target, draft, tokens, parents[:, :2], seeds=seeds)
    with pytest.raises(SpecSamplerInputError, match="draft_sampling"):
        s.forward_tree(target, draft, tokens, parents, "greedy", seeds=seeds)
    with pytest.raises(SpecSamplerInputError, match="parents"):
        sampler_cls(strict_mode=True).forward_tree(target, draft, tokens, [0, 0, 1, 5, 2, 2], seeds=seeds)
    with pytest.raises(SpecSamplerInputError, match="seeds"):
        TypicalAcceptanceSampler().forward_tree(target, None, tokens, parents, seeds=seeds)


@pytest.mark.parametrize("sampler_cls", EXACT_SAMPLERS)
def test_invalid_parents_detach_their_subtree(sampler_cls):
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "independent", 256, seed=83)
    bad = parents.clone()
    bad[:, 0] = 4  # node 1's parent after it: node 1 and its subtree (3, 4) are never tried
    out = sampler_cls().forward_tree(target, draft, tokens, bad, seeds=seeds, max_depth=2)
    assert not bool(((out.node_ids == 1) | (out.node_ids == 3) | (out.node_ids == 4)).any())


@pytest.mark.parametrize("sampler_cls", EXACT_SAMPLERS)
def test_nan_rows_and_out_of_range_ids_emit_no_nan_token(sampler_cls):
    target, draft, tokens, parents, seeds = tree_workload(SHAPES["binary"], "independent", 64, seed=89)
    target = target.clone()
    target[::2, 0] = float("nan")  # root row without mass: no token at all
    tokens = tokens.clone()
    tokens[1::4, 0] = V + 3  # out of range: never accepted
    out = sampler_cls().forward_tree(target, draft, tokens, parents, seeds=seeds)
    assert bool((out.token_ids[::2] == -1).all())
    assert bool((out.token_ids[1::4, 0] != V + 3).all())
    assert bool(((out.token_ids >= -1) & (out.token_ids < V)).all())
