"""Rejection sampling is lossless: emitted tokens follow the target at every slot.

Design. Each case fixes per-position distributions (q_i, p_i) shared by all N rows, so rows are
i.i.d. trials. Drafts are sampled from p_i; the sampler runs once over N rows with distinct seeds.
* Slot i is emitted iff drafts 0..i-1 were accepted, an event that depends only on positions < i,
  so conditional on it the slot's token has law q_i: chi-square test per slot, significance
  CHI2_ALPHA = 1e-3 (false-failure rate per test at a random seed; seeds here are fixed, so the
  suite is deterministic).
* Acceptance at position i given it was reached is a = sum_x min(p_i(x), q_i(x)); checked within
  Z_BOUND = 5 binomial standard errors.
* With identical (p, q) at every position, the mean number of emitted tokens per row is
  (1 - a^(k+1)) / (1 - a), checked within 5 standard errors (per-row count has variance <= (k+1)^2/4).
"""

import math
import zlib

import pytest
import torch
from stats_helpers import CHI2_ALPHA, Z_BOUND, binomial_bound, chi2_pvalue, expected_emitted

from spec_samplers import RejectionSampler

N = 20000
V = 24


def family(name: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, p): [V] target and draft distributions of one family."""
    z = torch.randn(V, generator=gen)
    if name == "dense":
        return torch.softmax(z, -1), torch.softmax(torch.randn(V, generator=gen), -1)
    if name == "sparse":  # top-k-like: supports of 6 tokens overlapping in part
        q = torch.zeros(V)
        q[:6] = torch.softmax(z[:6], -1)
        p = torch.zeros(V)
        p[3:9] = torch.softmax(z[3:9] + torch.randn(6, generator=gen), -1)
        return q, p
    if name == "nearly_equal":
        q = torch.softmax(z, -1)
        return q, torch.softmax(z + 0.05 * torch.randn(V, generator=gen), -1)
    if name == "disjoint":
        q = torch.zeros(V)
        q[: V // 2] = torch.softmax(z[: V // 2], -1)
        p = torch.zeros(V)
        p[V // 2 :] = torch.softmax(z[V // 2 :], -1)
        return q, p
    if name == "one_hot_target":  # greedy target
        q = torch.zeros(V)
        q[int(torch.argmax(z))] = 1.0
        return q, torch.softmax(torch.randn(V, generator=gen), -1)
    raise ValueError(name)


def case_seed(names: list[str], k: int) -> int:
    """Fixed per-case seed (str hashes are randomised per process; crc32 is not)."""
    return zlib.crc32(f"{'+'.join(names)}-{k}".encode())


def run_case(names: list[str], k: int, seed: int, point_mass: bool = False, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    pairs = [family(names[i % len(names)], gen) for i in range(k + 1)]
    q = torch.stack([qq for qq, _ in pairs])  # [k+1, V]
    p = torch.stack([pp for _, pp in pairs[:k]])  # [k, V]
    target = q.to(dtype).expand(N, k + 1, V)
    draft = p.to(dtype).expand(N, k, V)
    draft_ids = torch.stack([torch.multinomial(p[i], N, replacement=True, generator=gen) for i in range(k)], 1)
    bonus = torch.multinomial(q[k], N, replacement=True, generator=gen)[:, None]
    seeds = torch.randint(0, 2**62, (N,), generator=gen)
    out = RejectionSampler()(target, bonus, None if point_mass else draft, draft_ids, seeds=seeds)
    return q, p, out


CASES = [
    (["dense"], 1),
    (["dense"], 3),
    (["sparse"], 1),
    (["sparse"], 3),
    (["nearly_equal"], 3),
    (["disjoint"], 1),
    (["disjoint"], 3),
    (["one_hot_target"], 3),
    (["dense", "sparse", "disjoint", "one_hot_target"], 3),  # a different family at each position
]


@pytest.mark.parametrize("names,k", CASES, ids=[f"{'+'.join(n)}-k{k}" for n, k in CASES])
def test_emitted_tokens_follow_target(names, k):
    q, p, out = run_case(names, k, seed=case_seed(names, k))
    for i in range(k + 1):
        emitted = out[:, i][out[:, i] != -1]
        assert emitted.numel() > 0 or i > 0
        if emitted.numel() < 50:
            continue  # too few rows reach this slot for a chi-square (e.g. after disjoint drafts)
        pval = chi2_pvalue(emitted, q[i])
        assert pval > CHI2_ALPHA, f"slot {i}: chi-square p = {pval:.2e}"


@pytest.mark.parametrize("names,k", CASES, ids=[f"{'+'.join(n)}-k{k}" for n, k in CASES])
def test_acceptance_matches_theory(names, k):
    q, p, out = run_case(names, k, seed=case_seed(names, k) + 1)
    for i in range(k):
        reached = out[:, i] != -1  # slot i emitted <=> drafts before i accepted
        n = int(reached.sum())
        if n < 50:
            continue
        accepted = out[:, i + 1][reached] != -1
        a = float(torch.minimum(p[i], q[i]).sum())
        measured = float(accepted.float().mean())
        assert abs(measured - a) <= binomial_bound(a, n), f"position {i}: measured {measured:.4f}, theory {a:.4f}"


@pytest.mark.parametrize("name", ["dense", "sparse", "nearly_equal"])
@pytest.mark.parametrize("k", [1, 3])
def test_mean_emitted_matches_theory(name, k):
    # one (p, q) pair repeated at every position, so acceptance is i.i.d. across positions
    gen = torch.Generator().manual_seed(99 + k)
    qq, pp = family(name, gen)
    target = qq.expand(N, k + 1, V)
    draft = pp.expand(N, k, V)
    ids = torch.multinomial(pp, N * k, replacement=True, generator=gen).view(N, k)
    bonus = torch.multinomial(qq, N, replacement=True, generator=gen)[:, None]
    out = RejectionSampler()(target, bonus, draft, ids, seeds=torch.randint(0, 2**62, (N,), generator=gen))
    a = float(torch.minimum(pp, qq).sum())
    emitted = (out != -1).sum(1).double()
    bound = Z_BOUND * (k + 1) / 2 / math.sqrt(N)
    assert abs(float(emitted.mean()) - expected_emitted(a, k)) <= bound


@pytest.mark.parametrize("names,k", [(["dense"], 3), (["sparse"], 1), (["one_hot_target"], 3)])
def test_point_mass_drafts_lossless(names, k):
    """draft_probs=None: acceptance is q(x) and slots still follow the target."""
    q, p, out = run_case(names, k, seed=31 + k, point_mass=True)
    for i in range(k + 1):
        emitted = out[:, i][out[:, i] != -1]
        if emitted.numel() >= 50:
            assert chi2_pvalue(emitted, q[i]) > CHI2_ALPHA
    reached = out[:, 0] != -1
    a = float((p[0] * q[0]).sum())  # P(accept) = E_{x~p}[q(x)]
    measured = float((out[:, 1][reached] != -1).float().mean())
    assert abs(measured - a) <= binomial_bound(a, int(reached.sum()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_lossless(dtype):
    q, p, out = run_case(["dense"], 3, seed=5, dtype=dtype)
    for i in range(4):
        emitted = out[:, i][out[:, i] != -1]
        # the sampler sees the rounded distribution
        assert chi2_pvalue(emitted, q[i].to(dtype).float()) > CHI2_ALPHA


def test_greedy_rows_take_target_argmax():
    gen = torch.Generator().manual_seed(3)
    B, k = 64, 3
    target = torch.softmax(torch.randn(B, k + 1, V, generator=gen) * 3, -1)
    draft = torch.softmax(torch.randn(B, k, V, generator=gen), -1)
    argmax = target.argmax(-1)
    # half the drafts agree with the target argmax
    ids = torch.where(torch.rand(B, k, generator=gen) < 0.7, argmax[:, :k], torch.randint(0, V, (B, k), generator=gen))
    bonus = argmax[:, k:]
    greedy = torch.ones(B, dtype=torch.bool)
    out = RejectionSampler()(target, bonus, draft, ids, is_greedy=greedy)
    # greedy decoding of the target: every emitted token is that position's argmax
    for b in range(B):
        for i in range(k + 1):
            if out[b, i] == -1:
                break
            assert out[b, i] == argmax[b, i]
        n = int((out[b] != -1).sum())
        expected_n = next((i for i in range(k) if ids[b, i] != argmax[b, i]), k) + 1
        assert n == expected_n


def test_zero_mass_residual_recovers_from_target():
    """A rejection where (q - p)+ holds only rounding noise: sample q, not the noise.

    q(0) = 0 so draft 0 is always rejected; elsewhere p = q * (1 - 1e-7 * |noise|), so the
    residual is q * 1e-7 * |noise| (mass ~1e-7 < RESIDUAL_MASS_EPS), whose normalised shape differs
    from q: only the fallback to q passes the chi-square test.
    """
    gen = torch.Generator().manual_seed(11)
    q = torch.softmax(torch.randn(V, generator=gen), -1)
    q[0] = 0.0
    q = q / q.sum()
    p = q * (1 - 1e-7 * torch.randn(V, generator=gen).abs() * 10)
    p[0] = 1e-3
    n = 20000
    out = RejectionSampler()(
        q.expand(n, 2, V),
        torch.zeros(n, 1, dtype=torch.long),
        p.expand(n, 1, V),
        torch.zeros(n, 1, dtype=torch.long),
        seeds=torch.arange(n),
    )
    assert bool((out[:, 0] != 0).all()) and bool((out[:, 1] == -1).all())
    assert chi2_pvalue(out[:, 0], q) > CHI2_ALPHA


@pytest.mark.parametrize("bad_id", [-1, V])
def test_out_of_range_draft_recovers_from_target(bad_id):
    """A draft id outside [0, V) (e.g. vLLM's -1 placeholder) was never a sample of p: the token
    emitted in its place follows q, not (q - p)+ (which differs strongly from q here)."""
    gen = torch.Generator().manual_seed(21)
    q = torch.softmax(torch.randn(V, generator=gen), -1)
    p = torch.softmax(torch.randn(V, generator=gen) * 3, -1)
    residual = (q - p).clamp_min(0)
    n = 20000
    out = RejectionSampler()(
        q.expand(n, 2, V),
        torch.zeros(n, 1, dtype=torch.long),
        p.expand(n, 1, V),
        torch.full((n, 1), bad_id),
        seeds=torch.arange(n),
    )
    assert bool((out[:, 1] == -1).all())
    assert chi2_pvalue(out[:, 0], q) > CHI2_ALPHA
    assert chi2_pvalue(out[:, 0], residual) < CHI2_ALPHA  # the test can tell the two apart
