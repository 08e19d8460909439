"""Model Runner V2's plain chunks: ``RejectionSampler._verify`` wrapped by the plugin
(v2_runner.verify_chunk), with the per-request flag its wrapper of ``Sampler.add_request`` records.

A plain chunk (every request needs nothing but its temperature, no processed logprobs, none of
vLLM's own schemes) is verified from the raw logits in place, each request at its own temperature
in our kernels; everything else goes to vLLM's ``_verify``: its ``apply_sampling_params``, then
our ``rejection_sample`` seam. The tests build vLLM's real Sampler on CPU (its UVA buffers as
plain tensors) and feed it real SamplingParams through its own ``add_request``; vLLM's Triton
temperature kernel cannot run in this process, so its PyTorch twin stands in (the same fp32
quotient, the same rows skipped). Tokens are compared token for token with that slow path on
shared seeds (the randomness is keyed by the request's seed and position in both, and the fp32
probabilities agree to rounding: a token could differ only where a uniform falls within rounding
of a boundary, which these fixed seeds do not hit; greedy rows are argmaxes, exact).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import vllm_support  # noqa: F401  (sets VLLM_TARGET_DEVICE before vLLM picks a platform)
from vllm_support import (  # noqa: F401
    V2_MODULE,
    engine_config,
    install,
    make_model_dir,
    restore_seams,
    seam_module,
    v2_input_batch,
    v2_inputs,
)

from spec_samplers.integrations.vllm import fast_path, v2_runner

REJECTION = {"acceptance_method": "rejection_sampler"}
V, K = 24, 3  # the engine config's n-gram drafter proposes K = 3 tokens
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("tiny-llama-v2-fast"))


def temperature_twin(states):
    """vLLM's ``_temperature_kernel`` in PyTorch: each row's fp32 logits divided by its request's
    T, rows at T = 0 or 1 left as they are."""

    def apply_temperature(logits, expanded_idx_mapping, idx_mapping_np):
        t = states.temperature.gpu[expanded_idx_mapping.long()][:, None]
        logits.copy_(torch.where((t == 0) | (t == 1), logits, logits / t))

    return apply_temperature


_VLLM_TEMPERATURE_KERNEL = """
import sys, torch
from spec_samplers.bench.cost.workloads import prepare_vllm
prepare_vllm()  # vLLM's real Triton kernels (run by the interpreter)
from vllm.v1.worker.gpu.sample.gumbel import apply_temperature
logits, rows, temperature = torch.load(sys.argv[1])
processed = torch.empty_like(logits, dtype=torch.float32).copy_(logits)  # as apply_sampling_params
apply_temperature(processed, rows, temperature)
torch.save(processed, sys.argv[2])
"""


def test_temperature_twin_is_vllms_kernel(tmp_path):
    """The twin gives exactly what vLLM's ``_temperature_kernel`` gives (run in a child process,
    where vLLM imports its Triton kernels and the interpreter runs them)."""
    import os
    import subprocess
    import sys

    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(8, 300, generator=gen) * 4).to(torch.bfloat16)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.45, 2.0, 0.33])
    rows = torch.tensor([1, 0, 2, 3, 4, 5, 6, 1], dtype=torch.int32)
    torch.save((logits, rows, temperature), tmp_path / "in.pt")
    script = tmp_path / "kernel.py"
    script.write_text(_VLLM_TEMPERATURE_KERNEL)
    env = dict(os.environ, TRITON_INTERPRET="1", VLLM_TARGET_DEVICE="cpu")
    cmd = [sys.executable, str(script), str(tmp_path / "in.pt"), str(tmp_path / "out.pt")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    states = SimpleNamespace(temperature=SimpleNamespace(gpu=temperature))
    twin = logits.float()
    temperature_twin(states)(twin, rows, None)
    assert torch.equal(torch.load(tmp_path / "out.pt"), twin)
    assert not torch.equal(twin, logits.float())  # rows were divided


def vllm_sampler(monkeypatch, config, max_num_reqs: int):
    """Model Runner V2's real Sampler (the plugin wraps its add_request), on CPU."""
    import vllm.v1.worker.gpu.buffer_utils as buffers
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.states import RequestState

    monkeypatch.setattr(buffers, "is_uva_available", lambda: False)  # UVA buffers as plain tensors
    req_states = RequestState(max_num_reqs, 64, 64, K, V, CPU)
    sampler = Sampler(config, max_num_reqs, V, CPU, req_states)
    sampler.sampling_states.apply_temperature = temperature_twin(sampler.sampling_states)
    return sampler


