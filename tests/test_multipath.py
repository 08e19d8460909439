"""Greedy multi-path block verification (spec_samplers.tree.multipath): the exact output law by
enumeration, K = 1 == block verification, the planted faults, the entries and bad shapes.

Exact tests (float64, tolerance 1e-12): every draft of K paths on a context-dependent toy pair
(tests/multipath_cases.py), the verifier's law given the drafts from ``multipath_plan`` (the code
the sampler runs), completed by the target. Their power: the two planted faults (no skew; the
authors' tie-break, first child in the pick but token id in the CDF) miss the target's law by a
total variation above 1e-3 on the same pairs. The sampler's random part (uniforms, race) is
checked once statistically: chi-square over V^(L+1) cells, CHI2_ALPHA = 1e-3, fixed seeds.
"""

from __future__ import annotations

import pytest
import torch
from multipath_cases import ToyPair, complete, gbv_law, sample_paths
from stats_helpers import CHI2_ALPHA, chi2_pvalue
from tree_cases import ragged_from_padded

from spec_samplers import BlockVerificationSampler, SpecSamplerInputError, get_sampler
from spec_samplers.multipath import MultipathBlockVerificationSampler
from spec_samplers.registry import BUILTIN_SAMPLERS, available_samplers
from spec_samplers.tree.multipath import path_parents


