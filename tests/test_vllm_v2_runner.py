"""Model Runner V2's seam (``rejection_sample`` in vllm.v1.worker.gpu.spec_decode.rejection_sampler),
replaced.

Model Runner V2 builds its verification inputs with Triton kernels (expand_idx_mapping,
gather_draft_sampled), which need a GPU; the tests lay the tensors out as those kernels do
(vllm_support.v2_inputs) and call the seam exactly as RejectionSampler._verify calls it, or run
vLLM's own RejectionSampler._verify_in_chunks around it (vllm_support.verify_in_chunks).
"""

from __future__ import annotations

import pytest
import torch
import vllm_support  # noqa: F401  (sets VLLM_TARGET_DEVICE before vLLM picks a platform)
from stats_helpers import CHI2_ALPHA, binomial_bound, chi2_pvalue
from vllm_support import (  # noqa: F401
    V2_MODULE,
    VLLM_033,
    call_v2,
    completed_block_pvalue,
    engine_config,
    install,
    make_model_dir,
    restore_seams,
    v2_args,
    v2_inputs,
    v2_rejection_sampler,
    verify_in_chunks,
)

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
    requests = [
        dict(state=s, pos=5 * s, drafts=list(torch.randint(0, V, (k,), generator=gen).tolist()), temperature=0.0)
        for s, k in enumerate([3, 1, 0, 2, 3])
    ]
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
        "a": [0.7, 0.1, 0.1, 0.1],
        "b": [0.1, 0.7, 0.1, 0.1],
        "u": [0.25] * 4,
        "bonus": [0.0, 0.0, 0.0, 1.0],
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
        dict(
            state=r,
            pos=100 + r,
            drafts=torch.multinomial(p, 1, generator=gen)[:, 0].tolist(),
            temperature=temp,
            seed=int(seeds[r]),
        )
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
    requests = [
        dict(state=s, pos=11 * s, drafts=torch.randint(0, V, (k,), generator=gen).tolist(), temperature=t, seed=s)
        for s, (k, t) in enumerate([(3, 0.0), (1, 1.0), (2, 0.0), (3, 0.9), (0, 1.0)])
    ]
    inputs = v2_inputs(requests, V, K)
    L = int(inputs["cu_num_logits"][-1])
    target_logits = torch.randn(L, V, generator=gen)
    draft_logits = torch.randn(5, K, V, generator=gen)
    sampled, num_sampled = seam(target_logits, draft_logits, *v2_args(inputs), K)
    greedy = greedy_expected(requests, target_logits, K)
    for r in (0, 2):
        assert torch.equal(sampled[r], greedy[r])
    assert num_sampled.tolist() == (sampled != -1).sum(1).tolist()
    # Same answer as our built-in sampler's ragged method: the padding is exact.
    ragged = v2_runner.make_rejection_sample(RejectionSampler(), vllm_rejection_sample=None)
    again, _ = ragged(target_logits, draft_logits, *v2_args(inputs), K)
    assert torch.equal(sampled, again)


