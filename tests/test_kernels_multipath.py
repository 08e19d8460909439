"""The GBV kernels (spec_samplers.kernels.multipath_kernels) give the reference's tokens, token for
token: K = 1-4 paths of L = 2-4 tokens, fp32 / fp16 / bf16 rows, ties of the key below and at
the cap, paths sharing prefixes, several requests per batch and several seeds, greedy rows,
offsets, the ragged and logits entries, V over one vocabulary block, and bad values. On CPU the
kernels run in the interpreter, so shapes stay small.

The exact output law is tested on the reference (tests/test_multipath.py, by enumeration); the
kernels inherit it by giving the same tokens on every input here, including the toy pairs of
that test drawn as the sampler sees them (``test_kernel_on_the_toy_pairs_drafts``)."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, KERNEL_BACKEND
from multipath_cases import ToyPair, sample_paths
from tree_cases import ragged_from_padded

from spec_samplers.multipath import MultipathBlockVerificationSampler
from spec_samplers.tree.multipath import path_parents


def _both(entry, *args, **kwargs):
    """The entry's output on the reference and on the kernels; the tokens and nodes must be equal."""
    ref = getattr(MultipathBlockVerificationSampler(backend="torch"), entry)(*args, **kwargs)
    ker = getattr(MultipathBlockVerificationSampler(backend=KERNEL_BACKEND), entry)(*args, **kwargs)
    assert torch.equal(ref.token_ids.cpu(), ker.token_ids.cpu()), (ref.token_ids, ker.token_ids)
    assert torch.equal(ref.node_ids.cpu(), ker.node_ids.cpu()), (ref.node_ids, ker.node_ids)
    return ref


def _workload(B, K, L, V, seed, *, distance=1.0, share=True, cap_ties=True):
    """Context-dependent rows, drafts drawn from the draft rows; ``share``: path 1 repeats path
    0's first token (shared prefixes); ``cap_ties``: q = p on a third of the rows' tokens and
    q >= p on more (many keys at the cap of 1), tokens 1 and 2 tied below the cap."""
    gen = torch.Generator().manual_seed(seed)
    N = K * L
    q = torch.softmax(1.5 * torch.randn(B, N + 1, V, generator=gen), -1)
    noise = distance * torch.randn(B, N + 1, V, generator=gen)
    if cap_ties and V >= 3:
        noise[..., 2] = noise[..., 1]
        q[..., 2] = q[..., 1]
        q = q / q.sum(-1, keepdim=True)
    p = torch.softmax(q.log() + noise, -1)
    if cap_ties:
        p[..., ::3] = q[..., ::3]  # key exactly 1 at every third token
        p = p / p.sum(-1, keepdim=True)
    ids = torch.multinomial(p[:, 1:].reshape(-1, V).double(), 1, generator=gen).view(B, N)
    if share and K >= 2:
        ids[:, L] = ids[:, 0]
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    return q, p, ids, seeds


def _dev(*ts):
    return [None if t is None else t.to(DEVICE) for t in ts]


CASES = [(K, L) for K in (1, 2, 3, 4) for L in (2, 3, 4)]


@pytest.mark.parametrize("K,L", CASES)
def test_kernel_equals_reference(K, L):
    for seed in range(2):
        for V in (3, 11):
            q, p, ids, seeds = _dev(*_workload(5, K, L, V, seed=100 * K + 10 * L + seed + V))
            _both("forward_tree", q, p, ids, path_parents(K, L), seeds=seeds)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("K,L", [(3, 2), (2, 4), (4, 3)])
def test_kernel_equals_reference_low_precision_rows(K, L, dtype):
    """fp16 / bf16 rows are read as their fp32 values by both (rounding makes more ties)."""
    q, p, ids, seeds = _dev(*_workload(6, K, L, 9, seed=K + L))
    _both("forward_tree", q.to(dtype), p.to(dtype), ids, path_parents(K, L), seeds=seeds)


