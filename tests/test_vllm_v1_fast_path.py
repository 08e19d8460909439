"""V1's plain steps: ``RejectionSampler.forward`` wrapped by the plugin (v1_runner.forward).

A plain step (temperature only, no logprobs, every logits processor a built-in and idle) is
verified from the model's [T + B, V] logits in place, bonus rows included, with the bonus drawn in
our kernels; everything else goes to vLLM's forward, which calls our ``rejection_sample`` seam.
Tokens are compared with that slow path: greedy rows exactly, random rows token for token where
both draw from the same seeds (every position but a fully accepted request's bonus, which vLLM's
Sampler draws), and the bonus and first tokens by law (chi-square at CHI2_ALPHA, fixed seeds).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import vllm_support  # noqa: F401  (sets VLLM_TARGET_DEVICE before vLLM picks a platform)
from stats_helpers import CHI2_ALPHA, chi2_pvalue
from vllm_support import (
    V1_MODULE,
    check_layout,
    install,
    restore_seams,  # noqa: F401  (fixture)
    sampling_metadata,
    vllm_greedy_v1,
)

from spec_samplers.integrations.vllm import fast_path, v1_runner
from spec_samplers.integrations.vllm.ragged import RaggedVerifier
from spec_samplers.registry import get_sampler

REJECTION = {"acceptance_method": "rejection_sampler"}


def step_metadata(drafts: list[list[int]]):
    """SpecDecodeMetadata as V1's model runner builds it: request r's k_r draft rows, then its
    bonus row (make_dummy leaves the row indices zero)."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    sampled = np.cumsum([len(d) + 1 for d in drafts])
    target, bonus = [], []
    for r, d in enumerate(drafts):
        start = int(sampled[r]) - len(d) - 1
        target += range(start, start + len(d))
        bonus.append(int(sampled[r]) - 1)
    i32 = torch.int32
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor([x for d in drafts for x in d], dtype=i32),
        num_draft_tokens=[len(d) for d in drafts],
        cu_num_draft_tokens=torch.tensor(np.cumsum([len(d) for d in drafts]), dtype=i32),
        cu_num_sampled_tokens=torch.tensor(sampled, dtype=i32),
        target_logits_indices=torch.tensor(target, dtype=i32),
        bonus_logits_indices=torch.tensor(bonus, dtype=i32),
        logits_indices=torch.arange(int(sampled[-1]), dtype=i32),
    )


def verifier(name: str = "rejection_sampler", **options) -> RaggedVerifier:
    return RaggedVerifier(get_sampler(name, **options))


def slow_path(ver, md, draft_probs, logits, sm):
    """vLLM's glue (target rows, fp32, temperature) then our seam; bonus by argmax (greedy rows)
    or -1 (random rows: compared only where the bonus is not emitted)."""
    target = logits[md.target_logits_indices.long()].float()
    temp = sm.temperature if sm.temperature is not None else torch.zeros(len(md.num_draft_tokens))
    rows = torch.searchsorted(md.cu_num_draft_tokens.long(), torch.arange(target.shape[0]), right=True)
    target = target / torch.where(temp == 0, 1.0, temp)[rows][:, None]
    bonus = logits[md.bonus_logits_indices.long()].argmax(-1).to(torch.int32)[:, None]
    bonus = torch.where(temp[:, None] == 0, bonus, -1)
    args = (md.draft_token_ids, md.num_draft_tokens, md.max_spec_len, md.cu_num_draft_tokens)
    return v1_runner.verify(ver, *args, draft_probs, target, bonus, sm)


def random_step(drafts, V, seed, with_draft_probs):
    gen = torch.Generator().manual_seed(seed)
    md = step_metadata(drafts)
    logits = torch.randn(md.logits_indices.shape[0], V, generator=gen) * 2
    q = torch.softmax(torch.randn(md.draft_token_ids.shape[0], V, generator=gen), -1) if with_draft_probs else None
    return md, logits, q


def generators(n: int, seed: int) -> dict[int, torch.Generator]:
    return {i: torch.Generator().manual_seed(seed + i) for i in range(n)}


