"""The tree verifiers' compiled CPU path (spec_samplers.cpu, _tree_kernels) against the PyTorch
references, output for output.

``backend="auto"`` on CPU fp32 probabilities runs the numba twins of ``rejection_tree_reference``
and ``traversal_tree_reference`` (the walks: RejectionSampler's and BlockVerificationSampler's
tree rules, all three policies) and of ``typical_tree_reference``; ``backend="torch"`` runs the
reference.
Every output tensor (token ids and node ids) must be equal: random trees (chain, star, binary,
random and ragged), B = 1, 3, 8, V = 7, 256, 32000, point-mass drafts, invalid and out-of-range
child ids, children the draft could not draw, residuals without mass, NaN / Inf / negative
entries, greedy rows, strided and expanded inputs, B = 0, ``max_depth`` cuts. Calls the kernels do
not read (logits, fp16 rows) run the reference, and are checked to give its outputs too.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from spec_samplers import BlockVerificationSampler, RejectionSampler, TypicalAcceptanceSampler, cpu
from spec_samplers.output import TreeOutput

assert cpu.tree_kernels() is not None, "numba must import for these tests (pip install -e '.[test]')"

POLICIES = ("independent", "without_replacement", "deterministic")
TYPICAL = ({"posterior_threshold": 0.09, "posterior_alpha": 0.3}, {"posterior_threshold": 0.3, "posterior_alpha": 0.9})


def _shape(kind: str, N: int, g: torch.Generator) -> list[int]:
    """Parents of N nodes: a chain, a star, a binary tree or a random tree."""
    if kind == "chain":
        return list(range(N))
    if kind == "star":
        return [0] * N
    if kind == "binary":
        return [(j - 1) // 2 for j in range(1, N + 1)]
    return [int(torch.randint(0, j, (1,), generator=g)) for j in range(1, N + 1)]


def _rows(B: int, N: int, V: int, g: torch.Generator, spread: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(target, draft) [B, N+1, V] fp32: the draft near the target (small spread) or far from it."""
    x = torch.randn(B, N + 1, V, generator=g) * 2.0
    q = torch.softmax(x, -1)
    p = torch.softmax(x + spread * torch.randn(B, N + 1, V, generator=g), -1)
    return q, p


def _tokens(p: torch.Tensor, parents: torch.Tensor, g: torch.Generator, junk: float = 0.0) -> torch.Tensor:
    """[B, N] tokens drawn from the parent's draft row (some replaced by junk ids when ``junk``)."""
    B, N = parents.shape
    V = p.shape[-1]
    par_rows = p[torch.arange(B)[:, None], parents.clamp(min=0)]  # [B, N, V]
    tok = torch.multinomial(par_rows.reshape(B * N, V).double() + 1e-30, 1, generator=g).reshape(B, N)
    if junk:
        bad = torch.rand(B, N, generator=g) < junk
        choices = torch.tensor([-1, V, V + 5, -7, 2**40])
        tok = torch.where(bad, choices[torch.randint(0, 5, (B, N), generator=g)], tok)
    return tok


