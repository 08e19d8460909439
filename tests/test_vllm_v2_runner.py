"""Model Runner V2's seam (``rejection_sample`` in vllm.v1.worker.gpu.spec_decode.rejection_sampler),
replaced.

Model Runner V2 builds its verification inputs with Triton kernels (expand_idx_mapping,
gather_draft_sampled), which need a GPU; the tests lay the tensors out as those kernels do
(vllm_support.v2_inputs) and call the seam exactly as RejectionSampler._verify calls it.
"""

from __future__ import annotations

import vllm_support  # noqa: F401  (sets VLLM_TARGET_DEVICE before vLLM picks a platform)
import pytest
import torch
from stats_helpers import CHI2_ALPHA, binomial_bound, chi2_pvalue
from vllm_support import V2_MODULE, call_v2, install, restore_seams, v2_inputs  # noqa: F401

from spec_samplers.integrations.vllm import v2_runner
from spec_samplers.rejection import RejectionSampler

REJECTION = {"acceptance_method": "rejection_sampler"}


def greedy_expected(requests, target_logits, K):
    """Model Runner V2's greedy rule (_rejection_kernel, greedy branch, then the bonus argmax)."""
    argmax = target_logits.argmax(-1).tolist()
    out = torch.full((len(requests), K + 1), -1, dtype=torch.int64)
    row = 0
    for r, req in enumerate(requests):
        n = 0
        for i, x in enumerate(req["drafts"]):
            out[r, i] = argmax[row + i]
            if x != argmax[row + i]:
                break
            n += 1
        else:
            out[r, len(req["drafts"])] = argmax[row + len(req["drafts"])]
        row += len(req["drafts"]) + 1
    return out


def test_output_layout_and_dtypes(restore_seams):
    module = install(V2_MODULE, REJECTION)
    V, K = 12, 3
    requests = [
        dict(state=4, pos=10, drafts=[1, 2, 3], seed=1),
        dict(state=0, pos=7, drafts=[5], seed=2),
        dict(state=2, pos=30, drafts=[], seed=3),  # no drafts this step: only the bonus row
        dict(state=1, pos=3, drafts=[6, -1, 7], seed=4),  # -1: vLLM's placeholder draft, rejected
    ]
    inputs = v2_inputs(requests, V, K, max_num_reqs=6)
    L = int(inputs["cu_num_logits"][-1])
    target_logits = torch.randn(L, V, generator=torch.Generator().manual_seed(0))
    draft_logits = torch.randn(6, K, V, generator=torch.Generator().manual_seed(1))
    sampled, num_sampled = call_v2(module, target_logits, draft_logits, inputs)
    assert sampled.shape == (4, K + 1) and sampled.dtype == torch.int64
    assert num_sampled.shape == (4,) and num_sampled.dtype == torch.int32
    for r, req in enumerate(requests):
        n = int(num_sampled[r])
        row = sampled[r].tolist()
        assert 1 <= n <= len(req["drafts"]) + 1
        assert row[: n - 1] == req["drafts"][: n - 1]
        assert all(0 <= x < V for x in row[:n]) and all(x == -1 for x in row[n:])
    assert int(num_sampled[2]) == 1
    assert int(num_sampled[3]) <= 2  # never past the placeholder


def test_greedy_requests_follow_vllm(restore_seams):
    module = install(V2_MODULE, REJECTION)
    V, K = 10, 3
    gen = torch.Generator().manual_seed(3)
    requests = [dict(state=s, pos=5 * s, drafts=list(torch.randint(0, V, (k,), generator=gen).tolist()), temperature=0.0)
                for s, k in enumerate([3, 1, 0, 2, 3])]
    inputs = v2_inputs(requests, V, K)
    L = int(inputs["cu_num_logits"][-1])
    target_logits = torch.randn(L, V, generator=gen)
    # Make the drafts of request 0 and 4 right, so they reach the bonus token.
    row = 0
    for r, req in enumerate(requests):
        if r in (0, 4):
            for i, x in enumerate(req["drafts"]):
                target_logits[row + i, x] = 10.0
        row += len(req["drafts"]) + 1
    sampled, num_sampled = call_v2(module, target_logits, None, inputs)
    assert torch.equal(sampled, greedy_expected(requests, target_logits, K))
    assert num_sampled.tolist() == [(sampled[r] != -1).sum().item() for r in range(5)]
    assert num_sampled[0] == 4 and num_sampled[4] == 4