# --- tokens ------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_draft_probs", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_rows_are_vllms_exactly(with_draft_probs, dtype):
    drafts = [[1, 2, 3], [4], [5, 6], [7, 0, 1, 2], [3]]
    md, logits, q = random_step(drafts, 16, 0, with_draft_probs)
    logits = logits.to(dtype)
    argmax = logits.float().argmax(-1)
    md.draft_token_ids[:2] = argmax[:2].to(torch.int32)  # request 0 accepts two drafts
    md.draft_token_ids[6:10] = argmax[9:13].to(torch.int32)  # request 3 accepts all four
    flat = md.draft_token_ids.tolist()
    drafts = [flat[0:3], flat[3:4], flat[4:6], flat[6:10], flat[10:11]]
    target, bonus = logits[md.target_logits_indices.long()].float(), argmax[md.bonus_logits_indices.long()]
    expected = vllm_greedy_v1(drafts, target, bonus.tolist())
    for temps in ([0.0] * 5, [0.0, 0.9, 0.0, 0.0, 1.3]):  # all greedy; mixed
        out = fast_path.verify_plain_step(verifier(), md, q, logits, sampling_metadata(temps))
        assert out.dtype == torch.int32 and out.shape == (5, 5)
        check_layout(out, drafts, 16)
        for r, t in enumerate(temps):
            if t == 0:
                assert torch.equal(out[r], expected[r]), (temps, r)
    assert out[3].tolist() == [*flat[6:10], int(bonus[3])]  # the bonus row's argmax, drawn in place


@pytest.mark.parametrize("with_draft_probs", [False, True])
@pytest.mark.parametrize("name", ["rejection_sampler", "block_verification"])
def test_random_rows_match_the_slow_path_token_for_token(name, with_draft_probs):
    """Same seeds (every request seeded alike in both runs): the same tokens at every position,
    but a fully accepted request's bonus, which the fast path draws itself."""
    V = 12
    drafts = [[1, 2, 3], [4], [5, 6], [7, 0, 1, 2], [3], [8, 8]] * 6
    md, logits, q = random_step(drafts, V, 1, with_draft_probs)
    argmax = logits.argmax(-1)  # argmax drafts: many acceptances, a few full ones
    md.draft_token_ids.copy_(argmax[md.target_logits_indices.long()].to(torch.int32))
    drafts = [d.tolist() for d in md.draft_token_ids.split(md.num_draft_tokens)]
    temps = [0.8, 1.0, 0.0, 1.5, 0.6, 1.0] * 6
    ver = verifier(name)
    fast = fast_path.verify_plain_step(ver, md, q, logits, sampling_metadata(temps, generators(36, 5)))
    slow = slow_path(ver, md, q, logits, sampling_metadata(temps, generators(36, 5)))
    check_layout(fast, drafts, V)
    full = 0
    for r, d in enumerate(drafts):
        n = int((slow[r] >= 0).sum())
        assert torch.equal(fast[r, :n], slow[r, :n]), r
        if (fast[r, n:] >= 0).any():  # only a fully accepted random row's bonus (slow: vLLM's, here -1)
            assert n == len(d) and fast[r, :n].tolist() == d and temps[r] != 0, r
            assert fast[r, n] >= 0 and (fast[r, n + 1 :] == -1).all(), r
            full += 1
    assert full > 0  # the bonus draw was exercised


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_bonus_and_first_token_laws(with_draft_probs):
    """Lossless: the first token of a step follows the target row 0 law (drafts from q, or
    uniform point masses), and a bonus follows softmax(bonus row / T)."""
    V, B, T = 6, 3000, 0.7
    gen = torch.Generator().manual_seed(3)
    row0, bonus_row = torch.randn(V, generator=gen), torch.randn(V, generator=gen)
    md = step_metadata([[0]] * B)
    logits = torch.stack([row0, bonus_row]).repeat(B, 1)  # [2B, V]
    q_row = torch.softmax(torch.randn(V, generator=gen), -1)
    if with_draft_probs:
        md.draft_token_ids.copy_(torch.multinomial(q_row, B, replacement=True, generator=gen).to(torch.int32))
        q = q_row.repeat(B, 1)
    else:
        md.draft_token_ids.copy_(torch.randint(0, V, (B,), generator=gen, dtype=torch.int32))
        q = None
    torch.manual_seed(11)
    out = fast_path.verify_plain_step(verifier(), md, q, logits, sampling_metadata([T] * B))
    assert chi2_pvalue(out[:, 0].long(), torch.softmax(row0 / T, -1)) > CHI2_ALPHA
    bonus = out[out[:, 1] != -1, 1].long()
    assert bonus.numel() > 300
    assert chi2_pvalue(bonus, torch.softmax(bonus_row / T, -1)) > CHI2_ALPHA


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_seeded_requests_reproduce(with_draft_probs):
    """Re-seeded generators give the same tokens whatever torch's default generator holds, a
    request without drafts included (its bonus is drawn from its generator every step)."""
    drafts = [[1, 2], [], [3, 4, 5], [6]]
    md, logits, q = random_step(drafts, 10, 4, with_draft_probs)
    outs = []
    for default_seed in (0, 1):
        torch.manual_seed(default_seed)
        sm = sampling_metadata([1.0, 0.9, 1.2, 0.7], generators(4, 100))
        outs.append(fast_path.verify_plain_step(verifier(), md, q, logits, sm))
    assert torch.equal(outs[0], outs[1])
    seen = set()
    for seed in range(20):  # the request without drafts is a sample, not a constant
        sm = sampling_metadata([1.0, 0.9, 1.2, 0.7], {1: torch.Generator().manual_seed(seed)})
        seen.add(int(fast_path.verify_plain_step(verifier(), md, q, logits, sm)[1, 0]))
    assert len(seen) > 1