class _Counting:
    """Counts the tree kernels' calls (wraps the numba dispatchers on the module)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        module = cpu.tree_kernels()
        for name in ("rejection_tree_kernel", "traversal_tree_kernel", "typical_tree_kernel"):
            kernel = getattr(module, name)
            monkeypatch.setattr(module, name, self._wrap(kernel))

    def _wrap(self, kernel: Any) -> Any:
        def run(*args: Any) -> Any:
            self.calls += 1
            return kernel(*args)

        return run


def _equal(a: TreeOutput, b: TreeOutput) -> None:
    assert a.token_ids.dtype == b.token_ids.dtype == torch.int64
    assert a.node_ids.dtype == b.node_ids.dtype == torch.int64
    assert torch.equal(a.token_ids, b.token_ids), (a.token_ids, b.token_ids)
    assert torch.equal(a.node_ids, b.node_ids), (a.node_ids, b.node_ids)


#: the walk samplers: recursive rejection sampling, Traversal Verification (block verification)
WALKS = (RejectionSampler, BlockVerificationSampler)


def _walk_both(walk: type, *args: Any, entry: str = "forward_tree", **kwargs: Any) -> tuple[TreeOutput, TreeOutput]:
    ref = getattr(walk(backend="torch"), entry)(*args, **kwargs)
    got = getattr(walk(backend="auto"), entry)(*args, **kwargs)
    return ref, got


def _typical_both(options: dict[str, float], *args: Any, entry: str = "forward_tree", **kwargs: Any):  # type: ignore[no-untyped-def]
    ref = getattr(TypicalAcceptanceSampler(backend="torch", **options), entry)(*args, **kwargs)
    got = getattr(TypicalAcceptanceSampler(backend="auto", **options), entry)(*args, **kwargs)
    return ref, got


CASES = [
    (kind, B, N, V)
    for kind in ("chain", "star", "binary", "random")
    for B, N, V in ((1, 4, 7), (3, 6, 256), (8, 9, 256), (3, 5, 32000))
]


@pytest.mark.parametrize("kind,B,N,V", CASES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("walk", WALKS)
def test_walk_equals_the_reference(walk: type, kind: str, B: int, N: int, V: int, policy: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    counting = _Counting(monkeypatch)
    for seed in range(6):
        g = torch.Generator().manual_seed(1000 * seed + N + V)
        # near drafts accept deep, far drafts reject siblings (residual updates, races)
        q, p = _rows(B, N, V, g, spread=0.3 if seed % 2 else 3.0)
        parents = torch.tensor(_shape(kind, N, g))
        tok = _tokens(p, parents[None, :].expand(B, N), g, junk=0.15 if seed % 3 == 2 else 0.0)
        seeds = torch.randint(0, 2**62, (B,), generator=g)
        offsets = torch.randint(0, 2**20, (B,), generator=g)
        draft = None if seed == 5 else p
        ref, got = _walk_both(walk, q, draft, tok, parents, policy, seeds=seeds, offsets=offsets)
        _equal(ref, got)
    assert counting.calls == 6


@pytest.mark.parametrize("B,N,V", [(1, 4, 7), (3, 6, 256), (8, 7, 256), (3, 5, 32000)])
@pytest.mark.parametrize("options", TYPICAL)
def test_typical_tree_equals_the_reference(B: int, N: int, V: int, options: dict[str, float], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    counting = _Counting(monkeypatch)
    for seed in range(8):
        g = torch.Generator().manual_seed(77 * seed + V)
        kind = ("chain", "star", "binary", "random")[seed % 4]
        # sharp rows (low entropy) and flat ones; tokens mostly the rows' likely ones
        x = torch.randn(B, N + 1, V, generator=g) * (6.0 if seed % 2 else 1.0)
        q = torch.softmax(x, -1)
        parents = torch.tensor(_shape(kind, N, g))
        tok = _tokens(q, parents[None, :].expand(B, N), g, junk=0.1 if seed % 3 == 0 else 0.0)
        ref, got = _typical_both(options, q, None, tok, parents)
        _equal(ref, got)
    assert counting.calls == 8


@pytest.mark.parametrize("walk", WALKS)
def test_per_request_parents_detached_nodes_and_max_depth(walk: type, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """[B, N] parents with invalid entries (detached subtrees), and a max_depth that cuts the tree."""
    counting = _Counting(monkeypatch)
    B, N, V = 8, 10, 256
    calls = 0
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        q, p = _rows(B, N, V, g, spread=0.5)
        parents = torch.stack([torch.tensor(_shape("random", N, g)) for _ in range(B)])
        parents[torch.rand(B, N, generator=g) < 0.1] = -1  # detached
        parents[0, 3] = 7  # a forward parent (invalid)
        tok = _tokens(p, parents, g)
        seeds = torch.randint(0, 2**62, (B,), generator=g)
        for max_depth in (None, 0, 1, 2):
            for policy in POLICIES:
                ref, got = _walk_both(walk, q, p, tok, parents, policy, seeds=seeds, max_depth=max_depth)
                _equal(ref, got)
                calls += 1
            ref, got = _typical_both(TYPICAL[0], q, None, tok, parents, max_depth=max_depth)
            _equal(ref, got)
            calls += 1
    assert counting.calls == calls


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("walk", WALKS)
def test_ragged_trees(walk: type, policy: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    counting = _Counting(monkeypatch)
    g = torch.Generator().manual_seed(5)
    V = 256
    sizes = [3, 0, 6, 1, 5]
    B = len(sizes)
    qs, ps, toks, pars = [], [], [], []
    for n in sizes:
        q, p = _rows(1, n, V, g, spread=0.4)
        parents = torch.tensor(_shape("random", n, g), dtype=torch.int64)
        qs.append(q[0])
        ps.append(p[0])
        pars.append(parents)
        toks.append(_tokens(p, parents[None, :], g)[0])
    target, draft = torch.cat(qs), torch.cat(ps)
    tokens, parents = torch.cat(toks), torch.cat(pars)
    cu = torch.tensor(sizes).cumsum(0)
    seeds = torch.randint(0, 2**62, (B,), generator=g)
    args = (target, draft, tokens, parents, cu, max(sizes), policy)
    ref, got = _walk_both(walk, *args, entry="forward_tree_ragged", seeds=seeds)
    _equal(ref, got)
    ref, got = _typical_both(TYPICAL[0], target, None, tokens, parents, cu, max(sizes), entry="forward_tree_ragged")
    _equal(ref, got)
    assert counting.calls == 2


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("walk", WALKS)
def test_point_mass_drafts_zero_draft_mass_and_residuals_without_mass(walk: type, policy: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    counting = _Counting(monkeypatch)
    B, N, V = 6, 6, 7
    parents = [0, 0, 0, 1, 1, 2]
    g = torch.Generator().manual_seed(11)
    q, p = _rows(B, N, V, g, spread=1.0)
    tok = _tokens(p, torch.tensor(parents)[None, :].expand(B, N), g)
    seeds = torch.randint(0, 2**62, (B,), generator=g)
    # point-mass draft rows
    pm = torch.nn.functional.one_hot(tok[:, :1].expand(B, N + 1), V).float()
    cases = [pm]
    # children the draft could not have drawn: p'(c) = 0
    p0 = p.clone()
    p0[torch.arange(B), 0, tok[:, 0]] = 0.0
    p0[torch.arange(B), 0, tok[:, 1]] = 0.0
    cases.append(p0)
    # residual without mass: an unnormalised target below the draft everywhere (r - p)+ = 0
    cases.append(p)
    q_low = q.clone()
    q_low[:, 0] = 0.5 * p[:, 0]
    # a residual of tiny mass (<= RESIDUAL_MASS_EPS): q = p / 2 but p + 1e-7 at one entry, so a
    # rejected child leaves (q - p)+ = 1e-7 there (the residual keeps q)
    q_tiny = q.clone()
    q_tiny[:, 0] = 0.5 * p[:, 0]
    q_tiny[:, 0, 3] = p[:, 0, 3] + 1e-7
    for target in (q, q_low, q_tiny, pm):
        for draft in cases:
            for s in range(4):
                ref, got = _walk_both(walk, target, draft, tok, parents, policy, seeds=seeds + s)
                _equal(ref, got)
    assert counting.calls == 4 * 3 * 4


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("walk", WALKS)
def test_an_accept_uniform_equal_to_its_ratio_rejects(walk: type, policy: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """q(c) = u exactly against a point-mass draft: the ratio is u, and u < u is false (the
    reference rejects); the next sibling, c again, now has r(c) = 0."""
    from spec_samplers.rng import accept_uniforms

    counting = _Counting(monkeypatch)
    B, V = 8, 7
    seeds = torch.arange(B, dtype=torch.int64) * 7919 + 5
    offsets = torch.zeros(B, dtype=torch.int64)
    u = accept_uniforms(seeds, offsets, 2)[:, 0]  # node 1's uniform
    tok = torch.tensor([[2, 4]]).expand(B, 2)
    q = torch.full((B, 3, V), 0.1)
    q[:, 0, 2] = u
    ref, got = _walk_both(walk, q, None, tok, [0, 0], policy, seeds=seeds, offsets=offsets)
    _equal(ref, got)
    assert bool((ref.node_ids[:, 0] != 1).all())  # no request accepted node 1
    assert counting.calls == 1


@pytest.mark.parametrize("walk", WALKS)
def test_malformed_rows_and_ids(walk: type, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """NaN / Inf / negative entries (cleaned to 0), rows without mass, out-of-range ids."""
    counting = _Counting(monkeypatch)
    B, N, V = 8, 7, 256
    parents = [0, 0, 1, 1, 2, 0, 3]
    calls = 0
    for seed in range(4):
        g = torch.Generator().manual_seed(seed + 40)
        q, p = _rows(B, N, V, g, spread=0.5)
        tok = _tokens(p, torch.tensor(parents)[None, :].expand(B, N), g, junk=0.2)
        for t in (q, p):
            mask = torch.rand(t.shape, generator=g)
            t[mask < 0.02] = float("nan")
            t[(mask >= 0.02) & (mask < 0.03)] = float("inf")
            t[(mask >= 0.03) & (mask < 0.05)] = -0.5
        q[0, 0] = 0.0  # a root without mass
        q[1, 2] = float("nan")  # a whole NaN row
        p[2, 0] = 0.0  # a draft row without mass
        q[3, 1] = torch.nn.functional.one_hot(tok[3, 2].clamp(0, V - 1), V).float()  # a one-hot target
        seeds = torch.randint(0, 2**62, (B,), generator=g)
        for policy in POLICIES:
            ref, got = _walk_both(walk, q, p, tok, parents, policy, seeds=seeds)
            _equal(ref, got)
            calls += 1
        for options in TYPICAL:
            ref, got = _typical_both(options, q, None, tok, parents)
            _equal(ref, got)
            calls += 1
    assert counting.calls == calls


@pytest.mark.parametrize("walk", WALKS)
def test_greedy_and_mixed_rows(walk: type, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    counting = _Counting(monkeypatch)
    B, N, V = 8, 6, 256
    parents = [0, 0, 1, 1, 2, 2]
    calls = 0
    for seed in range(4):
        g = torch.Generator().manual_seed(seed + 90)
        q, p = _rows(B, N, V, g, spread=0.3)
        tok = _tokens(p, torch.tensor(parents)[None, :].expand(B, N), g)
        # some children equal to their parent's argmax (greedy accepts)
        am = q.argmax(-1)
        tok[:, 1] = am[:, 0]
        tok[:, 4] = am[:, 2]
        q[5, 0] = 0.0  # a greedy row without mass
        greedy = torch.rand(B, generator=g) < 0.5
        greedy[5] = True
        seeds = torch.randint(0, 2**62, (B,), generator=g)
        for policy in POLICIES:
            for draft in (p, None):
                ref, got = _walk_both(walk, q, draft, tok, parents, policy, seeds=seeds, is_greedy=greedy)
                _equal(ref, got)
                calls += 1
    assert counting.calls == calls


@pytest.mark.parametrize("walk", WALKS)
def test_strided_and_expanded_inputs(walk: type, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    counting = _Counting(monkeypatch)
    B, N, V = 3, 5, 256
    parents = [0, 0, 1, 2, 2]
    g = torch.Generator().manual_seed(3)
    q, p = _rows(B, N, V, g, spread=0.5)
    tok = _tokens(p, torch.tensor(parents)[None, :].expand(B, N), g).to(torch.int32)
    seeds = torch.randint(0, 2**62, (B,), generator=g)
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)  # vocabulary stride != 1
    q_e = q[:1].expand(B, -1, -1)  # one request's rows for all
    p_e = p[:1].expand(B, -1, -1)
    tok_e = tok[:1].expand(B, -1)
    par_t = torch.tensor(parents, dtype=torch.int32)[None, :].expand(B, -1)
    for target, draft, ids, par in ((q_t, p, tok, parents), (q_e, p_e, tok_e, par_t), (q, p[:, :, ::1], tok, par_t)):
        for policy in POLICIES:
            ref, got = _walk_both(walk, target, draft, ids, par, policy, seeds=seeds)
            _equal(ref, got)
        ref, got = _typical_both(TYPICAL[0], target, None, ids, par)
        _equal(ref, got)
    assert counting.calls == 3 * 4


@pytest.mark.parametrize("walk", WALKS)
def test_empty_batch_and_no_nodes(walk: type) -> None:
    V = 7
    for B, N in ((0, 3), (2, 0), (0, 0)):
        q = torch.softmax(torch.randn(B, N + 1, V), -1)
        tok = torch.zeros(B, N, dtype=torch.int64)
        parents = list(range(N))
        seeds = torch.arange(B, dtype=torch.int64)
        for policy in POLICIES:
            ref, got = _walk_both(walk, q, q, tok, parents, policy, seeds=seeds)
            _equal(ref, got)
        ref, got = _typical_both(TYPICAL[0], q, None, tok, parents)
        _equal(ref, got)


@pytest.mark.parametrize("walk", WALKS)
def test_calls_the_kernels_do_not_read_run_the_reference(walk: type, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Logits and fp16 rows: the reference (chunked), same outputs; the kernels are not called."""
    counting = _Counting(monkeypatch)
    B, N, V = 3, 5, 256
    parents = [0, 0, 1, 2, 2]
    g = torch.Generator().manual_seed(8)
    x = torch.randn(B, N + 1, V, generator=g)
    y = x + 0.5 * torch.randn(B, N + 1, V, generator=g)
    q, p = torch.softmax(x, -1), torch.softmax(y, -1)
    tok = _tokens(p, torch.tensor(parents)[None, :].expand(B, N), g)
    seeds = torch.randint(0, 2**62, (B,), generator=g)
    temperature = torch.tensor([1.0, 0.0, 0.7])
    ref, got = _walk_both(walk, x, y, tok, parents, temperature, entry="forward_tree_from_logits", seeds=seeds)
    _equal(ref, got)
    ref, got = _walk_both(walk, q.half(), p.half(), tok, parents, seeds=seeds)
    _equal(ref, got)
    ref, got = _typical_both(TYPICAL[0], q.bfloat16(), None, tok, parents)
    _equal(ref, got)
    assert counting.calls == 0


