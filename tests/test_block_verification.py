"""Block verification (Sun et al. 2024): lossless for whole blocks, never shorter than token-wise
rejection in expectation, kernels == reference, greedy rows, seeds, bad input.

Statistical design. Each case fixes the distributions shared by all N rows (rows are i.i.d.
trials with distinct seeds). Drafts are sampled from p. Every output is completed to k+1 tokens
by drawing the slots after the emitted ones from the target (given the completed prefix), so a
lossless sampler's completed sequences have exactly the target's joint law: chi-square over all
V^(k+1) cells at CHI2_ALPHA = 1e-3 (false-failure rate per test at a random seed; seeds are
fixed, so the suite is deterministic). Mean accepted lengths are checked against exact
expectations (enumeration over all draft blocks) within Z_BOUND = 5 standard errors (two-sided
normal tail 5.7e-7).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import case_on_device
from kernel_cases import make_case, ragged_view
from op_entries import (
    block_verify_from_logits_reference,
    block_verify_from_logits_triton,
    block_verify_ragged_from_logits_reference,
    block_verify_ragged_from_logits_triton,
    block_verify_ragged_reference,
    block_verify_ragged_triton,
    block_verify_reference,
    block_verify_triton,
    rejection_sample_reference,
)
from stats_helpers import CHI2_ALPHA, Z_BOUND, chi2_pvalue

from spec_samplers import RejectionSampler, SpecSamplerInputError, get_sampler
from spec_samplers.block import BlockVerificationSampler
from spec_samplers.kernels.backend import vocab_split
from spec_samplers.registry import BUILTIN_SAMPLERS, available_samplers

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------------------------------------
# Registration


def test_registered_by_name_and_lossless():
    assert BUILTIN_SAMPLERS["block_verification"] == "spec_samplers.block:BlockVerificationSampler"
    assert "block_verification" in available_samplers()
    sampler = get_sampler("block_verification", backend="torch")
    assert type(sampler) is BlockVerificationSampler
    assert BlockVerificationSampler.lossless is True


# ---------------------------------------------------------------------------------------------
# A prefix-dependent toy model: target and draft tables indexed by the prefix.


def _dist(gen: torch.Generator, V: int, kind: str) -> torch.Tensor:
    z = torch.randn(V, generator=gen, dtype=torch.float64) * 1.5
    d = torch.softmax(z, -1)
    if kind == "sparse":  # support of V - 1 tokens: p may put mass where q has none
        d[int(torch.randint(0, V, (1,), generator=gen))] = 0.0
        d = d / d.sum()
    return d


class ToyModel:
    """q(.|prefix) and p(.|prefix) for every prefix of length < k+1 (p only below k)."""

    def __init__(self, V: int, k: int, seed: int, prefix_dependent: bool, kind: str = "dense"):
        gen = torch.Generator().manual_seed(seed)
        self.V, self.k = V, k
        self.q: dict[tuple[int, ...], torch.Tensor] = {}
        self.p: dict[tuple[int, ...], torch.Tensor] = {}
        shared_q = [_dist(gen, V, kind) for _ in range(k + 1)]
        shared_p = [_dist(gen, V, kind) for _ in range(k)]
        for length in range(k + 1):
            for prefix in itertools.product(range(V), repeat=length):
                self.q[prefix] = _dist(gen, V, kind) if prefix_dependent else shared_q[length]
                if length < k:
                    self.p[prefix] = _dist(gen, V, kind) if prefix_dependent else shared_p[length]

    def joint_target(self) -> torch.Tensor:
        """[V^(k+1)] law of a whole sequence under the target (row-major cell index)."""
        out = torch.empty(self.V ** (self.k + 1), dtype=torch.float64)
        for cell, seq in enumerate(itertools.product(range(self.V), repeat=self.k + 1)):
            out[cell] = math.prod(float(self.q[seq[:i]][seq[i]]) for i in range(self.k + 1))
        return out

    def rows(self, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """drafts [N, k] -> (target [N, k+1, V], draft [N, k, V]) conditioned on each row's prefix."""
        N, k = drafts.shape
        lists = drafts.tolist()
        target = torch.stack([torch.stack([self.q[tuple(x[:i])] for i in range(k + 1)]) for x in lists])
        draft = torch.stack([torch.stack([self.p[tuple(x[:i])] for i in range(k)]) for x in lists])
        return target.float(), draft.float()

    def sample_drafts(self, N: int, gen: torch.Generator) -> torch.Tensor:
        drafts = torch.zeros(N, self.k, dtype=torch.int64)
        for i in range(self.k):
            probs = torch.stack([self.p[tuple(x)] for x in drafts[:, :i].tolist()])
            drafts[:, i] = torch.multinomial(probs, 1, generator=gen)[:, 0]
        return drafts

    def complete(self, out: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Fill the -1 slots of [N, k+1] outputs left to right with fresh target samples."""
        seq = out.clone()
        for i in range(self.k + 1):
            missing = seq[:, i] == -1
            if bool(missing.any()):
                probs = torch.stack([self.q[tuple(x[:i])] for x in seq[missing].tolist()])
                seq[missing, i] = torch.multinomial(probs, 1, generator=gen)[:, 0]
        return seq

    def cell(self, seq: torch.Tensor) -> torch.Tensor:
        weights = self.V ** torch.arange(self.k, -1, -1)
        return (seq * weights).sum(dim=1)


def _run_toy(model: ToyModel, N: int, seed: int, point_mass: bool = False):
    gen = torch.Generator().manual_seed(seed)
    drafts = model.sample_drafts(N, gen)
    if point_mass:  # a draft-free proposer: one fixed block, p = point mass
        drafts = drafts[:1].expand(N, -1).contiguous()
    target, draft = model.rows(drafts)
    bonus = torch.multinomial(target[:, -1], 1, generator=gen)
    seeds = torch.randint(0, 2**62, (N,), generator=gen)
    out = BlockVerificationSampler(backend="torch")(target, bonus, None if point_mass else draft, drafts, seeds=seeds)
    return out, gen, target, draft, drafts, bonus, seeds


LOSSLESS_CASES = [
    # (V, k, prefix_dependent, kind, point_mass, N)
    (3, 2, False, "dense", False, 60000),
    (4, 2, False, "sparse", False, 60000),
    (3, 3, False, "dense", False, 80000),
    (3, 2, True, "dense", False, 60000),
    (4, 2, False, "dense", True, 40000),
]


@pytest.mark.parametrize("V,k,dependent,kind,point_mass,N", LOSSLESS_CASES)
def test_completed_blocks_have_the_target_joint_law(V, k, dependent, kind, point_mass, N):
    """Chi-square over all V^(k+1) cells (false-failure rate 1e-3 per case)."""
    model = ToyModel(V, k, seed=17 * V + k + 100 * dependent, prefix_dependent=dependent, kind=kind)
    out, gen, *_ = _run_toy(model, N, seed=V * 1000 + k, point_mass=point_mass)
    emitted = (out != -1).sum(dim=1)
    assert bool((emitted >= 1).all())
    seq = model.complete(out, gen)
    pvalue = chi2_pvalue(model.cell(seq), model.joint_target())
    assert pvalue > CHI2_ALPHA, pvalue
    # The block is not always emitted whole: the completion matters, and rescues happen.
    assert bool((emitted < k + 1).any()) and bool((emitted > 1).any())


# ---------------------------------------------------------------------------------------------
# Exact expected accepted lengths (enumeration over every draft block), float64.


def _exact_lengths(model: ToyModel) -> tuple[float, float]:
    """(E[accepted] for block verification, E[accepted] for token-wise rejection)."""
    k = model.k
    e_block = e_token = 0.0
    for x in itertools.product(range(model.V), repeat=k):
        prob = math.prod(float(model.p[x[:i]][x[i]]) for i in range(k))
        if prob == 0.0:
            continue
        ratios = [float(model.q[x[:i]][x[i]]) / float(model.p[x[:i]][x[i]]) for i in range(k)]
        rho = [1.0]
        for r in ratios:
            rho.append(min(rho[-1] * r, 1.0))
        h = []
        for m in range(1, k + 1):
            if m == k:
                h.append(rho[m])
                continue
            z = float((rho[m] * model.q[x[:m]] - model.p[x[:m]]).clamp_min(0).sum())
            h.append(1.0 if rho[m] >= 1.0 else z / (z + 1.0 - rho[m]))
        # P(tau = m) = h_m * prod_{m' > m} (1 - h_m') for independent uniforms.
        for m in range(1, k + 1):
            e_block += prob * m * h[m - 1] * math.prod(1.0 - hh for hh in h[m:])
        accept = 1.0
        for r in ratios:
            accept *= min(1.0, r)
            e_token += prob * accept
    return e_block, e_token


@pytest.mark.parametrize("trial", range(12))
def test_exact_expected_length_never_below_token_wise(trial):
    """The paper's optimality (Theorem 2), exactly, on random toy models with and without
    prefix dependence, dense and sparse supports (float64; tolerance 1e-12)."""
    V, k = (3, 3) if trial % 3 == 0 else (4, 2)
    model = ToyModel(
        V, k, seed=500 + trial, prefix_dependent=trial % 2 == 1, kind="sparse" if trial % 4 == 2 else "dense"
    )
    e_block, e_token = _exact_lengths(model)
    assert e_block >= e_token - 1e-12, (e_block, e_token)


@pytest.mark.parametrize("dependent", [False, True])
def test_sampler_mean_lengths_match_the_exact_expectations(dependent):
    """On the same inputs (same drafts, targets, seeds), block verification's mean accepted length
    is its exact expectation and rejection's is token-wise's, each within 5 standard errors
    (per-row length in [0, k]: std <= k / 2); the exact block expectation is the larger."""
    V, k, N = 4, 3, 30000
    model = ToyModel(V, k, seed=900 + dependent, prefix_dependent=dependent)
    e_block, e_token = _exact_lengths(model)
    assert e_block > e_token + 0.01
    out, _, target, draft, drafts, bonus, seeds = _run_toy(model, N, seed=901)
    token = RejectionSampler(backend="torch")(target, bonus, draft, drafts, seeds=seeds)
    bound = Z_BOUND * (k / 2) / math.sqrt(N)
    block_len = float(((out != -1).sum(1) - 1).double().mean())
    token_len = float(((token != -1).sum(1) - 1).double().mean())
    assert abs(block_len - e_block) < bound, (block_len, e_block)
    assert abs(token_len - e_token) < bound, (token_len, e_token)


def test_k1_is_token_wise_rejection():
    """With one draft, h_1 = min(1, q/p): the same decision and residual as rejection sampling,
    and, with the same random numbers, the same tokens."""
    case = make_case(4, 1, 40, seed=3, greedy="mixed", closeness=0.5)
    args = (case.target, case.bonus, case.draft, case.draft_ids, case.seeds, case.offsets, case.is_greedy)
    assert torch.equal(block_verify_reference(*args), rejection_sample_reference(*args))


# ---------------------------------------------------------------------------------------------
# Greedy rows, seeds, layouts


def test_greedy_rows_follow_the_argmax_rule():
    case = make_case(4, 3, 40, seed=11, greedy="all", closeness=0.3)
    out = BlockVerificationSampler(backend="torch")(
        case.target, case.bonus, case.draft, case.draft_ids, is_greedy=case.is_greedy
    )
    argmax = case.target.argmax(-1)  # [B, k+1]
    for b in range(4):
        n = 0
        while n < 3 and int(case.draft_ids[b, n]) == int(argmax[b, n]):
            n += 1
        expected = case.draft_ids[b, :n].tolist() + [int(argmax[b, n]) if n < 3 else int(case.bonus[b, 0])]
        assert out[b, : n + 1].tolist() == expected and (out[b, n + 1 :] == -1).all()
    # temperature 0 in the logits entry is the same rule
    logits_out = BlockVerificationSampler(backend="torch").forward_from_logits(
        case.target_logits, case.bonus, case.draft_logits, case.draft_ids, case.temperature
    )
    assert torch.equal(logits_out, out)


def test_seeds_reproduce_and_layouts_agree():
    case = make_case(4, 3, 40, seed=12, greedy="none", closeness=0.6)
    sampler = BlockVerificationSampler(backend="torch")
    a = sampler(case.target, case.bonus, case.draft, case.draft_ids, seeds=case.seeds, offsets=case.offsets)
    b = sampler(case.target, case.bonus, case.draft, case.draft_ids, seeds=case.seeds, offsets=case.offsets)
    assert torch.equal(a, b)
    gens = {1: torch.Generator().manual_seed(5)}
    c = sampler(case.target, case.bonus, case.draft, case.draft_ids, seeded_seqs=gens)
    gens = {1: torch.Generator().manual_seed(5)}
    d = sampler(case.target, case.bonus, case.draft, case.draft_ids, seeded_seqs=gens)
    assert torch.equal(c[1], d[1])
    # different offsets: a different draw for some row (fixed seeds)
    outs = {
        tuple(
            sampler(case.target, case.bonus, case.draft, case.draft_ids, seeds=case.seeds, offsets=case.offsets + s)
            .flatten()
            .tolist()
        )
        for s in range(8)
    }
    assert len(outs) > 1
    # ragged with k_b = K everywhere: the padded tokens
    k_b = torch.full((4,), 3)
    t, dr, ids, cu = ragged_view(case.target, case.draft, case.draft_ids, k_b)
    r = sampler.forward_ragged(t, case.bonus[:, 0], dr, ids, cu, 3, seeds=case.seeds, offsets=case.offsets)
    assert torch.equal(r, a)


def test_counters_follow_the_output():
    case = make_case(3, 2, 30, seed=13, greedy="none")
    sampler = BlockVerificationSampler(backend="torch")
    out = sampler(case.target, case.bonus, case.draft, case.draft_ids, seeds=case.seeds)
    assert int(sampler.num_emitted_tokens) == int((out != -1).sum())
    assert int(sampler.num_accepted_tokens) == int((out[:, 1:] != -1).sum())
    assert sampler.num_draft_tokens == 6
    assert sampler.num_accepted_per_position.tolist() == (out[:, 1:] != -1).sum(0).tolist()


def test_out_of_range_drafts_end_the_block():
    """A draft id outside [0, V) is never accepted and never indexed: the block ends before it and
    its position is resampled from q (as vLLM's -1 placeholder)."""
    case = make_case(4, 3, 30, seed=14, greedy="none", closeness=0.05)
    ids = case.draft_ids.clone()
    ids[:, 1] = torch.tensor([-1, 30, 1000, -100])
    for draft in (case.draft, None):
        out = block_verify_reference(case.target, case.bonus, draft, ids, case.seeds)
        assert bool((out[:, 2:] == -1).all())
        assert bool(((out[:, 0] >= 0) & (out[:, 0] < 30)).all())
        assert bool(((out[:, 1] >= -1) & (out[:, 1] < 30)).all())
        assert bool((out[:, 1] != -1).any())  # close drafts: x_0 accepted, then a sample of q_1


# ---------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("strict", [False, True])
def test_bad_inputs_name_the_argument(strict):
    case = make_case(4, 3, 20, seed=15)
    sampler = BlockVerificationSampler(strict_mode=strict, backend="torch")
    with pytest.raises(SpecSamplerInputError, match="target_with_bonus_probs"):
        sampler(case.target[:, :3], case.bonus, case.draft, case.draft_ids)
    with pytest.raises(SpecSamplerInputError, match="draft_token_ids"):
        sampler(case.target, case.bonus, case.draft, case.draft_ids.float())
    with pytest.raises(SpecSamplerInputError, match="is_greedy"):
        sampler(case.target, case.bonus, case.draft, case.draft_ids, is_greedy=torch.ones(3, dtype=torch.bool))
    with pytest.raises(SpecSamplerInputError, match="offsets"):
        sampler(case.target, case.bonus, case.draft, case.draft_ids, offsets=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(SpecSamplerInputError, match="cu_num_draft_tokens"):
        sampler.forward_ragged(
            case.target[:, 0], case.bonus[:, 0], None, case.draft_ids[:, 0], torch.tensor([1.0, 2.0, 3.0, 4.0]), 1
        )
    with pytest.raises(ValueError, match="backend"):
        BlockVerificationSampler(backend="cuda")


def test_strict_mode_checks_values_and_non_strict_never_emits_bad_tokens():
    case = make_case(4, 3, 20, seed=16)
    bad_ids = case.draft_ids.clone()
    bad_ids[0, 0] = 20
    with pytest.raises(SpecSamplerInputError, match="draft_token_ids"):
        BlockVerificationSampler(strict_mode=True, backend="torch")(case.target, case.bonus, case.draft, bad_ids)
    target = case.target.clone()
    target[1] = float("nan")
    target[2, :, :5] = -1.0
    out = BlockVerificationSampler(backend="torch")(target, case.bonus, case.draft, bad_ids)
    emitted = out[out != -1]
    assert bool(((emitted >= 0) & (emitted < 20)).all())


# ---------------------------------------------------------------------------------------------
# Kernels == reference, token for token (TRITON_INTERPRET on CPU: tiny shapes)


def _split(V: int, B: int, block_v: int = 16, num_blocks: int = 3):
    return vocab_split(V, B, DEVICE, block_v=block_v, num_blocks=num_blocks)


def _dev(*ts):
    return [None if t is None else t.to(DEVICE) for t in ts]


def _ragged_on_device(target, draft, draft_ids, num_drafts: list[int], use_draft: bool):
    """(target rows [T, V], draft rows [T, V] or None, ids [T], cu_num_draft_tokens [B]) on DEVICE:
    request b keeps its first num_drafts[b] drafts; no draft rows unless ``use_draft``."""
    rt, rd, rids, cu = _dev(*ragged_view(target, draft, draft_ids, torch.tensor(num_drafts)))
    return rt, rd if use_draft else None, rids, cu


def _kernel_equals_reference(reference, kernel, args, split) -> torch.Tensor:
    """The launcher's tokens on ``args`` equal the reference's (returned)."""
    ref = reference(*args)
    out = kernel(*args, split=split)
    assert torch.equal(out, ref), f"kernel\n{out}\nreference\n{ref}"
    return ref


@pytest.mark.parametrize("use_draft", [True, False])
@pytest.mark.parametrize("greedy", ["none", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_padded_and_ragged(use_draft, greedy, dtype):
    B, K, V = 4, 3, 48
    case = make_case(B, K, V, seed=30 + use_draft + 2 * (greedy == "mixed"), dtype=dtype, greedy=greedy, closeness=0.4)
    target, draft, ids, bonus, seeds, offs, g = case_on_device(case, use_draft=use_draft, greedy=greedy != "none")
    args = (target, bonus, draft, ids, seeds, offs, g)
    _kernel_equals_reference(block_verify_reference, block_verify_triton, args, _split(V, B))
    rt, rd, rids, cu = _ragged_on_device(case.target, case.draft, case.draft_ids, [3, 0, 2, 1], use_draft)
    args = (rt, bonus[:, 0], rd, rids, cu, K, seeds, offs, g)
    _kernel_equals_reference(block_verify_ragged_reference, block_verify_ragged_triton, args, _split(V, B))


@pytest.mark.parametrize("use_draft", [True, False])
def test_kernel_logits(use_draft):
    B, K, V = 4, 3, 40
    case = make_case(B, K, V, seed=40 + use_draft, greedy="mixed", closeness=0.3)
    tl_, dl, bonus, ids, temp, seeds, offs = _dev(
        case.target_logits,
        case.draft_logits if use_draft else None,
        case.bonus,
        case.draft_ids,
        case.temperature,
        case.seeds,
        case.offsets,
    )
    args = (tl_, bonus, dl, ids, temp, seeds, offs)
    _kernel_equals_reference(block_verify_from_logits_reference, block_verify_from_logits_triton, args, _split(V, B))
    rt, rd, rids, cu = _ragged_on_device(case.target_logits, case.draft_logits, case.draft_ids, [3, 1, 0, 2], use_draft)
    args = (rt, bonus[:, 0], rd, rids, cu, K, temp, seeds, offs)
    reference, kernel = block_verify_ragged_from_logits_reference, block_verify_ragged_from_logits_triton
    _kernel_equals_reference(reference, kernel, args, _split(V, B))


@pytest.mark.parametrize("use_draft", [True, False])
def test_kernel_bad_ids_zero_mass_and_nan(use_draft):
    B, K, V = 4, 3, 33
    case = make_case(B, K, V, seed=50 + use_draft, greedy="mixed", closeness=0.1, bad_ids=True, zero_mass=True)
    case.target[2, :, :4] = float("nan")
    target, draft, ids, bonus, seeds, offs, g = case_on_device(case, use_draft=use_draft)
    args = (target, bonus, draft, ids, seeds, offs, g)
    split = _split(V, B, block_v=16, num_blocks=2)
    ref = _kernel_equals_reference(block_verify_reference, block_verify_triton, args, split)
    assert bool(((ref >= -1) & (ref < V)).all())


def test_kernel_k0_k1_empty_batch_and_long_block():
    for B, K, V, seed in ((3, 0, 20, 60), (2, 1, 20, 61), (1, 6, 24, 62)):
        case = make_case(B, K, V, seed=seed, greedy="mixed", closeness=0.2)
        args = _dev(case.target, case.bonus, case.draft, case.draft_ids, case.seeds, case.offsets, case.is_greedy)
        assert torch.equal(block_verify_triton(*args, split=_split(V, B)), block_verify_reference(*args))
    out = block_verify_triton(
        *_dev(torch.zeros(0, 3, 10), torch.zeros(0, 1, dtype=torch.int64)),
        None,
        *_dev(torch.zeros(0, 2, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)),
    )
    assert out.shape == (0, 3)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_sampler_backends_agree(backend):
    case = make_case(3, 2, 24, seed=70, greedy="mixed", closeness=0.3)
    sampler = BlockVerificationSampler(backend=backend)
    args = _dev(case.target, case.bonus, case.draft, case.draft_ids)
    out = sampler(*args, seeds=case.seeds.to(DEVICE), is_greedy=case.is_greedy.to(DEVICE))
    ref = block_verify_reference(*args, case.seeds.to(DEVICE), None, case.is_greedy.to(DEVICE))
    assert torch.equal(out, ref)