def counters(sampler) -> tuple[int, int, int]:
    return int(sampler.num_draft_tokens), int(sampler.num_accepted_tokens), int(sampler.num_emitted_tokens)


def auto_and_reference(name, md, logits, temps, seeded, seed):
    """(tokens, counters) of the plain step with backend="auto", then with the PyTorch reference,
    each from the same global seed (the unseeded requests' seeds) and fresh generators for the
    first ``seeded`` requests."""
    outs = []
    for backend in ("auto", "torch"):
        ver = verifier(name, backend=backend)
        torch.manual_seed(seed)
        sm = sampling_metadata(temps, generators(seeded, seed))
        outs.append((fast_path.verify_plain_step(ver, md, None, logits, sm), counters(ver.sampler)))
    return outs


@pytest.mark.parametrize("name", ["rejection_sampler", "block_verification"])
def test_steps_without_drafts_are_the_references_tokens_in_one_compiled_pass(name, monkeypatch):
    """A step whose requests have no drafts, on CPU fp32 logits with numba (the test extra), is
    drawn by the compiled draw (softmax from logits fused with the recovery race of position 0,
    ``spec_samplers.cpu.draw``): the tokens and counters of the seam's path with the sampler's
    PyTorch reference (backend="torch", which never takes it), on rows with NaN, +inf logits,
    no mass, greedy, tiny, +inf, negative and NaN temperatures, seeded and unseeded requests."""
    from spec_samplers.cpu import draw as cpu_draw

    calls = []
    draw = cpu_draw.draw_from_logits
    monkeypatch.setattr(cpu_draw, "draw_from_logits", lambda *a: calls.append(1) or draw(*a))
    temps = [0.7, 1.0, 0.5, 1.2, 0.0, 2.0, 1e-30, float("inf"), -1.0, float("nan"), 0.0, 0.3]
    for V in (7, 3000):
        md, logits, _ = random_step([[] for _ in temps], V, V, False)
        logits[1, 3] = float("nan")
        logits[2] = float("-inf")
        logits[3, 2] = logits[3, 5] = float("inf")
        logits[10] = float("nan")
        (fast, fast_stats), (ref, ref_stats) = auto_and_reference(name, md, logits, temps, 3, V)
        assert len(calls) == 1 + (V == 3000)  # the auto run only
        assert fast.dtype == torch.int32 and fast.shape == (len(temps), 1)
        assert torch.equal(fast, ref), V
        assert fast_stats == ref_stats
        assert fast[2, 0] == 0 and fast[4, 0] == logits[4].argmax()  # no mass: token 0; greedy: argmax


