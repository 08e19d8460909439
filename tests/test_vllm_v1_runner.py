"""The V1 model runner's seam (vllm.v1.sample.rejection_sampler.rejection_sample), replaced.

Inputs come from vLLM's own helpers (SpecDecodeMetadata.make_dummy, SamplingMetadata) on CPU and
the seam is called exactly as vLLM's RejectionSampler.forward calls it; one test runs that
forward itself (all-greedy batch: its random path needs Triton kernels, which need a GPU).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import vllm_support  # noqa: F401  (sets VLLM_TARGET_DEVICE before vLLM picks a platform)
from stats_helpers import CHI2_ALPHA, binomial_bound, chi2_pvalue
from vllm_support import (
    V1_MODULE,
    VLLM_033,
    call_v1,
    check_layout,
    completed_block_pvalue,
    install,
    restore_seams,  # noqa: F401  (fixture)
    sampling_metadata,
    spec_metadata,
    vllm_greedy_v1,
)

from spec_samplers.integrations.vllm import v1_runner
from spec_samplers.rejection import RejectionSampler

REJECTION = {"acceptance_method": "rejection_sampler"}


def random_logits(T: int, V: int, seed: int) -> torch.Tensor:
    return torch.randn(T, V, generator=torch.Generator().manual_seed(seed)) * 2


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_output_layout_dtype_and_placeholders(restore_seams, with_draft_probs):
    module = install(V1_MODULE, REJECTION)
    drafts = [[1, 2, 3], [4], [5, 6], [7, 0, 1]]
    md = spec_metadata(drafts)
    V = 8
    logits = random_logits(md.draft_token_ids.shape[0], V, 0)
    draft_probs = torch.softmax(random_logits(logits.shape[0], V, 1), -1) if with_draft_probs else None
    bonus = torch.tensor([[3], [4], [5], [6]], dtype=torch.int32)
    out = call_v1(module, md, draft_probs, logits, bonus, sampling_metadata([1.0, 0.7, 1.0, 1.3]))
    assert out.dtype == torch.int32  # SamplerOutput.sampled_token_ids' dtype
    assert out.device == logits.device
    rows = check_layout(out, drafts, V)
    for b, row in enumerate(rows):
        if len(row) == len(drafts[b]) + 1:
            assert row[-1] == bonus[b, 0]  # all accepted: vLLM's bonus token


def test_all_greedy_matches_vllm_greedy_kernel(restore_seams):
    module = install(V1_MODULE, REJECTION)
    drafts = [[1, 2, 3], [4], [5, 6], [], [2, 2]]
    md = spec_metadata(drafts)
    V = 8
    logits = random_logits(md.draft_token_ids.shape[0], V, 2)
    argmax = logits.argmax(-1)
    # Make some drafts right so rows get past position 0.
    md.draft_token_ids[0:2] = argmax[0:2].to(torch.int32)
    md.draft_token_ids[4] = argmax[4].to(torch.int32)
    drafts = [[1, 2, 3], [4], [5, 6], [], [2, 2]]
    flat = md.draft_token_ids.tolist()
    drafts = [flat[0:3], flat[3:4], flat[4:6], [], flat[6:8]]
    bonus = [7, 6, 5, 4, 3]
    out = call_v1(
        module, md, None, logits, torch.tensor(bonus, dtype=torch.int32)[:, None], sampling_metadata([0.0] * 5)
    )
    assert torch.equal(out, vllm_greedy_v1(drafts, logits, bonus))
    assert out[0].tolist()[:2] == flat[0:2]  # the crafted acceptances happened


def test_vllm_forward_all_greedy_end_to_end(restore_seams):
    """vLLM's own RejectionSampler.forward (bonus sampling, logits processing, output) around our seam."""
    from vllm.v1.outputs import SamplerOutput

    module = install(V1_MODULE, REJECTION)

    class ArgmaxBonusSampler(torch.nn.Module):  # vLLM's Sampler needs vllm._C (GPU build)
        logprobs_mode = "raw_logprobs"

        def forward(self, logits, sampling_metadata, predict_bonus_token=False, logprobs_mode_override=None):
            return SamplerOutput(
                sampled_token_ids=logits.argmax(-1, keepdim=True).to(torch.int32), logprobs_tensors=None
            )

    sampler = module.RejectionSampler.__new__(module.RejectionSampler)
    torch.nn.Module.__init__(sampler)  # skip the observer: the seam is configured above
    sampler.sampler = ArgmaxBonusSampler()
    sampler.is_processed_logprobs_mode = False
    sampler.is_logits_logprobs_mode = False
    sampler.synthetic_mode = False
    sampler.synthetic_conditional_rates = None
    sampler.use_fp64_gumbel = False
    sampler.use_fly = False  # (0.33's forward passes FLy's settings along)
    sampler.fly_window_size = None
    sampler.fly_entropy_threshold = None
    sampler.fly_entropy_top_k = 3
    drafts = [[1, 2, 3], [4], [5, 6]]
    md = spec_metadata(drafts)
    md.target_logits_indices = torch.tensor([0, 1, 2, 4, 6, 7])
    md.bonus_logits_indices = torch.tensor([3, 5, 8])
    logits = random_logits(9, 8, 3)
    logits[0, 1] = 10.0  # draft 1 of request 0 is the argmax
    result = sampler(md, None, logits, sampling_metadata([0.0, 0.0, 0.0]))
    bonus = logits[md.bonus_logits_indices].argmax(-1).tolist()
    expected = vllm_greedy_v1(drafts, logits[md.target_logits_indices], bonus)
    assert torch.equal(result.sampled_token_ids, expected)
    assert result.sampled_token_ids[0, 0] == 1