def test_kernel_on_the_toy_pairs_drafts():
    """The exact-law test's toy pair (V = 3, ties at every node), drafts drawn as the sampler
    sees them, many requests: the kernel's tokens are the reference's, so its law is too."""
    pair = ToyPair(3, 2, seed=21)
    gen = torch.Generator().manual_seed(22)
    for K in (2, 3):
        target, draft, tokens = sample_paths(pair, K, 24, gen)
        seeds = torch.randint(0, 2**62, (24,), generator=gen)
        target, draft, tokens, seeds = _dev(target, draft, tokens, seeds)
        _both("forward_tree", target, draft, tokens, path_parents(K, 2), seeds=seeds)


def test_kernel_wide_vocabulary_and_offsets():
    """V = 600: several vocabulary blocks and a partial last one; offsets move the random numbers."""
    K, L = 3, 3
    q, p, ids, seeds = _dev(*_workload(4, K, L, 600, seed=3, distance=0.5))
    offsets = torch.tensor([0, 5, 1 << 40, 7], device=DEVICE)
    _both("forward_tree", q, p, ids, path_parents(K, L), seeds=seeds, offsets=offsets)


def test_kernel_greedy_ragged_and_logits():
    K, L, V, B = 2, 3, 10, 6
    q, p, ids, seeds = _dev(*_workload(B, K, L, V, seed=11))
    greedy = torch.tensor([True, False, False, True, False, False], device=DEVICE)
    parents = path_parents(K, L)
    _both("forward_tree", q, p, ids, parents, seeds=seeds, is_greedy=greedy)
    par = torch.tensor(parents, device=DEVICE)[None, :].expand(B, -1)
    t, d, tok, pr, cu = ragged_from_padded(q, p, ids, par, [K * L] * B)
    _both("forward_tree_ragged", t, d, tok, pr, cu, K * L, seeds=seeds)
    temp = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.0, 1.0], device=DEVICE)
    lq, lp = q.log().clamp(min=-40), p.log().clamp(min=-40)
    _both("forward_tree_from_logits", lq, lp, ids, parents, temp, seeds=seeds)
    lt, ld, tok, pr, cu = ragged_from_padded(lq, lp, ids, par, [K * L] * B)
    _both("forward_tree_ragged_from_logits", lt, ld, tok, pr, cu, K * L, temp, seeds=seeds)


def test_filters_read_through_the_picks_cuts():
    """``sampling_params=`` with top-k / top-p / min-p: the pick writes the (kept sum, cut) of the
    rows it and the verification read (no launch of their own), the reference judges
    filtered_softmax_reference's rows: the same tokens and nodes, padded (bf16) and ragged
    (fp32), integer logits (ties at the cuts), top-k = 1, a tiny top-p, min-p, a greedy request
    (whose argmax walk may leave the picked path)."""
    from spec_samplers import SamplingParams

    params = [
        SamplingParams(temperature=0.9, top_k=3),
        SamplingParams(temperature=0.0, top_k=2),
        SamplingParams(temperature=1.2, top_p=0.05),
        SamplingParams(temperature=0.7, top_k=1, min_p=0.3),
        SamplingParams(temperature=1.5, top_k=6, top_p=0.7, min_p=0.1),
    ]
    K, L, V, B = 2, 3, 24, len(params)
    q, p, ids, seeds = _workload(B, K, L, V, seed=41)
    lq, lp = (3 * q.log()).clamp(min=-30).round(), (3 * p.log()).clamp(min=-30).round()
    # the greedy request 1: path 1 is the target's argmax walk, but its first token has no draft
    # mass, so the pick takes path 0 and the argmax walk reads rows off the picked path
    for d in range(L):
        ids[1, L + d] = lq[1, 0 if d == 0 else L + d].argmax()
    ids[1, 0] = (ids[1, L] + 1) % V
    lp[1, 0, ids[1, L]] = float("-inf")
    parents = path_parents(K, L)
    t, d, tok, sd = _dev(lq.bfloat16(), lp.bfloat16(), ids, seeds)
    _both("forward_tree_from_logits", t, d, tok, parents, sampling_params=params, seeds=sd)
    par = torch.tensor(parents)[None, :].expand(B, -1)
    rows = ragged_from_padded(lq, lp, ids, par, [K * L] * B)
    _both("forward_tree_ragged_from_logits", *_dev(*rows), K * L, sampling_params=params, seeds=seeds.to(DEVICE))