@pytest.mark.parametrize("name", ["rejection_sampler", "block_verification"])
def test_bonus_rows_verified_in_place_match_the_eager_bonus(restore_seams, monkeypatch, name):
    """Rejection sampling and block verification verify the bonus rows in place (the logits as
    vLLM wrote them, a -1 placeholder as each request's last draft): the same tokens as drawing
    the bonus eagerly by the recovery race of position k_r and verifying the draft rows, on the
    reference and on the kernels, greedy rows, placeholders, empty requests and both drafting
    methods included."""
    from conftest import DEVICE, KERNEL_BACKEND

    from spec_samplers.registry import get_sampler

    V, K = 40, 3
    gen = torch.Generator().manual_seed(71)
    requests = [
        dict(state=s, pos=9 * s + 2, drafts=torch.randint(0, V, (k,), generator=gen).tolist(), temperature=t, seed=s)
        for s, (k, t) in enumerate([(3, 0.0), (1, 1.0), (0, 0.8), (3, 0.7), (2, 1.3), (0, 0.0), (3, 1.0)])
    ]
    requests[4]["drafts"][0] = -1  # vLLM's placeholder
    inputs = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in v2_inputs(requests, V, K).items()}
    L = int(inputs["cu_num_logits"][-1])
    target_logits = (torch.randn(L, V, generator=gen) * 0.5).to(DEVICE)  # flat rows: drafts often accepted
    draft_logits = (torch.randn(len(requests), K, V, generator=gen) * 0.5).to(DEVICE)
    args = v2_args(inputs)
    backends = ("torch", KERNEL_BACKEND)  # the reference, then the kernels (interpreted without a GPU)
    seams = {b: v2_runner.make_rejection_sample(get_sampler(name, backend=b), None) for b in backends}
    for drafts in (draft_logits, None):
        in_place = {b: seam(target_logits, drafts, *args, K) for b, seam in seams.items()}
        with monkeypatch.context() as m:
            m.setattr(v2_runner, "bonus_row_verifiable", lambda sampler: False)
            eager, n_eager = seams["torch"](target_logits, drafts, *args, K)
        for out, n in in_place.values():
            assert torch.equal(out, eager) and torch.equal(n, n_eager)
        # some requests reach the bonus (all k_r accepted, or k_r = 0)
        assert any(n == len(r["drafts"]) + 1 for n, r in zip(n_eager.tolist(), requests))