def test_mixed_greedy_and_random_ragged(restore_seams):
    module = install(V1_MODULE, REJECTION)
    V = 16
    drafts = [[1, 2, 3, 4], [5], [6, 7], [8, 9, 10], [], [11]]
    md = spec_metadata(drafts)
    logits = random_logits(md.draft_token_ids.shape[0], V, 4)
    draft_probs = torch.softmax(random_logits(logits.shape[0], V, 5), -1)
    bonus = torch.arange(6, dtype=torch.int32)[:, None]
    temps = [0.0, 1.0, 0.0, 0.8, 1.0, 0.0]
    torch.manual_seed(0)
    out = call_v1(module, md, draft_probs, logits, bonus, sampling_metadata(temps))
    check_layout(out, drafts, V)
    greedy = vllm_greedy_v1(drafts, logits, bonus[:, 0].tolist())
    for b, t in enumerate(temps):
        if t == 0:
            assert torch.equal(out[b], greedy[b])


def test_typical_acceptance_hand_computed(restore_seams):
    """posterior_threshold 0.15, posterior_alpha 0.3. Rows and thresholds (H with vLLM V0's 1e-5):
    q = [.7,.1,.1,.1]: H = 0.9404, 0.3 e^-H = 0.1171 -> threshold 0.1171
    q = [.25]*4:       H = 1.3863, 0.3 e^-H = 0.0750 -> threshold 0.0750
    request A drafts [0, 1, 2] on rows ([.7,.1,.1,.1], [.1,.7,.1,.1], uniform): 0.7, 0.7, 0.25 all
    accepted -> [0, 1, 2, bonus]; request B drafts [0, 3] on rows ([.1,.7,.1,.1], ...): 0.1 < 0.1171
    rejected -> argmax 1 -> [1, -1, -1, -1]. With the default threshold 0.09, B's 0.1 > 0.09 is
    accepted."""
    probs = torch.tensor(
        [
            [0.7, 0.1, 0.1, 0.1],
            [0.1, 0.7, 0.1, 0.1],
            [0.25, 0.25, 0.25, 0.25],
            [0.1, 0.7, 0.1, 0.1],
            [0.1, 0.1, 0.1, 0.7],
        ]
    )
    H = -(probs[0] * torch.log(probs[0] + 1e-5)).sum()
    assert math.isclose(0.3 * math.exp(-H), 0.1171, abs_tol=1e-4)
    md = spec_metadata([[0, 1, 2], [0, 3]])
    bonus = torch.tensor([[2], [3]], dtype=torch.int32)
    sm = sampling_metadata([1.0, 1.0])

    module = install(V1_MODULE, {"acceptance_method": "typical_acceptance_sampler", "posterior_threshold": 0.15})
    out = call_v1(module, md, None, probs.log(), bonus, sm)
    assert out.tolist() == [[0, 1, 2, 2], [1, -1, -1, -1]]

    module = install(V1_MODULE, {"acceptance_method": "typical_acceptance_sampler"})
    out = call_v1(module, md, None, probs.log(), bonus, sm)
    assert out.tolist() == [[0, 1, 2, 2], [0, 3, 3, -1]]  # B: 0.1 > 0.09, 0.7 > 0.09, then bonus 3