def test_kernel_reads_a_parents_tensor_without_the_host():
    """A parents tensor ([N] or [B, N]) gives the list's tokens: the pick reads each request's
    shape on the device. A request of another shape (or longer than max_depth), which the
    reference rejects on the host, emits nothing on the kernels; one of another K and L is
    verified as its own shape."""
    K, L, V, B = 3, 2, 9, 4
    q, p, ids, seeds = _dev(*_workload(B, K, L, V, seed=31))
    parents = path_parents(K, L)
    want = _both("forward_tree", q, p, ids, parents, seeds=seeds)
    kernel = MultipathBlockVerificationSampler(backend=KERNEL_BACKEND)
    for par in (torch.tensor(parents, device=DEVICE), torch.tensor([parents] * B, device=DEVICE)):
        got = kernel.forward_tree(q, p, ids, par, max_depth=L, seeds=seeds)
        assert torch.equal(got.token_ids, want.token_ids) and torch.equal(got.node_ids, want.node_ids)
    mixed = torch.tensor([parents, [0, 0, 1, 1, 3, 4], parents, path_parents(1, K * L)], device=DEVICE)
    got = kernel.forward_tree(q, p, ids, mixed, seeds=seeds).token_ids  # D = N = 6 slots
    assert bool((got[1] == -1).all()) and torch.equal(got[[0, 2], : L + 1], want.token_ids[[0, 2]])
    one_path = MultipathBlockVerificationSampler(backend="torch").forward_tree(
        q[3:], p[3:], ids[3:], path_parents(1, K * L), seeds=seeds[3:]
    )  # request 3 alone: one path of L = 6
    assert torch.equal(got[3:], one_path.token_ids)
    short = kernel.forward_tree(q, p, ids, torch.tensor(parents, device=DEVICE), max_depth=1, seeds=seeds)
    assert bool((short.token_ids == -1).all())


def test_kernel_bad_values():
    """NaN / Inf / negative rows, zero rows, out-of-range and impossible tokens, a malformed
    ragged request: the reference's tokens (in [0, V) or -1)."""
    gen = torch.Generator().manual_seed(23)
    for trial in range(4):
        K, L, V, B = 1 + trial % 4, 2 + trial % 3, 5 + trial, 6
        q, p, ids, seeds = _workload(B, K, L, V, seed=200 + trial, share=False)
        ids = torch.where(
            torch.rand(ids.shape, generator=gen) < 0.3, torch.randint(-3, V + 3, ids.shape, generator=gen), ids
        )
        q[0, 0] = float("nan")
        q[1] = 0.0
        p[2, :, 1] = float("inf")
        p[3] = -p[3]
        q[4, :, : V // 2] = 0.0
        q, p, ids, seeds = _dev(q, p, ids, seeds)
        out = _both("forward_tree", q, p, ids, path_parents(K, L), seeds=seeds)
        assert bool(((out.token_ids == -1) | ((out.token_ids >= 0) & (out.token_ids < V))).all())
    q, p, ids, seeds = _dev(*_workload(3, 2, 2, 9, seed=5))
    parents = torch.tensor(path_parents(2, 2), device=DEVICE)[None, :].expand(3, -1)
    t, d, tok, par, _ = ragged_from_padded(q, p, ids, parents, [4, 4, 4])
    bad_cu = torch.tensor([4, 8, 99], device=DEVICE)
    out = _both("forward_tree_ragged", t, d, tok, par, bad_cu, 4, seeds=seeds)
    assert bool((out.token_ids[2] == -1).all())