def first_child_pick(keys: torch.Tensor, cand: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """The authors' pick: the highest key, ties to the first child (lowest path index), while
    the CDF orders ties by token id."""
    k = torch.where(ok, keys.gather(1, cand), -1.0)
    top = k.amax(dim=1, keepdim=True)
    K = cand.shape[1]
    first = torch.where(ok & (k == top), torch.arange(K)[None, :], K).amin(dim=1).clamp(max=K - 1)
    return cand.gather(1, first[:, None]).squeeze(1)


def test_registered_by_name():
    name = "multipath_block_verification"
    assert BUILTIN_SAMPLERS[name] == "spec_samplers.multipath:MultipathBlockVerificationSampler"
    assert name in available_samplers()
    sampler = get_sampler(name, backend="torch")
    assert type(sampler) is MultipathBlockVerificationSampler and sampler.lossless


# (V, L, K, seed, ties): ties make tokens 1 and 2 tie in key at every node
EXACT_CASES = [
    (3, 2, 1, 1, True),
    (3, 2, 2, 2, True),
    (3, 2, 3, 3, True),
    (3, 2, 4, 4, True),
    (3, 3, 2, 5, True),
    (2, 3, 3, 6, False),
    (4, 2, 2, 7, False),
]


@pytest.mark.parametrize("V,L,K,seed,ties", EXACT_CASES)
def test_output_law_is_the_target_law_exactly(V, L, K, seed, ties):
    pair = ToyPair(V, L, seed, ties=ties)
    law, _ = gbv_law(pair, K)
    assert float((law - pair.joint_target()).abs().max()) < 1e-12


@pytest.mark.parametrize("V,L,K,seed,ties", [c for c in EXACT_CASES if c[2] > 1])
def test_planted_faults_miss_the_target_law(V, L, K, seed, ties):
    """Power of the exact test: raw draft rows (no skew), and the authors' inconsistent
    tie-break, are both off by a total variation above 1e-3."""
    pair = ToyPair(V, L, seed, ties=ties)
    target = pair.joint_target()
    no_skew, _ = gbv_law(pair, K, skew=False)
    assert 0.5 * float((no_skew - target).abs().sum()) > 1e-3
    if ties:  # first-child vs token-id order only differ on equal keys
        first_child, _ = gbv_law(pair, K, pick=first_child_pick)
        assert 0.5 * float((first_child - target).abs().sum()) > 1e-3


def test_one_path_is_block_verification_token_for_token():
    gen = torch.Generator().manual_seed(3)
    B, L, V = 600, 5, 24
    q = torch.softmax(torch.randn(B, L + 1, V, generator=gen) * 2, -1)
    p = torch.softmax(torch.randn(B, L + 1, V, generator=gen) * 2, -1)
    ids = torch.multinomial(p[:, :L].reshape(-1, V), 1, generator=gen).view(B, L)
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    out = MultipathBlockVerificationSampler().forward_tree(q, p, ids, path_parents(1, L), seeds=seeds)
    chain = BlockVerificationSampler()(q, torch.full((B, 1), -1), p[:, :L], ids, seeds=seeds)
    assert torch.equal(out.token_ids, chain)
    lengths = (chain != -1).sum(1)
    assert int(lengths.min()) == 1 and int(lengths.max()) == L + 1  # rejections and full blocks


def test_one_path_accepts_what_block_verification_accepts_exactly():
    """K = 1: the expected accepted length is block verification's (tests/test_block_verification.py
    enumerates it independently); K = 2 on the same pair differs (the skew is not the identity)."""
    from test_block_verification import _exact_lengths

    pair = ToyPair(3, 3, seed=11)
    pair.k = pair.L  # type: ignore[attr-defined]  # the ToyModel interface _exact_lengths reads
    _, accepted = gbv_law(pair, 1)
    e_block, _ = _exact_lengths(pair)  # type: ignore[arg-type]
    assert abs(accepted - e_block) < 1e-12
    _, accepted_2 = gbv_law(pair, 2)
    assert abs(accepted_2 - accepted) > 1e-6


def test_sampler_output_law_statistically():
    """The whole sampler (uniforms, race): chi-square over the 27 cells of V = 3, L = 2, K = 3."""
    pair = ToyPair(3, 2, seed=21)
    gen = torch.Generator().manual_seed(22)
    B, K = 30000, 3
    target, draft, tokens = sample_paths(pair, K, B, gen)
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    out = MultipathBlockVerificationSampler().forward_tree(target, draft, tokens, path_parents(K, 2), seeds=seeds)
    cells = complete(pair, out.token_ids, gen)
    assert chi2_pvalue(cells, pair.joint_target()) > CHI2_ALPHA
    emitted = (out.token_ids != -1).sum(1)
    assert int(emitted.min()) == 1 and int(emitted.max()) == 3


def _workload(B: int, K: int, L: int, V: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(B, K * L + 1, V, generator=gen), -1)
    p = torch.softmax(torch.randn(B, K * L + 1, V, generator=gen), -1)
    ids = torch.randint(0, V, (B, K * L), generator=gen)
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    return q, p, ids, seeds


def test_node_ids_are_a_path_of_the_tree_with_its_tokens():
    K, L, V, B = 3, 4, 16, 64
    q, p, ids, seeds = _workload(B, K, L, V, 5)
    ids[:, L : 2 * L] = ids[:, :L]  # paths 0 and 1 equal: shared prefixes
    out = MultipathBlockVerificationSampler().forward_tree(q, p, ids, path_parents(K, L), seeds=seeds)
    for b in range(B):
        nodes = [n for n in out.node_ids[b].tolist() if n != -1]
        assert all(n2 == n1 + 1 for n1, n2 in zip(nodes, nodes[1:]))
        assert not nodes or (nodes[0] - 1) % L == 0
        assert out.token_ids[b, : len(nodes)].tolist() == [int(ids[b, n - 1]) for n in nodes]
        assert 0 <= int(out.token_ids[b, len(nodes)]) < V


def test_ragged_and_logits_entries_match_the_padded_one():
    K, L, V, B = 2, 3, 20, 8
    q, p, ids, seeds = _workload(B, K, L, V, 7)
    parents = torch.tensor(path_parents(K, L))[None, :].expand(B, -1)
    sampler = MultipathBlockVerificationSampler()
    padded = sampler.forward_tree(q, p, ids, parents, seeds=seeds)
    t, d, tok, par, cu = ragged_from_padded(q, p, ids, parents, [K * L] * B)
    ragged = sampler.forward_tree_ragged(t, d, tok, par, cu, K * L, seeds=seeds)
    assert torch.equal(padded.token_ids, ragged.token_ids) and torch.equal(padded.node_ids, ragged.node_ids)

    from spec_samplers.torch_ops import probs_from_logits

    logits_q, logits_p = torch.randn(B, K * L + 1, V), torch.randn(B, K * L + 1, V)
    temp = torch.full((B,), 0.8)
    probs_q = probs_from_logits(logits_q.reshape(-1, V), temp.repeat_interleave(K * L + 1)).view(B, -1, V)
    probs_p = probs_from_logits(logits_p.reshape(-1, V), temp.repeat_interleave(K * L + 1)).view(B, -1, V)
    a = sampler.forward_tree_from_logits(logits_q, logits_p, ids, path_parents(K, L), temp, seeds=seeds)
    b = sampler.forward_tree(probs_q, probs_p, ids, path_parents(K, L), seeds=seeds)
    assert torch.equal(a.token_ids, b.token_ids)


def test_bf16_rows_are_read_as_their_fp32_values():
    K, L, V, B = 3, 2, 32, 16
    q, p, ids, seeds = _workload(B, K, L, V, 9)
    sampler = MultipathBlockVerificationSampler()
    low = sampler.forward_tree(q.bfloat16(), p.bfloat16(), ids, path_parents(K, L), seeds=seeds)
    ref = sampler.forward_tree(q.bfloat16().float(), p.bfloat16().float(), ids, path_parents(K, L), seeds=seeds)
    assert torch.equal(low.token_ids, ref.token_ids)


def test_greedy_rows_follow_the_argmax():
    K, L, V, B = 2, 3, 12, 10
    q, p, ids, seeds = _workload(B, K, L, V, 13)
    ids[:, 0] = q[:, 0].argmax(-1)  # path 0's first token is the target's choice
    out = MultipathBlockVerificationSampler().forward_tree(
        q, p, ids, path_parents(K, L), seeds=seeds, is_greedy=torch.ones(B, dtype=torch.bool)
    )
    assert torch.equal(out.token_ids[:, 0], q[:, 0].argmax(-1))
    assert bool(
        (out.token_ids[:, 1] == torch.where(ids[:, 1] == q[:, 1].argmax(-1), ids[:, 1], q[:, 1].argmax(-1))).all()
    )


@pytest.mark.parametrize(
    "parents",
    [[0, 0, 1, 1], [0, 1, 2, 0], [0, 1, 0, 3, 4], [0, 1, 1, 3]],
    ids=["binary tree", "unequal paths", "uneven lengths", "branching path"],
)
def test_other_shapes_get_an_error_naming_the_expected_one(parents):
    N, V = len(parents), 8
    q = torch.softmax(torch.randn(2, N + 1, V), -1)
    with pytest.raises(SpecSamplerInputError, match="K disjoint paths of equal length L"):
        MultipathBlockVerificationSampler().forward_tree(q, q, torch.zeros(2, N, dtype=torch.int64), parents)
    with pytest.raises(SpecSamplerInputError, match="K disjoint paths of equal length L"):  # a tensor too
        MultipathBlockVerificationSampler().forward_tree(
            q, q, torch.zeros(2, N, dtype=torch.int64), torch.tensor(parents)
        )


def test_other_policies_missing_drafts_and_short_output_are_errors():
    K, L, V, B = 2, 2, 8, 2
    q, p, ids, _ = _workload(B, K, L, V, 1)
    sampler = MultipathBlockVerificationSampler()
    with pytest.raises(SpecSamplerInputError, match="draft_sampling"):
        sampler.forward_tree(q, p, ids, path_parents(K, L), "without_replacement")
    with pytest.raises(SpecSamplerInputError, match="draft_probs"):
        sampler.forward_tree(q, None, ids, path_parents(K, L))
    with pytest.raises(SpecSamplerInputError, match="max_depth"):
        sampler.forward_tree(q, p, ids, path_parents(K, L), max_depth=1)
    wide = sampler.forward_tree(q, p, ids, path_parents(K, L), max_depth=4)  # a wider output is padded
    assert wide.token_ids.shape == (B, 5) and bool((wide.token_ids[:, L + 1 :] == -1).all())


def test_impossible_drafts_end_the_picked_path():
    """Tokens out of range or of draft probability 0 are never picked; with none left the path
    ends there and the next token is a draw of the target row."""
    K, L, V, B = 2, 3, 8, 32
    q, p, ids, seeds = _workload(B, K, L, V, 17)
    ids[:, 1] = -5  # path 0, depth 2: out of range
    ids[:, L + 1] = V + 3  # path 1, depth 2
    out = MultipathBlockVerificationSampler().forward_tree(q, p, ids, path_parents(K, L), seeds=seeds)
    assert bool((out.token_ids[:, 2:] == -1).all())
    head = out.token_ids[:, :2]
    assert bool((head[:, 0] >= 0).all()) and bool(((head == -1) | ((head >= 0) & (head < V))).all())
    assert bool((head[:, 1] != -1).any())  # some rows accept the first token and draw the second


@pytest.mark.parametrize("K", [8, 64])
def test_fp32_law_matches_float64_for_large_k(K):
    """No cancellation in the skew: fp32 thresholds and residuals stay within 1e-5 and 2e-6 of
    float64 up to K = 64 (peaked rows, many ties at the cap)."""
    from dataclasses import replace

    from spec_samplers.layout import TreeBatch, node_depths, padded_maps
    from spec_samplers.tree.multipath import multipath_plan

    B, L, V = 6, 3, 50
    gen = torch.Generator().manual_seed(K)
    q = torch.softmax(torch.randn(B, K * L + 1, V, generator=gen, dtype=torch.float64) * 3, -1)
    p = torch.softmax(q.log() + torch.randn(B, K * L + 1, V, generator=gen, dtype=torch.float64), -1)
    ids = torch.multinomial(p[:, 0], K * L, replacement=True, generator=gen)  # any drafted tokens
    parents = torch.tensor(path_parents(K, L))[None, :].expand(B, -1)
    tb = TreeBatch(
        target=q.reshape(-1, V), draft=p.reshape(-1, V), target_rows=padded_maps(B, K * L, "cpu"),
        draft_rows=padded_maps(B, K * L, "cpu"), tokens=ids, parents=parents, depth=node_depths(parents),
        max_depth=L, policy="independent", seeds=None, offsets=None, is_greedy=None,
    )  # fmt: skip
    exact = multipath_plan(tb, K, dtype=torch.float64)
    fp32 = multipath_plan(replace(tb, target=tb.target.float(), draft=tb.draft.float()), K)
    assert torch.equal(exact.length, fp32.length) and torch.equal(exact.path, fp32.path)
    assert float((exact.thresholds - fp32.thresholds.double()).abs().max()) < 1e-5
    # unnormalised residuals (rho q - p~)+: absolute error (normalising divides by Z, which can be
    # small: block verification's own fp32 residuals have that amplification, with or without skew)
    assert float((exact.residuals - fp32.residuals.double()).abs().max()) < 2e-6


def test_bad_values_never_give_a_wrong_index():
    """NaN / Inf / negative rows, zero rows, out-of-range and impossible tokens, a detached
    request (ragged, malformed counts): tokens stay in [0, V) or -1, node ids on the tree."""
    gen = torch.Generator().manual_seed(23)
    sampler = MultipathBlockVerificationSampler()
    for trial in range(20):
        K, L, V, B = 1 + trial % 4, 1 + trial % 3, 5 + trial, 7
        q, p, ids, seeds = _workload(B, K, L, V, 100 + trial)
        ids = torch.randint(-3, V + 3, (B, K * L), generator=gen)
        q[0, 0] = float("nan")
        q[1] = 0.0
        p[2, :, 1] = float("inf")
        p[3] = -p[3]
        q[4, :, : V // 2] = 0.0
        out = sampler.forward_tree(q, p, ids, path_parents(K, L), seeds=seeds)
        tok = out.token_ids
        assert bool(((tok == -1) | ((tok >= 0) & (tok < V))).all())
        assert bool(((out.node_ids == -1) | ((out.node_ids >= 1) & (out.node_ids <= K * L))).all())
    # the ragged entry with a malformed request: that request emits nothing, the others as padded
    q, p, ids, seeds = _workload(3, 2, 2, 9, 5)
    parents = torch.tensor(path_parents(2, 2))[None, :].expand(3, -1)
    t, d, tok, par, cu = ragged_from_padded(q, p, ids, parents, [4, 4, 4])
    out = sampler.forward_tree_ragged(t, d, tok, par, torch.tensor([4, 8, 99]), 4, seeds=seeds)
    padded = sampler.forward_tree(q, p, ids, parents, seeds=seeds)
    assert torch.equal(out.token_ids[:2], padded.token_ids[:2]) and bool((out.token_ids[2] == -1).all())