def add_requests(sampler, requests: list[dict]) -> None:
    """Each request's SamplingParams through vLLM's own add_request (temperature, seed, extras)."""
    from vllm import SamplingParams

    for r in requests:
        params = SamplingParams(temperature=r.get("temperature", 1.0), seed=r.get("seed"), **r.get("params", {}))
        sampler.add_request(r["state"], params)
    sampler.sampling_states.apply_staged_writes()  # temperatures and seeds to the device tensors


def rejection_sampler(config, sampler):
    """Model Runner V2's RejectionSampler built as its model runner builds it (the plugin's
    observer installs the seam from the config), before any request is added, as vLLM does."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(config):
        return seam_module(V2_MODULE).RejectionSampler(sampler, config.speculative_config, CPU)


def verify_args(inputs: dict, logits, draft_logits) -> list:
    """``_verify``'s arguments for the whole batch as one chunk, as ``_verify_in_chunks`` passes them."""
    batch = v2_input_batch(inputs)
    return [
        logits,
        draft_logits,
        inputs["draft_sampled"],
        inputs["pos"],
        batch.cu_num_logits,
        batch.idx_mapping,
        batch.idx_mapping_np,
        batch.expanded_idx_mapping,
        batch.expanded_local_pos,
        batch.seq_lens_cpu_upper_bound.numpy(),
        inputs["draft_sampled"],
    ]


def vllm_verify():
    """vLLM's own ``_verify`` (under the plugin's wrapper, if the class is wrapped)."""
    method = seam_module(V2_MODULE).RejectionSampler._verify
    return getattr(method, "__wrapped__", method)


def counting_glue(sampler) -> list:
    """Counts the calls of the sampler's apply_sampling_params (vLLM's method, as it is)."""
    calls = []
    method = sampler.apply_sampling_params

    def apply_sampling_params(*args, **kwargs):
        calls.append(1)
        return method(*args, **kwargs)

    sampler.apply_sampling_params = apply_sampling_params
    return calls


def mixed_requests(seed: int, R: int = 14) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    temps = [0.0, 0.7, 1.0, 1.3, 0.45, 0.0, 2.0]
    states = torch.randperm(R + 3, generator=gen)[:R].tolist()  # distinct slots, some left free
    return [
        dict(
            state=states[r],
            pos=11 * r + 4,
            drafts=torch.randint(0, V, (r % (K + 1),), generator=gen).tolist(),
            temperature=temps[r % len(temps)],
            seed=1000 + r,
        )
        for r in range(R)
    ]


def step(requests, seed: int, dtype=torch.bfloat16, leaning: bool = True):
    """(inputs, logits [L, V] raw in ``dtype``, draft cache [max_num_reqs, K, V]) with the drafts
    leaning to be accepted, so that acceptances, rejections and bonus draws all occur."""
    max_num_reqs = max(r["state"] for r in requests) + 1
    inputs = v2_inputs(requests, V, K, max_num_reqs=max_num_reqs)
    gen = torch.Generator().manual_seed(seed)
    L = int(inputs["cu_num_logits"][-1])
    logits = torch.randn(L, V, generator=gen) * 1.5
    cache = torch.randn(max_num_reqs, K, V, generator=gen)
    if leaning:
        row = 0
        for r in requests:
            for i, x in enumerate(r["drafts"]):
                logits[row + i, x] += 2.0
                cache[r["state"], i, x] += 2.0
            row += len(r["drafts"]) + 1
    return inputs, logits.to(dtype), cache.to(dtype)


# --- tokens ------------------------------------------------------------------------------------