def test_same_seed_same_tokens_and_a_chain_as_a_tree() -> None:
    """The same seed gives the same tokens call after call; a chain given as a tree emits the chain
    entry's tokens on the compiled path too (out-of-range bonus ids: the chain samples its bonus row)."""
    B, K, V = 4, 3, 256
    g = torch.Generator().manual_seed(21)
    q, p = _rows(B, K, V, g, spread=0.3)
    tok = _tokens(p, torch.arange(K)[None, :].expand(B, K), g)
    seeds = torch.randint(0, 2**62, (B,), generator=g)
    s = RejectionSampler(backend="auto")
    a = s.forward_tree(q, p, tok, list(range(K)), seeds=seeds)
    b = s.forward_tree(q, p, tok, list(range(K)), seeds=seeds)
    _equal(a, b)
    bonus = torch.full((B, 1), -1, dtype=torch.int64)
    chain = RejectionSampler(backend="auto")(q, bonus, p[:, :K], tok, seeds=seeds)
    assert torch.equal(a.token_ids, chain)


@pytest.mark.parametrize("walk", WALKS)
def test_without_numba_the_reference_runs(walk: type, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import warnings

    from spec_samplers.tree.reference import rejection_tree_reference, typical_tree_reference
    from spec_samplers.tree.traversal import traversal_tree_reference

    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    monkeypatch.delitem(sys.modules, "spec_samplers.cpu._numba_kernels", raising=False)
    monkeypatch.delitem(sys.modules, "spec_samplers.cpu._tree_kernels", raising=False)
    cpu._import_kernels.cache_clear()
    cpu.tree_kernels.cache_clear()
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert cpu.compiled_op(rejection_tree_reference, torch.device("cpu")) is None
            assert cpu.compiled_op(typical_tree_reference, torch.device("cpu")) is None
            assert cpu.compiled_op(traversal_tree_reference, torch.device("cpu")) is None
            B, N, V = 2, 3, 16
            q = torch.softmax(torch.randn(B, N + 1, V), -1)
            tok = torch.randint(0, V, (B, N))
            seeds = torch.tensor([1, 2])
            ref, got = _walk_both(walk, q, q, tok, [0, 0, 1], seeds=seeds)
            _equal(ref, got)
    finally:
        cpu._import_kernels.cache_clear()
        cpu.tree_kernels.cache_clear()