@pytest.mark.parametrize("name", ["rejection_sampler", "block_verification"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_drafter_cache_read_in_place_matches_the_eager_rows(restore_seams, monkeypatch, name, cache_dtype):
    """Probabilistic drafting at temperatures other than 1: the in-place path reads the drafter's
    cache [max_num_reqs, S, V'] with S > k and V' > vocab through ``draft_rows`` (state * S +
    step) and divides by each request's T in the sampler (``draft_temperature``); the eager path
    gathers the rows and divides them first. Same tokens, on the reference and on the kernels,
    with greedy requests, empty requests and a placeholder draft mixed in."""
    from conftest import DEVICE, KERNEL_BACKEND

    from spec_samplers.registry import get_sampler

    V, K, S, extra_vocab = 48, 3, 5, 9
    shapes = [(3, 0.6), (1, 0.0), (0, 1.7), (3, 2.5), (2, 0.35), (3, 1.0), (3, 0.5), (2, 3.0), (3, 0.8)]
    counts = []
    for seed in range(73, 76):
        gen = torch.Generator().manual_seed(seed)
        requests = [
            dict(
                state=2 * r + 1,
                pos=7 * r + 3,
                drafts=torch.randint(0, V, (k,), generator=gen).tolist(),
                temperature=t,
                seed=r + seed,
            )
            for r, (k, t) in enumerate(shapes)
        ]
        requests[3]["drafts"][1] = -1  # vLLM's placeholder
        max_num_reqs = 2 * len(requests) + 2
        inputs = v2_inputs(requests, V, K, max_num_reqs=max_num_reqs)
        inputs = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        L = int(inputs["cu_num_logits"][-1])
        target_logits = (torch.randn(L, V, generator=gen) * 0.6).to(DEVICE)
        cache = (torch.randn(max_num_reqs, S, V + extra_vocab, generator=gen) * 0.8).to(cache_dtype).to(DEVICE)
        # the drafts' rows lean to the draft tokens, so that some are accepted and some rejected
        for r in requests:
            for i, x in enumerate(r["drafts"]):
                if x >= 0:
                    cache[r["state"], i, x] += 1.0
        args = v2_args(inputs)
        eager_seam = v2_runner.make_rejection_sample(get_sampler(name, backend="torch"), None)
        with monkeypatch.context() as m:
            m.setattr(v2_runner, "bonus_row_verifiable", lambda sampler: False)
            eager, n_eager = eager_seam(target_logits, cache, *args, K)
        for backend in ("torch", KERNEL_BACKEND):
            seam = v2_runner.make_rejection_sample(get_sampler(name, backend=backend), None)
            out, n = seam(target_logits, cache, *args, K)
            assert torch.equal(out, eager) and torch.equal(n, n_eager), (seed, backend)
        counts += [(c, len(r["drafts"])) for c, r in zip(n_eager.tolist(), requests)]
    assert any(c > 1 for c, _ in counts) and any(c < k + 1 for c, k in counts)


VLLM_ONLY = [
    dict(synthetic_conditional_rates=torch.ones(2)),
    dict(use_block_verification=True),
    dict(contexts=torch.zeros(3, 1, dtype=torch.int64), watermarking=torch.ones(1, dtype=torch.bool), watermark_key=7),
] + ([dict(fly_window_size=1, fly_entropy_threshold=0.3, fly_entropy_top_k=3)] if VLLM_033 else [])


@pytest.mark.parametrize("kwargs", VLLM_ONLY)
def test_vllm_only_schemes_stay_vllms(kwargs):
    calls = []
    seam = v2_runner.make_rejection_sample(RejectionSampler(), lambda *a, **kw: calls.append((a, kw)) or "vllm")
    inputs = v2_inputs([dict(state=0, pos=0, drafts=[1, 2])], 4, 2)
    args = [torch.zeros(3, 4), None, *v2_args(inputs), inputs["num_speculative_steps"]]
    synthetic = kwargs.pop("synthetic_conditional_rates", None)
    assert seam(*args, synthetic, **kwargs) == "vllm"
    assert len(calls) == 1


# --- block verification behind the seam, and vLLM's own chunked verification around it --------

BLOCK = {"acceptance_method": "block_verification"}


def _block_requests(R: int, V: int, K: int, seed: int, probabilistic: bool, temp: float = 0.8):
    """R requests drafting K tokens each from the same per-position distributions: target rows
    q [K+1, V] (processed logits = log q), draft logits [K, V] (p = softmax(logits / temp)).
    Probabilistic drafting samples the drafts from p and passes the cached logits; greedy
    drafting proposes the drafter's argmax (a point mass) and passes no draft logits."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(K + 1, V, generator=gen) * 1.5, -1)
    draft_logits_row = torch.randn(K, V, generator=gen) * 1.5
    p = torch.softmax(draft_logits_row / temp, -1)
    seeds = torch.randint(0, 2**62, (R,), generator=gen)
    if probabilistic:
        drafts = torch.multinomial(p, R, replacement=True, generator=gen).t()  # [R, K]
    else:
        drafts = draft_logits_row.argmax(-1).expand(R, K)
    requests = [
        dict(state=r, pos=40 + r % 7, drafts=drafts[r].tolist(), temperature=temp, seed=int(seeds[r])) for r in range(R)
    ]
    inputs = v2_inputs(requests, V, K)
    target_logits = q.log().repeat(R, 1)  # [R*(K+1), V]
    draft_logits = draft_logits_row.expand(R, K, V).contiguous() if probabilistic else None
    return q, p, inputs, target_logits, draft_logits, gen


@pytest.mark.parametrize("probabilistic", [True, False], ids=["probabilistic_drafts", "greedy_drafts"])
def test_block_verification_is_lossless_for_whole_blocks(restore_seams, probabilistic):
    """Completed blocks (bonus drawn by the plugin included) have the target's joint law: chi-square
    over all V^(K+1) cells (false failure CHI2_ALPHA at a random seed)."""
    module = install(V2_MODULE, BLOCK)
    V, K, R = 3, 2, 12000
    q, p, inputs, target_logits, draft_logits, gen = _block_requests(R, V, K, seed=61, probabilistic=probabilistic)
    sampled, num_sampled = call_v2(module, target_logits, draft_logits, inputs)
    assert num_sampled.tolist() == (sampled != -1).sum(1).tolist()
    assert bool((num_sampled < K + 1).any()) and bool((num_sampled == K + 1).any())
    assert completed_block_pvalue(sampled, q, gen) > CHI2_ALPHA


def test_block_verification_accepts_more_than_token_wise(restore_seams):
    """Same requests, seeds and drafts: block verification's mean accepted length is not below
    rejection's, and its first token still has law q_0 (chi-square)."""
    V, K, R = 4, 3, 8000
    q, p, inputs, target_logits, draft_logits, gen = _block_requests(R, V, K, seed=62, probabilistic=True)
    block, n_block = call_v2(install(V2_MODULE, BLOCK), target_logits, draft_logits, inputs)
    token, n_token = call_v2(install(V2_MODULE, REJECTION), target_logits, draft_logits, inputs)
    assert chi2_pvalue(block[:, 0], q[0]) > CHI2_ALPHA
    # (lengths in [1, K+1]: a difference of means over R rows has std <= K / sqrt(R); 5 std)
    assert float(n_block.double().mean()) > float(n_token.double().mean()) - 5 * K / R**0.5


def test_block_verification_greedy_rows_and_placeholders(restore_seams):
    module = install(V2_MODULE, BLOCK)
    V, K = 10, 3
    gen = torch.Generator().manual_seed(63)
    requests = [
        dict(state=s, pos=3 * s, drafts=torch.randint(0, V, (k,), generator=gen).tolist(), temperature=t, seed=s)
        for s, (k, t) in enumerate([(3, 0.0), (2, 1.0), (0, 0.0), (3, 0.7)])
    ]
    requests[3]["drafts"][1] = -1  # vLLM's placeholder / a draft structured output forbids
    inputs = v2_inputs(requests, V, K)
    L = int(inputs["cu_num_logits"][-1])
    target_logits = torch.randn(L, V, generator=gen)
    sampled, num_sampled = call_v2(module, target_logits, torch.randn(4, K, V, generator=gen), inputs)
    greedy = greedy_expected(requests, target_logits, K)
    assert torch.equal(sampled[0], greedy[0]) and torch.equal(sampled[2], greedy[2])
    assert int(num_sampled[3]) <= 2  # the block ends before the placeholder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("tiny-llama-v2"))


@pytest.mark.parametrize("name", ["block_verification", "rejection_sampler"])
def test_vllm_verify_in_chunks_around_the_seam(model_dir, restore_seams, name):
    """vLLM's RejectionSampler, built under an engine config naming our sampler (the plugin's
    observer installs it), verifies through _verify_in_chunks: in one chunk or cut into chunks of
    whole requests (as for large vocabularies), the tokens are the same, since every draw is keyed
    by the request's seed and position."""
    V, K, R = 16, 3, 9
    gen = torch.Generator().manual_seed(64)
    requests = [
        dict(
            state=(5 * r) % 11,
            pos=20 + 3 * r,
            drafts=torch.randint(0, V, (r % (K + 1),), generator=gen).tolist(),
            temperature=[0.0, 0.9, 1.2][r % 3],
            seed=100 + r,
        )
        for r in range(R)
    ]
    inputs = v2_inputs(requests, V, K, max_num_reqs=11)
    L = int(inputs["cu_num_logits"][-1])
    target_logits = torch.randn(L, V, generator=gen)
    draft_logits = torch.randn(11, K, V, generator=gen)
    config = engine_config(model_dir, {"spec_samplers": {"acceptance_method": name}})
    rejection_sampler = v2_rejection_sampler(config, inputs)
    module = __import__(V2_MODULE, fromlist=["rejection_sample"])
    assert type(module.rejection_sample.__spec_samplers_sampler__).__name__ == (
        "BlockVerificationSampler" if name == "block_verification" else "RejectionSampler"
    )
    whole, n_whole = verify_in_chunks(rejection_sampler, target_logits, draft_logits, inputs, max_chunk_logits=L)
    calls = rejection_sampler.sampler.calls
    chunked, n_chunked = verify_in_chunks(rejection_sampler, target_logits, draft_logits, inputs, max_chunk_logits=5)
    assert rejection_sampler.sampler.calls - calls > 2  # really cut into chunks
    assert torch.equal(whole, chunked) and torch.equal(n_whole, n_chunked)
    # and the same as calling the seam directly
    direct, n_direct = call_v2(module, target_logits, draft_logits, inputs)
    assert torch.equal(whole, direct) and torch.equal(n_whole, n_direct)
    greedy = greedy_expected(requests, target_logits, K)
    for r in range(0, R, 3):
        assert torch.equal(whole[r], greedy[r])