def test_typical_acceptance_hand_computed(restore_seams):
    """Same rows as the V1 test: with posterior_threshold 0.15, q(x) = 0.1 is below 0.1171 (rejected,
    recover argmax), 0.7 and 0.25 (uniform row: threshold 0.075) are accepted."""
    module = install(V2_MODULE, {"acceptance_method": "typical_acceptance_sampler", "posterior_threshold": 0.15})
    q = {
        "a": [0.7, 0.1, 0.1, 0.1], "b": [0.1, 0.7, 0.1, 0.1], "u": [0.25] * 4, "bonus": [0.0, 0.0, 0.0, 1.0],
    }
    requests = [dict(state=0, pos=4, drafts=[0, 1, 2]), dict(state=1, pos=9, drafts=[0, 3])]
    rows = [q["a"], q["b"], q["u"], q["bonus"], q["b"], q["a"], q["bonus"]]
    target_logits = torch.tensor(rows).log()  # -inf where 0: the bonus rows are one-hot
    sampled, num_sampled = call_v2(module, target_logits, None, v2_inputs(requests, 4, 3))
    assert sampled.tolist() == [[0, 1, 2, 3], [1, -1, -1, -1]]
    assert num_sampled.tolist() == [4, 1]


def test_random_requests_are_lossless(restore_seams):
    """First token ~ q0 for every request; after both drafts are accepted the bonus token (drawn
    here, since this runner samples it inside verification) ~ q_bonus. The draft distribution is
    softmax(draft_logits / temperature): the acceptance rate of draft 0 must be sum min(p, q).
    Chi-square tests fail with probability CHI2_ALPHA for a correct sampler at a random seed."""
    module = install(V2_MODULE, REJECTION)
    V, K, R = 6, 2, 6000
    gen = torch.Generator().manual_seed(31)
    temp = 0.7
    q = torch.softmax(torch.randn(3, V, generator=gen), -1)  # rows 0, 1 and bonus
    draft_logits_row = torch.randn(K, V, generator=gen)
    p = torch.softmax(draft_logits_row / temp, -1)
    seeds = torch.randint(0, 2**62, (R,), generator=gen)
    requests = [
        dict(state=r, pos=100 + r, drafts=torch.multinomial(p, 1, generator=gen)[:, 0].tolist(),
             temperature=temp, seed=int(seeds[r]))
        for r in range(R)
    ]
    inputs = v2_inputs(requests, V, K)
    target_logits = q.log().repeat(R, 1)  # processed logits: temperature already applied by vLLM
    draft_logits = draft_logits_row.expand(R, K, V).contiguous()
    sampled, num_sampled = call_v2(module, target_logits, draft_logits, inputs)
    assert chi2_pvalue(sampled[:, 0], q[0]) > CHI2_ALPHA
    full = num_sampled == K + 1
    assert int(full.sum()) > 300
    assert chi2_pvalue(sampled[full, K], q[2]) > CHI2_ALPHA
    rate = float(torch.minimum(p[0], q[0]).sum())
    accepted = float((num_sampled > 1).double().mean())
    assert abs(accepted - rate) < binomial_bound(rate, R)


def test_placeholder_draft_is_resampled_from_target(restore_seams):
    """A -1 draft (vLLM's placeholder) is rejected and the token there has the target
    distribution q, not the residual (q - p)+ (chi-square, CHI2_ALPHA)."""
    module = install(V2_MODULE, REJECTION)
    V, R = 5, 3000
    gen = torch.Generator().manual_seed(51)
    q = torch.softmax(torch.randn(V, generator=gen), -1)
    draft_row = torch.randn(V, generator=gen) * 2
    requests = [dict(state=r, pos=7, drafts=[-1, 2], seed=r) for r in range(R)]
    inputs = v2_inputs(requests, V, 2)
    target_logits = q.log().repeat(3 * R, 1)
    sampled, num_sampled = call_v2(module, target_logits, draft_row.expand(R, 2, V).contiguous(), inputs)
    assert (num_sampled == 1).all()
    assert chi2_pvalue(sampled[:, 0], q) > CHI2_ALPHA