def test_typical_acceptance_keeps_vllm_greedy_rows(restore_seams):
    module = install(V1_MODULE, {"acceptance_method": "typical_acceptance_sampler"})
    probs = torch.tensor([[0.4, 0.35, 0.25], [0.4, 0.35, 0.25]])
    md = spec_metadata([[1], [1]])
    out = call_v1(
        module, md, None, probs.log(), torch.tensor([[2], [2]], dtype=torch.int32), sampling_metadata([0.0, 1.0])
    )
    # Greedy row: 1 is not the argmax -> 0. Typical row: 0.35 > min(0.09, ...) -> accepted, bonus.
    assert out.tolist() == [[0, -1], [1, 2]]


def test_random_rows_are_lossless(restore_seams):
    """Every emitted token has the target distribution: the first token of every request has q0
    (whatever its k), and after an accepted draft 0 the next token has q1 (k=2) or is the bonus
    (k=1). Chi-square tests, each failing with probability CHI2_ALPHA for a correct sampler at a
    random seed (the seeds are fixed)."""
    module = install(V1_MODULE, REJECTION)
    V, N = 6, 6000
    gen = torch.Generator().manual_seed(11)
    q = torch.softmax(torch.randn(2, V, generator=gen), -1)  # target rows at positions 0, 1
    p = torch.softmax(torch.randn(2, V, generator=gen), -1)  # draft rows
    k = [2 if b % 2 == 0 else 1 for b in range(N)]
    draft = [torch.multinomial(p[: k[b]], 1, generator=gen)[:, 0].tolist() for b in range(N)]
    md = spec_metadata(draft)
    target_logits = torch.cat([q[: k[b]] for b in range(N)]).log()  # [T, V]
    draft_probs = torch.cat([p[: k[b]] for b in range(N)])
    bonus = torch.multinomial(q[1:].expand(N, V), 1, generator=gen).to(torch.int32)
    torch.manual_seed(12)
    out = call_v1(module, md, draft_probs, target_logits, bonus, sampling_metadata([1.0] * N))
    rows = check_layout(out, draft, V)
    first = np.array([row[0] for row in rows])
    assert chi2_pvalue(torch.tensor(first), q[0]) > CHI2_ALPHA
    second = np.array([rows[b][1] for b in range(0, N, 2) if len(rows[b]) > 1])
    assert len(second) > 500
    assert chi2_pvalue(torch.tensor(second), q[1]) > CHI2_ALPHA
    for b in range(1, N, 2):
        if len(rows[b]) == 2:
            assert rows[b][1] == bonus[b, 0]
    # Acceptance rate of draft 0 is sum min(p, q) (stats_helpers.Z_BOUND standard errors).
    rate = float(torch.minimum(p[0], q[0]).sum())
    accepted = np.mean([len(r) > 1 for r in rows])
    assert abs(accepted - rate) < binomial_bound(rate, N)


def test_seeded_requests_reproduce(restore_seams):
    module = install(V1_MODULE, REJECTION)
    V = 32
    drafts = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [], [10]]
    md = spec_metadata(drafts)
    logits = torch.zeros(md.draft_token_ids.shape[0], V)  # uniform target: recoveries are random
    draft_probs = torch.full((logits.shape[0], V), 1.0 / V)
    draft_probs[:, :16] *= 1.9  # accepts drafts 0..15 only half the time
    draft_probs[:, 16:] *= 0.1
    bonus = torch.zeros(5, 1, dtype=torch.int32)

    def run(default_seed: int):
        torch.manual_seed(default_seed)
        gens = {
            0: torch.Generator().manual_seed(5),
            2: torch.Generator().manual_seed(6),
            3: torch.Generator().manual_seed(7),
        }
        out = call_v1(module, md, draft_probs, logits, bonus, sampling_metadata([1.0] * 5, gens))
        return out, gens

    outs = [run(s) for s in range(8)]
    for out, _ in outs[1:]:
        assert torch.equal(out[[0, 2]], outs[0][0][[0, 2]])  # seeded rows: same whatever the default RNG
    assert len({tuple(out[1].tolist()) for out, _ in outs}) > 1  # an unseeded row varies
    # Request 3 has no drafts: vLLM draws nothing from its generator, nor do we.
    assert torch.equal(outs[0][1][3].get_state(), torch.Generator().manual_seed(7).get_state())