@pytest.mark.parametrize("name", ["rejection_sampler", "block_verification"])
def test_steps_with_point_drafts_are_the_references_tokens_in_one_compiled_pass(name, monkeypatch):
    """A rejection-sampling or block-verification step with point-mass drafts (n-gram, EAGLE: no
    draft probabilities), on CPU fp32 logits with numba (the test extra), is verified by the
    compiled step (each row's softmax made from its logits as the verification reads it,
    ``cpu._logits_kernels``' kernel of the sampler's reference): the tokens and counters of the
    seam's path with the sampler's PyTorch reference (backend="torch"), with drafts accepted
    (argmax drafts), rejected, out of range (-1, V + 3), a request whose drafts are all accepted
    and one whose first draft is rejected, requests without drafts, rows with NaN, +inf logits and
    without mass (before and at a rejection), greedy, tiny, +inf, negative and NaN temperatures,
    seeded and unseeded requests."""
    calls = []
    compiled = fast_path._verify_point_drafts
    monkeypatch.setattr(fast_path, "_verify_point_drafts", lambda *a: calls.append(1) or compiled(*a))
    kernels = []
    module = fast_path._point_kernels()
    kernel_name = fast_path._POINT_STEP_KERNELS[get_sampler(name).reference_op.__name__]
    kernel = getattr(module, kernel_name)
    monkeypatch.setattr(module, kernel_name, lambda *a: kernels.append(1) or kernel(*a))
    drafts = [[1, 2, 3], [4], [], [5, 6], [7, 0, 1, 2], [3], [8, 8], [], [2, 2, 2, 2], [6]] * 2
    drafts += [[1, 2, 0, 3], [3, 1, 2, 0]]  # all accepted (each draft's logit + 40), first rejected
    temps = [0.7, 1.0, 0.5, 1.2, 0.0, 2.0, 1e-30, float("inf"), -1.0, float("nan")] * 2
    temps[10:] = [0.9, 1e-30, 0.6, 0.0, 1.1, 0.8, float("inf"), 0.0, 1.0, 0.4]
    temps += [1.0, 0.8]
    for V in (7, 3000):
        md, logits, _ = random_step(drafts, V, V + 1, False)
        ids = logits.argmax(-1)[md.target_logits_indices.long()].to(torch.int32)  # accepted often
        ids[1::3] = md.draft_token_ids[1::3]  # and random drafts
        ids[5], ids[17] = -1, V + 3  # out of range
        ids[-8:] = md.draft_token_ids[-8:]
        md.draft_token_ids.copy_(ids)
        logits[1, 3] = float("nan")
        logits[2] = float("-inf")  # request 0's third row: no mass
        logits[4, 2] = logits[4, 5] = float("inf")
        logits[10] = float("nan")
        logits[-11] = float("-inf")  # a bonus row without mass (request 19's)
        first_rows = md.target_logits_indices.long()
        for i in range(1, 5):  # request 20's drafts weigh ~1, request 21's first draft 0
            logits[first_rows[-i - 4], ids[-i - 4]] += 40.0
        logits[first_rows[-4], ids[-4]] = float("-inf")
        (fast, fast_stats), (ref, ref_stats) = auto_and_reference(name, md, logits, temps, 4, V)
        assert len(calls) == len(kernels) == 1 + (V == 3000)  # the auto run only
        assert fast.dtype == torch.int32 and fast.shape == (len(drafts), 5)
        assert torch.equal(fast, ref), V
        assert fast_stats == ref_stats
        assert 0 < fast_stats[1] < md.draft_token_ids.shape[0]  # some drafts accepted, some rejected
        assert torch.equal(fast[-2, :4], ids[-8:-4]) and fast[-2, 4] >= 0  # all accepted, and a bonus
        assert fast[-1, 0] >= 0 and fast[-1, 0] != ids[-4] and (fast[-1, 1:] == -1).all()  # first rejected


# --- routing -----------------------------------------------------------------------------------