def test_seed_and_position_reproduce(restore_seams):
    module = install(V2_MODULE, REJECTION)
    V, K = 64, 3
    requests = [dict(state=s, pos=50, drafts=[1, 2, 3], seed=1234) for s in range(40)]
    inputs = v2_inputs(requests, V, K)
    L = int(inputs["cu_num_logits"][-1])
    target_logits = torch.zeros(L, V)  # uniform: every draw is visible in the output
    draft_logits = torch.zeros(40, K, V)
    draft_logits[:, :, :4] = 3.0
    a, _ = call_v2(module, target_logits, draft_logits, inputs)
    torch.manual_seed(99)  # torch's generator plays no part here
    b, _ = call_v2(module, target_logits, draft_logits, inputs)
    assert torch.equal(a, b)
    assert (a == a[0]).all()  # same seed and position: same tokens, whatever the batch slot
    inputs["pos"] += 1  # next step: new randomness
    c, _ = call_v2(module, target_logits, draft_logits, inputs)
    assert not torch.equal(a[0], c[0])


def test_mixed_greedy_random_with_padded_v0_sampler(restore_seams):
    """A sampler with only vLLM V0's padded forward (third-party style) behind the V2 seam."""

    class PaddedOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = RejectionSampler(strict_mode=True)

        def forward(self, target, bonus, draft_probs, draft_ids, *, seeds=None, offsets=None):
            return self.inner(target, bonus, draft_probs, draft_ids, seeds=seeds, offsets=offsets)

    seam = v2_runner.make_rejection_sample(PaddedOnly(), vllm_rejection_sample=None)
    V, K = 8, 3
    gen = torch.Generator().manual_seed(41)
    requests = [dict(state=s, pos=11 * s, drafts=torch.randint(0, V, (k,), generator=gen).tolist(),
                     temperature=t, seed=s) for s, (k, t) in enumerate([(3, 0.0), (1, 1.0), (2, 0.0), (3, 0.9), (0, 1.0)])]
    inputs = v2_inputs(requests, V, K)
    L = int(inputs["cu_num_logits"][-1])
    target_logits = torch.randn(L, V, generator=gen)
    draft_logits = torch.randn(5, K, V, generator=gen)
    sampled, num_sampled = seam(
        target_logits, draft_logits, inputs["draft_sampled"], inputs["cu_num_logits"], inputs["pos"],
        inputs["idx_mapping"], inputs["expanded_idx_mapping"], inputs["expanded_local_pos"],
        inputs["temperature"], inputs["seed"], K,
    )
    greedy = greedy_expected(requests, target_logits, K)
    for r in (0, 2):
        assert torch.equal(sampled[r], greedy[r])
    assert num_sampled.tolist() == (sampled != -1).sum(1).tolist()
    # Same answer as our built-in sampler's ragged method: the padding is exact.
    ragged = v2_runner.make_rejection_sample(RejectionSampler(), vllm_rejection_sample=None)
    again, _ = ragged(
        target_logits, draft_logits, inputs["draft_sampled"], inputs["cu_num_logits"], inputs["pos"],
        inputs["idx_mapping"], inputs["expanded_idx_mapping"], inputs["expanded_local_pos"],
        inputs["temperature"], inputs["seed"], K,
    )
    assert torch.equal(sampled, again)


@pytest.mark.parametrize("kwargs", [
    dict(synthetic_conditional_rates=torch.ones(2)),
    dict(use_block_verification=True),
    dict(contexts=torch.zeros(3, 1, dtype=torch.int64), watermarking=torch.ones(1, dtype=torch.bool), watermark_key=7),
])
def test_vllm_only_schemes_stay_vllms(kwargs):
    calls = []
    seam = v2_runner.make_rejection_sample(RejectionSampler(), lambda *a, **kw: calls.append((a, kw)) or "vllm")
    inputs = v2_inputs([dict(state=0, pos=0, drafts=[1, 2])], 4, 2)
    args = [torch.zeros(3, 4), None] + [inputs[k] for k in (
        "draft_sampled", "cu_num_logits", "pos", "idx_mapping", "expanded_idx_mapping", "expanded_local_pos",
        "temperature", "seed", "num_speculative_steps")]
    synthetic = kwargs.pop("synthetic_conditional_rates", None)
    assert seam(*args, synthetic, **kwargs) == "vllm"
    assert len(calls) == 1