class PaddedOnlySampler(torch.nn.Module):
    """A third-party sampler with vLLM V0's padded interface only (no forward_ragged)."""

    def __init__(self):
        super().__init__()
        self.inner = RejectionSampler(strict_mode=True)  # strict: the padding must be valid input
        self.calls = 0

    def forward(
        self, target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, seeded_seqs=None, *, seeds=None
    ):
        self.calls += 1
        return self.inner(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, seeds=seeds)


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_padded_path_for_v0_samplers_is_lossless_on_ragged_input(with_draft_probs):
    """Ragged requests padded for a V0-interface sampler: short rows end in vLLM's bonus token."""
    sampler = PaddedOnlySampler()
    seam = v1_runner.make_rejection_sample(sampler, vllm_rejection_sample=None)
    V, N = 5, 4000
    gen = torch.Generator().manual_seed(21)
    q = torch.softmax(torch.randn(3, V, generator=gen), -1)
    p = torch.softmax(torch.randn(3, V, generator=gen), -1)
    k = [(b % 3) + 1 for b in range(N)]  # 1, 2, 3 drafts
    draft = [torch.multinomial(p[: k[b]], 1, generator=gen)[:, 0].tolist() for b in range(N)]
    md = spec_metadata(draft)
    bonus = torch.multinomial(q[2:].expand(N, V), 1, generator=gen).to(torch.int32)
    args = (
        md.draft_token_ids,
        md.num_draft_tokens,
        md.max_spec_len,
        md.cu_num_draft_tokens,
        torch.cat([p[: k[b]] for b in range(N)]) if with_draft_probs else None,
        torch.cat([q[: k[b]] for b in range(N)]).log(),
        bonus,
        sampling_metadata([1.0] * N),
    )
    torch.manual_seed(22)
    out = seam(*args)
    assert sampler.calls == 1
    # The padding is exact: our built-in's ragged method gives the same tokens from the same seeds.
    torch.manual_seed(22)
    assert torch.equal(out, v1_runner.make_rejection_sample(RejectionSampler(), None)(*args))
    rows = check_layout(out, draft, V)
    for b, row in enumerate(rows):
        if len(row) == k[b] + 1:
            assert row[-1] == bonus[b, 0]
    p0 = p[0] if with_draft_probs else None
    assert chi2_pvalue(torch.tensor([r[0] for r in rows]), q[0]) > CHI2_ALPHA
    if p0 is not None:
        rate = float(torch.minimum(p0, q[0]).sum())
        accepted = np.mean([len(r) > 1 for r in rows])
        assert abs(accepted - rate) < binomial_bound(rate, N)


VLLM_ONLY = [dict(synthetic_mode=True)] + (
    [dict(fly_window_size=1, fly_entropy_threshold=0.3, fly_entropy_top_k=3)] if VLLM_033 else []
)


@pytest.mark.parametrize("kwargs", VLLM_ONLY, ids=["synthetic", "fly"][: len(VLLM_ONLY)])
def test_vllm_only_modes_stay_vllms(kwargs):
    calls = []
    seam = v1_runner.make_rejection_sample(RejectionSampler(), lambda *a, **kw: calls.append(kw) or "vllm")
    md = spec_metadata([[1]])
    result = seam(
        md.draft_token_ids,
        [1],
        1,
        md.cu_num_draft_tokens,
        None,
        torch.zeros(1, 4),
        torch.zeros(1, 1, dtype=torch.int32),
        sampling_metadata([1.0]),
        **kwargs,
    )
    assert result == "vllm"
    for key, value in kwargs.items():
        assert calls[0][key] == value
    if "fly_window_size" not in kwargs:
        assert "fly_window_size" not in calls[0]  # 0.32's function has no such parameter


# --- block verification behind the V1 seam ----------------------------------------------------

BLOCK = {"acceptance_method": "block_verification"}


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["probabilistic_drafts", "greedy_drafts"])
def test_block_verification_is_lossless_for_whole_blocks(restore_seams, with_draft_probs):
    """All requests draft k=2 tokens from the same per-position distributions (probabilistic
    drafting: samples of p with vLLM's draft_probs; greedy drafting: one fixed block, no
    draft_probs); vLLM's bonus token is a sample of the bonus row. The completed blocks have the
    target's joint law: chi-square over all V^3 cells (false failure CHI2_ALPHA)."""
    module = install(V1_MODULE, BLOCK)
    V, K, N = 3, 2, 12000
    gen = torch.Generator().manual_seed(71)
    q = torch.softmax(torch.randn(K + 1, V, generator=gen) * 1.5, -1)
    p = torch.softmax(torch.randn(K, V, generator=gen) * 1.5, -1)
    if with_draft_probs:
        drafts = torch.multinomial(p, N, replacement=True, generator=gen).t()  # [N, K]
    else:
        drafts = p.argmax(-1).expand(N, K)
    md = spec_metadata(drafts.tolist())
    bonus = torch.multinomial(q[K], N, replacement=True, generator=gen).to(torch.int32)[:, None]
    torch.manual_seed(72)
    out = call_v1(
        module,
        md,
        p.repeat(N, 1) if with_draft_probs else None,
        q[:K].log().repeat(N, 1),
        bonus,
        sampling_metadata([1.0] * N),
    )
    rows = check_layout(out, drafts.tolist(), V)
    for b in range(N):
        if len(rows[b]) == K + 1:
            assert rows[b][-1] == bonus[b, 0]
    assert completed_block_pvalue(out, q, gen) > CHI2_ALPHA


