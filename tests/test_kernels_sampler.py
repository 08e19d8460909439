"""The samplers' ``backend`` option: kernels and PyTorch path give the same tokens and counters;
the kernel path is lossless (chi-square); bad input fails clearly."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, KERNEL_BACKEND  # noqa: E402
from kernel_cases import make_case, ragged_view  # noqa: E402

from spec_samplers import RejectionSampler, TypicalAcceptanceSampler  # noqa: E402
from spec_samplers.constants import SpecSamplerInputError  # noqa: E402
from spec_samplers.registry import sampler_options  # noqa: E402


def _counters(s):
    return (
        int(s.num_accepted_tokens),
        int(s.num_emitted_tokens),
        s.num_draft_tokens,
        s.num_accepted_per_position.tolist(),
    )


def test_backend_option_listed_and_checked():
    assert sampler_options(RejectionSampler)["backend"] == "auto"
    assert sampler_options(TypicalAcceptanceSampler)["backend"] == "auto"
    with pytest.raises(ValueError, match="backend"):
        RejectionSampler(backend="cuda")
    with pytest.raises(ValueError, match="backend"):
        TypicalAcceptanceSampler(backend=None)


def test_auto_uses_torch_on_cpu_and_triton_needs_interpreter(monkeypatch):
    case = make_case(2, 2, 50, seed=1)
    args = (case.target, case.bonus, case.draft, case.draft_ids)
    # "auto" on CPU tensors is the PyTorch path, whatever the environment.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    RejectionSampler(backend="auto")(*args, seeds=case.seeds)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        RejectionSampler(backend="triton")(*args, seeds=case.seeds)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        TypicalAcceptanceSampler(backend="triton")(*args)


@pytest.mark.parametrize("use_draft", [True, False])
def test_rejection_forward_and_ragged_same_tokens_and_counters(use_draft):
    B, K, V = 6, 3, 200
    case = make_case(B, K, V, seed=2, closeness=0.2, greedy="mixed")
    kw = dict(seeds=case.seeds.to(DEVICE), offsets=case.offsets.to(DEVICE), is_greedy=case.is_greedy.to(DEVICE))
    draft = case.draft.to(DEVICE) if use_draft else None
    args = (case.target.to(DEVICE), case.bonus.to(DEVICE), draft, case.draft_ids.to(DEVICE))
    torch_s, kern_s = RejectionSampler(backend="torch"), RejectionSampler(backend=KERNEL_BACKEND)
    assert torch.equal(torch_s(*args, **kw), kern_s(*args, **kw))
    k_b = torch.tensor([3, 0, 1, 3, 2, 0])
    t, d, ids, cu = ragged_view(case.target, case.draft, case.draft_ids, k_b)
    rargs = (
        t.to(DEVICE),
        case.bonus[:, 0].to(DEVICE),
        d.to(DEVICE) if use_draft else None,
        ids.to(DEVICE),
        cu.to(DEVICE),
        K,
    )
    assert torch.equal(torch_s.forward_ragged(*rargs, **kw), kern_s.forward_ragged(*rargs, **kw))
    assert _counters(torch_s) == _counters(kern_s)


def test_seeded_seqs_reproduce_on_the_kernel_path():
    case = make_case(4, 2, 100, seed=3)
    args = [t.to(DEVICE) for t in (case.target, case.bonus, case.draft, case.draft_ids)]
    s = RejectionSampler(backend=KERNEL_BACKEND)
    gens = lambda: {1: torch.Generator(device=DEVICE).manual_seed(7), 3: torch.Generator(device=DEVICE).manual_seed(8)}  # noqa: E731
    a, b = s(*args, seeded_seqs=gens()), s(*args, seeded_seqs=gens())
    assert torch.equal(a[[1, 3]], b[[1, 3]])
    ref = RejectionSampler(backend="torch")
    torch.manual_seed(0)
    x = s(*args, seeded_seqs=gens())
    torch.manual_seed(0)
    assert torch.equal(x, ref(*args, seeded_seqs=gens()))


def test_strict_mode_rejects_out_of_range_ids_on_the_kernel_path():
    case = make_case(3, 2, 64, seed=4)
    ids = case.draft_ids.clone()
    ids[1, 1] = 64
    s = RejectionSampler(strict_mode=True, backend=KERNEL_BACKEND)
    with pytest.raises(SpecSamplerInputError, match=r"draft_token_ids.*\[0, 64\).*64"):
        s(case.target.to(DEVICE), case.bonus.to(DEVICE), case.draft.to(DEVICE), ids.to(DEVICE))
    t = TypicalAcceptanceSampler(strict_mode=True, backend=KERNEL_BACKEND)
    with pytest.raises(SpecSamplerInputError, match="draft_token_ids"):
        t(case.target.to(DEVICE), case.bonus.to(DEVICE), None, ids.to(DEVICE))


def _chi_square_p(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    from scipy.stats import chisquare

    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() / probs.double().sum() * counts.sum()
    return float(chisquare(counts.numpy(), expected.numpy()).pvalue)


@pytest.mark.not_quick  # 600 interpreted programs, chi-square (66 s of CPU)
@pytest.mark.parametrize("use_draft", [True, False])
def test_kernel_path_is_lossless(use_draft):
    """Emitted tokens follow the target. Each chi-square check fails with probability 1e-4 on a
    correct sampler (p < 1e-4); the seeds are fixed, so the test is deterministic."""
    g = torch.Generator().manual_seed(11 + use_draft)
    N, K, V = 600, 2, 5
    q = torch.softmax(torch.randn(K + 1, V, generator=g) * 1.5, -1)  # [K+1, V]
    p = torch.softmax(torch.randn(K, V, generator=g) * 1.5, -1)  # [K, V]
    target = q.expand(N, K + 1, V).contiguous()
    draft = p.expand(N, K, V).contiguous()
    draft_ids = torch.multinomial(p, N, replacement=True, generator=g).t().contiguous()  # [N, K]
    if not use_draft:
        draft_ids = torch.multinomial(q[:K], N, replacement=True, generator=g).t().contiguous()
    bonus = torch.multinomial(q[K], N, replacement=True, generator=g)[:, None]
    seeds = torch.randint(0, 2**62, (N,), generator=g)
    s = RejectionSampler(backend=KERNEL_BACKEND)
    out = s(
        target.to(DEVICE),
        bonus.to(DEVICE),
        draft.to(DEVICE) if use_draft else None,
        draft_ids.to(DEVICE),
        seeds=seeds.to(DEVICE),
    ).cpu()
    assert _chi_square_p(out[:, 0], q[0]) > 1e-4
    emitted = out[:, 1] != -1
    assert emitted.sum() > 100
    assert _chi_square_p(out[emitted, 1], q[1]) > 1e-4
    # Acceptance rate at position 0 is 1 - TV(p, q) (point-mass drafts from q: sum q^2).
    rate = float((out[:, 1] != -1).double().mean())
    expected = float(torch.minimum(p[0], q[0]).sum()) if use_draft else float((q[0] ** 2).sum() / 1.0)
    assert abs(rate - expected) < 4.5 * (expected * (1 - expected) / N) ** 0.5 + 1e-9