@pytest.mark.parametrize("probabilistic", [True, False], ids=["draft_logits", "point_mass"])
@pytest.mark.parametrize("name", ["rejection_sampler", "block_verification"])
def test_plain_chunk_matches_vllms_glue_and_our_seam(model_dir, restore_seams, monkeypatch, name, probabilistic):
    """The fast path's tokens are the slow path's (vLLM's apply_sampling_params, then our seam),
    greedy and random rows, on the reference and on the kernels; the processed logits returned
    are the raw logits, as vLLM's own glue returns them for a chunk that needs no processing."""
    from conftest import KERNEL_BACKEND

    from spec_samplers.registry import get_sampler

    config = engine_config(model_dir, {"spec_samplers": {"acceptance_method": name}})
    requests = mixed_requests(5)
    inputs, logits, cache = step(requests, 6)
    draft_logits = cache if probabilistic else None
    sampler = vllm_sampler(monkeypatch, config, len(inputs["temperature"]))
    rs = rejection_sampler(config, sampler)
    add_requests(sampler, requests)
    module = seam_module(V2_MODULE)
    glue = counting_glue(sampler)
    slow = vllm_verify()(rs, *verify_args(inputs, logits, draft_logits))
    assert len(glue) == 1 and slow[0].dtype == torch.float32  # vLLM's glue ran: the fp32 copy
    fast_verify = v2_runner.verify_chunk(vllm_verify())
    for backend in ("torch", KERNEL_BACKEND):
        monkeypatch.setattr(
            module, "rejection_sample", v2_runner.make_rejection_sample(get_sampler(name, backend=backend), None)
        )
        processed, sampled, num_sampled = fast_verify(rs, *verify_args(inputs, logits, draft_logits))
        assert len(glue) == 1  # skipped
        assert processed is logits
        assert torch.equal(sampled, slow[1]) and torch.equal(num_sampled, slow[2]), backend
    n = num_sampled.tolist()
    assert any(c == len(r["drafts"]) + 1 for c, r in zip(n, requests))  # bonus tokens drawn
    assert any(c < len(r["drafts"]) + 1 for c, r in zip(n, requests))  # and rejections


def test_greedy_requests_are_the_argmax(model_dir, restore_seams, monkeypatch):
    """An all-greedy chunk (no temperature at all: vLLM's glue would not even copy) and greedy
    requests with top-k / top-p / min-p set (which leave the argmax alone, and which vLLM's own
    rule does not count for them) take the fast path and follow vLLM's greedy rule."""
    from test_vllm_v2_runner import greedy_expected

    config = engine_config(model_dir, {"spec_samplers": REJECTION})
    requests = [dict(r, temperature=0.0) for r in mixed_requests(7, R=8)]
    requests[1]["params"] = dict(top_k=3, top_p=0.5, min_p=0.2)
    inputs, logits, cache = step(requests, 8)
    sampler = vllm_sampler(monkeypatch, config, len(inputs["temperature"]))
    rs = rejection_sampler(config, sampler)
    add_requests(sampler, requests)
    glue = counting_glue(sampler)
    _, sampled, num_sampled = v2_runner.verify_chunk(vllm_verify())(rs, *verify_args(inputs, logits, cache))
    assert glue == []
    assert torch.equal(sampled, greedy_expected(requests, logits.float(), K))
    assert num_sampled.tolist() == (sampled != -1).sum(1).tolist()


def test_seeded_requests_reproduce(model_dir, restore_seams, monkeypatch):
    """Same seeds and positions: the same tokens, whatever torch's default generator holds; other
    seeds: other tokens (flat rows, so every draw shows)."""
    config = engine_config(model_dir, {"spec_samplers": REJECTION})
    outs = []
    for seeds, torch_seed in ((0, 1), (0, 2), (50, 1)):
        requests = [dict(r, temperature=0.9, seed=r["seed"] + seeds) for r in mixed_requests(9, R=10)]
        inputs, logits, cache = step(requests, 10, leaning=False)
        logits, cache = logits * 0, cache * 0  # uniform target and drafter
        sampler = vllm_sampler(monkeypatch, config, len(inputs["temperature"]))
        rs = rejection_sampler(config, sampler)
        add_requests(sampler, requests)
        torch.manual_seed(torch_seed)
        outs.append(v2_runner.verify_chunk(vllm_verify())(rs, *verify_args(inputs, logits, cache))[1])
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])


def test_verify_in_chunks_with_several_chunks(model_dir, restore_seams, monkeypatch):
    """vLLM's own _verify_in_chunks, the class's _verify as the plugin wrapped it: cut into chunks
    of whole requests, the tokens are those of one chunk and of the slow path, and vLLM's glue
    never runs; a chunk whose requests need more (min-p) goes to vLLM's _verify, the others stay fast."""
    from vllm.v1.worker.gpu.sample.states import NO_LOGPROBS

    config = engine_config(model_dir, {"spec_samplers": REJECTION})
    requests = mixed_requests(11, R=12)
    inputs, logits, cache = step(requests, 12)
    sampler = vllm_sampler(monkeypatch, config, len(inputs["temperature"]))
    rs = rejection_sampler(config, sampler)
    add_requests(sampler, requests)
    assert getattr(type(rs)._verify, "__spec_samplers_wraps__", False)  # the plugin's wrapper
    batch = v2_input_batch(inputs)
    L = logits.shape[0]

    def chunks(max_chunk_logits):
        out = rs._verify_in_chunks(
            logits, batch, cache, inputs["draft_sampled"], inputs["pos"], max_chunk_logits, NO_LOGPROBS
        )
        assert out[2] is None  # no logprobs asked
        return out[0], out[1]

    glue = counting_glue(sampler)
    whole, chunked = chunks(L), chunks(6)
    assert glue == []
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])
    monkeypatch.setattr(type(rs), "_verify", vllm_verify())  # the slow path: vLLM's glue, our seam
    slow = chunks(6)
    assert len(glue) > 2  # really several chunks
    assert torch.equal(slow[0], whole[0]) and torch.equal(slow[1], whole[1])
    monkeypatch.undo()
    # one request with min-p: its chunk goes through vLLM's glue, the others do not
    sampler = vllm_sampler(monkeypatch, config, len(inputs["temperature"]))
    requests[1]["params"] = dict(min_p=0.05)  # (a random request: vLLM ignores min-p for greedy ones)
    sampler.sampling_states.apply_min_p = lambda *args: None  # its Triton kernel cannot run here: routing only
    rs = rejection_sampler(config, sampler)
    add_requests(sampler, requests)
    glue = counting_glue(sampler)
    chunks(6)
    assert len(glue) == 1