def test_block_verification_greedy_rows_and_seeds(restore_seams):
    module = install(V1_MODULE, BLOCK)
    V = 16
    drafts = [[1, 2, 3, 4], [5], [6, 7], [8, 9, 10], [], [11]]
    md = spec_metadata(drafts)
    logits = random_logits(md.draft_token_ids.shape[0], V, 73)
    draft_probs = torch.softmax(random_logits(logits.shape[0], V, 74), -1)
    bonus = torch.arange(6, dtype=torch.int32)[:, None]
    temps = [0.0, 1.0, 0.0, 0.8, 1.0, 0.0]

    def run(default_seed: int):
        torch.manual_seed(default_seed)
        gens = {1: torch.Generator().manual_seed(5), 3: torch.Generator().manual_seed(6)}
        return call_v1(module, md, draft_probs, logits, bonus, sampling_metadata(temps, gens))

    outs = [run(s) for s in range(4)]
    check_layout(outs[0], drafts, V)
    greedy = vllm_greedy_v1(drafts, logits, bonus[:, 0].tolist())
    for out in outs:
        for b, t in enumerate(temps):
            if t == 0:
                assert torch.equal(out[b], greedy[b])
        assert torch.equal(out[[1, 3]], outs[0][[1, 3]])  # seeded rows reproduce


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_all_nan_target_rows_still_give_one_token(restore_seams, with_draft_probs):
    """vLLM's contract at the seam (its test_all_nan_target_logits_in_range): every request gains
    at least one in-vocabulary token. A request whose first row is all NaN gets token 0 there (as
    vLLM's own verification does); a request with healthy rows is unchanged."""
    module = install(V1_MODULE, REJECTION)
    drafts = [[1, 2], [3], [4, 5]]
    md = spec_metadata(drafts)
    V = 8
    logits = random_logits(md.draft_token_ids.shape[0], V, 3)
    logits[:2] = float("nan")  # request 0's rows
    draft_probs = torch.softmax(random_logits(logits.shape[0], V, 4), -1) if with_draft_probs else None
    bonus = torch.tensor([[3], [4], [5]], dtype=torch.int32)
    for temperatures in ([1.0, 1.0, 1.0], [0.0, 1.0, 0.7]):
        out = call_v1(module, md, draft_probs, logits.clone(), bonus, sampling_metadata(temperatures))
        rows = check_layout(out, drafts, V)
        assert rows[0] == [0]
        assert all(1 <= len(row) for row in rows)


def test_expand_batch_to_tokens_is_ours_while_the_section_is_active(restore_seams):
    """vLLM issue #55005: its CPU build's expand_batch_to_tokens returns uninitialised floats. With
    our section the module's function (which apply_sampling_constraints calls) is expand_to_tokens;
    without it, vLLM's."""
    x = torch.tensor([0.0, 0.7, 1.3])
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    expected = torch.tensor([1.0, 1.0, 1.3, 1.3, 1.3])  # request 1 has no rows; 0 -> 1 (greedy)
    assert torch.equal(v1_runner.expand_to_tokens(x, cu, 5, replace_from=0, replace_to=1), expected)
    assert torch.equal(v1_runner.expand_to_tokens(torch.tensor([3, 4]), cu[:2], 2), torch.tensor([3, 3]))
    assert v1_runner.expand_to_tokens(x, cu, 0).shape == (0,)
    module = install(V1_MODULE, REJECTION)
    assert getattr(module.expand_batch_to_tokens, "__wrapped__", None) is not None  # the plugin's wrapper
    assert torch.equal(module.expand_batch_to_tokens(x, cu, 5, 0, 1), expected)  # ours: the section is on

    def vllms(*args):
        return "vllm's"

    vllms.__module__ = V1_MODULE
    wrapper = v1_runner.expand_batch_to_tokens(vllms)
    assert torch.equal(wrapper(x, cu, 5, 0, 1), expected)
    install(V1_MODULE, None)
    assert wrapper(x, cu, 5, 0, 1) == "vllm's"  # without our section: vLLM's function