def processors(*active: str):
    """vLLM's built-in logits processors (attributes only), idle unless named in ``active``."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
        MinTokensLogitsProcessor,
    )

    min_p = MinPLogitsProcessor.__new__(MinPLogitsProcessor)
    min_p.min_p_count = int("min_p" in active)
    bias = LogitBiasLogitsProcessor.__new__(LogitBiasLogitsProcessor)
    bias.biases = {0: {1: 2.0}} if "bias" in active else {}
    min_tokens = MinTokensLogitsProcessor.__new__(MinTokensLogitsProcessor)
    min_tokens.min_toks = {0: (3, [], {1}, False)} if "min_tokens" in active else {}
    return LogitsProcessors([min_tokens, bias, min_p])


class CustomProcessor:  # any processor that is not a built-in: may change the logits
    def is_argmax_invariant(self):
        return False


FALLBACKS = {
    "top_k": dict(metadata=dict(top_k=torch.tensor([5, 5]))),
    "top_p": dict(metadata=dict(top_p=torch.tensor([0.9, 1.0]))),
    "penalties": dict(metadata=dict(no_penalties=False)),
    "allowed_tokens": dict(metadata=dict(allowed_token_ids_mask=torch.zeros(2, 8, dtype=torch.bool))),
    "bad_words": dict(metadata=dict(bad_words_token_ids={0: [[1]]})),
    "logprobs": dict(metadata=dict(max_num_logprobs=0)),
    "logprob_token_ids": dict(metadata=dict(logprob_token_ids={0: [1]})),
    "thinking_budget": dict(
        metadata=dict(thinking_budget_state_holder=SimpleNamespace(has_tracked_requests=lambda: True))
    ),
    "min_p": dict(metadata=dict(logitsprocs=functools.partial(processors, "min_p"))),
    "logit_bias": dict(metadata=dict(logitsprocs=functools.partial(processors, "bias"))),
    "min_tokens": dict(metadata=dict(logitsprocs=functools.partial(processors, "min_tokens"))),
    "custom_processor": dict(
        metadata=dict(logitsprocs=SimpleNamespace(argmax_invariant=[], non_argmax_invariant=[CustomProcessor()]))
    ),  # fmt: skip
    "synthetic": dict(sampler=dict(synthetic_mode=True)),
    "fly": dict(sampler=dict(fly_window_size=2)),
    "typical_acceptance": dict(section={"acceptance_method": "typical_acceptance_sampler"}),
    "strict_mode": dict(section={**REJECTION, "strict_mode": True}),
    "other_draft_vocab": dict(draft_vocab=7),
    "not_installed": dict(section=None),
}


def routed(case: dict, with_draft_probs: bool = True) -> str:
    """Which path the wrapped forward takes for a 2-request step changed by ``case``."""
    install(V1_MODULE, case.get("section", REJECTION))
    md, logits, _ = random_step([[1, 2], [3]], 8, 6, False)
    q = torch.softmax(torch.randn(3, case.get("draft_vocab", 8)), -1) if with_draft_probs else None
    sm = sampling_metadata([1.0, 0.0])
    for key, value in case.get("metadata", {}).items():
        # vLLM's processors are built here, not at import (the module is collected without vLLM)
        setattr(sm, key, value() if isinstance(value, functools.partial) else value)
    sampler = SimpleNamespace(**{"synthetic_mode": False, "fly_window_size": None, **case.get("sampler", {})})
    taken = []

    def vllm_forward(self, metadata, draft_probs, logits, sampling_metadata):
        taken.append("vllm")
        return "vllm's output"

    vllm_forward.__module__ = V1_MODULE  # where the wrapper finds the seam
    result = v1_runner.forward(vllm_forward)(sampler, md, q, logits, sm)
    if taken:
        assert result == "vllm's output"
        return "vllm"
    assert result.logprobs_tensors is None and result.sampled_token_ids.dtype == torch.int32
    return "fast"


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_each_fallback_condition_routes_to_vllms_forward(restore_seams, case):
    assert routed({}) == "fast"  # the same step, plain
    assert routed(FALLBACKS[case]) == "vllm"


def test_plain_steps_with_idle_builtin_processors_take_the_fast_path(restore_seams):
    idle = dict(metadata=dict(logitsprocs=processors()))
    assert routed(idle, with_draft_probs=True) == routed(idle, with_draft_probs=False) == "fast"
    block = dict(section={"acceptance_method": "block_verification"})
    assert routed(block) == "fast"


def test_plugin_wraps_vllms_forward_end_to_end(restore_seams):
    """The class's own forward (as the plugin wrapped it on import): a plain step skips vLLM's
    Sampler; a top-k step goes through vLLM's forward, its Sampler and our seam."""
    from vllm.v1.outputs import SamplerOutput

    module = install(V1_MODULE, REJECTION)
    calls = []

    class ArgmaxBonusSampler(torch.nn.Module):  # vLLM's Sampler needs vllm._C (GPU build)
        logprobs_mode = "raw_logprobs"

        def forward(self, logits, sampling_metadata, predict_bonus_token=False, logprobs_mode_override=None):
            calls.append(logits.shape[0])
            return SamplerOutput(logits.argmax(-1, keepdim=True).to(torch.int32), None)

    rs = module.RejectionSampler.__new__(module.RejectionSampler)
    torch.nn.Module.__init__(rs)
    rs.sampler = ArgmaxBonusSampler()
    rs.is_processed_logprobs_mode = rs.is_logits_logprobs_mode = rs.synthetic_mode = rs.use_fp64_gumbel = False
    rs.synthetic_conditional_rates = rs.fly_window_size = rs.fly_entropy_threshold = None
    rs.use_fly, rs.fly_entropy_top_k = False, 3
    drafts = [[1, 2, 3], [4], [5, 6]]
    md, logits, _ = random_step(drafts, 8, 7, False)
    bonus = logits[md.bonus_logits_indices.long()].argmax(-1).tolist()
    expected = vllm_greedy_v1(drafts, logits[md.target_logits_indices.long()], bonus)
    plain = rs(md, None, logits.clone(), sampling_metadata([0.0] * 3))
    assert calls == [] and torch.equal(plain.sampled_token_ids, expected)
    top_k = rs(md, None, logits.clone(), sampling_metadata([0.0] * 3, top_k=torch.tensor([4, 4, 4])))
    assert calls == [3] and torch.equal(top_k.sampled_token_ids, expected)