@pytest.mark.parametrize("in_place", [True, False], ids=["bonus_rows_in_place", "eager_bonus"])
def test_raw_logits_at_their_temperature_match_divided_logits(monkeypatch, in_place):
    """The seam's ``logits_divided=False`` (raw logits, each request's T applied by us) gives the
    tokens of the logits divided as vLLM's glue divides them, on the bonus-row path (T in the
    kernels) and on the eager one (one division here), greedy and random requests mixed."""
    from vllm_support import v2_args

    from spec_samplers.integrations.vllm.ragged import RaggedVerifier
    from spec_samplers.rejection import RejectionSampler

    requests = mixed_requests(21, R=10)
    inputs, logits, cache = step(requests, 22, dtype=torch.float32)
    t = inputs["temperature"][inputs["expanded_idx_mapping"].long()][:, None]
    divided = torch.where((t == 0) | (t == 1), logits, logits / t)  # vLLM's temperature kernel
    if not in_place:
        monkeypatch.setattr(v2_runner, "bonus_row_verifiable", lambda sampler: False)
    verifier = RaggedVerifier(RejectionSampler())
    for drafts in (cache, None):
        expected = v2_runner.verify(verifier, divided, drafts, *v2_args(inputs), K)
        out = v2_runner.verify(verifier, logits, drafts, *v2_args(inputs), K, logits_divided=False)
        assert torch.equal(out[0], expected[0]) and torch.equal(out[1], expected[1])


# --- routing -----------------------------------------------------------------------------------


class CustomProcessor:
    """A logits processor that is not one of vLLM's built-ins: may change any row, whatever its
    add_request answers."""

    def add_request(self, req_idx, sampling_params):
        return False

    def apply(self, logits, ctx):
        return logits


def thinking_budget(sampler):
    sampler.thinking_budget_state = SimpleNamespace(add_request=lambda req_idx, params: True)


def custom_processor(sampler):
    sampler.logits_processors.append(CustomProcessor())


def subclass_glue(sampler):
    sampler.__class__ = type("SamplerWithGlue", (type(sampler),), {"apply_sampling_params": lambda self, *a: a[0]})


def processed_logprobs(sampler):
    sampler.logprobs_mode = "processed_logprobs"


FALLBACKS = {
    "min_p": dict(params=dict(min_p=0.1)),
    "top_k": dict(params=dict(top_k=5)),
    "top_p": dict(params=dict(top_p=0.9)),
    "logit_bias": dict(params=dict(logit_bias={1: 2.0})),
    "allowed_tokens": dict(params=dict(allowed_token_ids=[1, 2, 3])),
    "min_tokens": dict(params=dict(min_tokens=4, stop_token_ids=[2])),
    "presence_penalty": dict(params=dict(presence_penalty=0.5)),
    "frequency_penalty": dict(params=dict(frequency_penalty=0.5)),
    "repetition_penalty": dict(params=dict(repetition_penalty=1.2)),
    "bad_words": dict(params=dict(_bad_words_token_ids=[[3]])),
    "thinking_budget": dict(sampler=thinking_budget),
    "custom_processor": dict(sampler=custom_processor),
    "processed_logprobs": dict(sampler=processed_logprobs, params=dict(logprobs=2)),
    "sampling_mask": dict(sampler=lambda s: setattr(s, "return_sampling_mask", True)),
    "glue_of_a_subclass": dict(sampler=subclass_glue),
    "slot_never_added": dict(skip_add=True),
    "synthetic": dict(rs=dict(synthetic_conditional_rates=torch.ones(K))),
    "vllm_block_verification": dict(rs=dict(use_block_verification=True)),
    "fly": dict(rs=dict(fly_window_size=2)),
    "watermark": dict(rs=dict(watermark_key=7)),
    "typical_acceptance": dict(section={"acceptance_method": "typical_acceptance_sampler"}),
    "strict_mode": dict(section={**REJECTION, "strict_mode": True}),
    "not_installed": dict(section=None),
}
#: changes that keep a chunk plain
PLAIN = {
    "plain": {},
    "raw_logprobs": dict(params=dict(logprobs=2)),  # vLLM computes them from the raw logits
    "processed_mode_without_logprobs": dict(sampler=processed_logprobs),
    "greedy_with_filters": dict(params=dict(top_k=5, top_p=0.5, min_p=0.1), temperature=0.0),
    "block_verification": dict(section={"acceptance_method": "block_verification"}),
}


def routed(model_dir, monkeypatch, case: dict) -> str:
    """Which path the wrapped _verify takes for a 2-request chunk, the second request changed by ``case``."""
    config = engine_config(model_dir, {"spec_samplers": REJECTION})
    requests = [
        dict(state=0, pos=5, drafts=[1, 2], temperature=0.8, seed=1),
        dict(
            state=2, pos=9, drafts=[3], temperature=case.get("temperature", 0.6), seed=2, params=case.get("params", {})
        ),
    ]
    inputs, logits, cache = step(requests, 13)
    sampler = vllm_sampler(monkeypatch, config, 3)
    case.get("sampler", lambda s: None)(sampler)
    rs = rejection_sampler(config, sampler)
    add_requests(sampler, requests[:1] if case.get("skip_add") else requests)
    for key, value in case.get("rs", {}).items():
        setattr(rs, key, value)
    if "section" in case:
        install(V2_MODULE, case["section"])
    taken = []

    @functools.wraps(vllm_verify())  # vLLM's signature and module (where the wrapper finds the seam)
    def spy(self, *args):
        taken.append("vllm")
        return "vllm's triple"

    result = v2_runner.verify_chunk(spy)(rs, *verify_args(inputs, logits, cache))
    if taken:
        assert result == "vllm's triple"
        return "vllm"
    processed, sampled, num_sampled = result
    assert processed is logits and sampled.shape == (2, K + 1) and num_sampled.dtype == torch.int32
    return "fast"


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_each_fallback_condition_routes_to_vllms_verify(model_dir, restore_seams, monkeypatch, case):
    assert routed(model_dir, monkeypatch, {}) == "fast"  # the same chunk, plain
    assert routed(model_dir, monkeypatch, FALLBACKS[case]) == "vllm"


@pytest.mark.parametrize("case", sorted(PLAIN))
def test_plain_chunks_take_the_fast_path(model_dir, restore_seams, monkeypatch, case):
    assert routed(model_dir, monkeypatch, PLAIN[case]) == "fast"


def test_flags_follow_the_slot(model_dir, restore_seams, monkeypatch):
    """A slot's flag is rewritten when the slot is reused, and the components' add_request are
    left as they were (recorded during vLLM's call only); without our sampler at the seam, vLLM's
    add_request runs alone."""
    from vllm import SamplingParams

    sampler = vllm_sampler(monkeypatch, engine_config(model_dir, None), 4)
    install(V2_MODULE, None)
    sampler.add_request(1, SamplingParams(temperature=0.5))
    assert getattr(sampler, fast_path.NEEDS_MORE_ATTRIBUTE, None) is None  # not installed: no flags
    install(V2_MODULE, REJECTION)
    sampler.add_request(1, SamplingParams(temperature=0.5, presence_penalty=1.0))
    flags = getattr(sampler, fast_path.NEEDS_MORE_ATTRIBUTE)
    assert flags.tolist() == [True, True, True, True]
    assert bool(sampler.needs_logits_processing[1])
    sampler.add_request(1, SamplingParams(temperature=0.5))
    assert flags.tolist() == [True, False, True, True]
    assert bool(sampler.needs_logits_processing[1])  # vLLM's own flag counts the temperature
    assert all("add_request" not in vars(p) for p in sampler.logits_processors)
    assert "add_request" not in vars(sampler.thinking_budget_state)
    assert np.array_equal(sampler.needs_logits_processing, [False, True, False, False])
    install(V2_MODULE, None)  # the slot reused while our sampler is away: needs more (unknown)
    sampler.add_request(1, SamplingParams(temperature=0.5, presence_penalty=1.0))
    assert flags.tolist() == [True, True, True, True]
