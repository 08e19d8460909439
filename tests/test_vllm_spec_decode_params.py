"""min_p and logit_bias with speculative decoding (issue 21 item 2), in both of vLLM's runners.

vLLM 0.33 refuses both with speculative decoding on; with our section they are accepted and the
verification emits tokens whose law is vLLM's processed target. The requests carry vLLM's own
``SamplingParams``; the reference target is computed by vLLM's own CPU processors in its
Sampler's order (``Sampler.apply_logits_processors``: logit bias, then penalties; temperature;
``MinPLogitsProcessor``; ``apply_top_k_top_p``).

The V1 runner is vLLM's ``RejectionSampler.forward`` (built by vLLM under the engine config, so
the plugin installs its seam), with the logits processors built by the V1 model runner's
``build_logitsprocs`` and vLLM's ``Sampler`` drawing the bonus tokens; two GPU-only pieces have
CPU stand-ins: the Triton kernel ``expand_batch_to_tokens`` and the Sampler's final draw (needs
``vllm._C``). Model Runner V2 is vLLM's ``RejectionSampler._verify_in_chunks`` and vLLM's own
``Sampler.apply_sampling_params`` (the pipeline order), whose per-row Triton kernels (bias,
temperature, min-p, top-k/top-p, each indexed by ``expanded_idx_mapping``: every logits row,
draft rows included) have CPU stand-ins built from vLLM's V1 processors.

Statistics: each chi-square runs at CHI2_ALPHA = 1e-3 on the completed (token 0, token 1) pairs
of one request kind (slots after a rejection filled with fresh target samples, so a lossless
verifier's pairs have the law p0 x p1); a test checks four kinds, so its false-failure rate at a
random seed is at most 4e-3 (Bonferroni). Seeds are fixed, so each run is deterministic.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import vllm_support  # noqa: F401  (sets VLLM_TARGET_DEVICE before vLLM picks a platform)
from stats_helpers import CHI2_ALPHA
from vllm_support import (
    V1_MODULE,
    V2_MODULE,
    V2SamplerStandIn,
    completed_block_pvalue,
    engine_config,
    make_model_dir,
    restore_seams,  # noqa: F401  (fixture)
    sampling_metadata,
    seam_module,
    spec_metadata,
    v2_inputs,
    v2_rejection_sampler,
    verify_in_chunks,
)

from spec_samplers.integrations.vllm import min_p_logit_bias

SECTION = {"spec_samplers": {"acceptance_method": "rejection_sampler"}}
V = 12  # vocabulary of the statistical tests
GREEDY_TOKEN = 5  # the greedy requests' biased token: their argmax only with the bias
#: request kinds: vLLM SamplingParams keywords; greedy kinds' drafts are fixed (see scenario)
KINDS = {
    "min_p": dict(temperature=0.8, min_p=0.3),
    "bias": dict(temperature=1.0, logit_bias={3: 2.5, 7: -3.0, 9: 1.5}),
    "min_p+bias+top_p": dict(temperature=1.2, min_p=0.2, logit_bias={2: 2.0, 0: -2.0}, top_p=0.8),
    "plain": dict(temperature=1.0),
    "greedy+bias, draft rejected": dict(temperature=0.0, logit_bias={GREEDY_TOKEN: 4.0}),
    "greedy+bias, draft accepted": dict(temperature=0.0, logit_bias={GREEDY_TOKEN: 4.0}),
}
RANDOM_KINDS = [k for k, p in KINDS.items() if p["temperature"] > 0]
GREEDY_KINDS = [k for k, p in KINDS.items() if p["temperature"] == 0]
REPLICAS = 20  # requests of each kind per step (6 kinds: 120 <= the engine's max_num_seqs, 128)
STEPS = 100  # verification steps: REPLICAS * STEPS = 2000 pairs per kind


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("tiny-llama-params"))


def params_of(kind: str):
    from vllm.sampling_params import SamplingParams

    return SamplingParams(**KINDS[kind])


# --- vLLM's processed target (reference) ------------------------------------------------------


def builtin_logitsprocs(params: list):
    """vLLM's three built-in V1 processors with ``params[i]`` as the request at batch index i (the
    processors read only ``scheduler_config.max_num_seqs`` from the engine config: the batch size)."""
    from types import SimpleNamespace

    from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, LogitsProcessors

    sized = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=len(params)))
    procs = LogitsProcessors(c(sized, torch.device("cpu"), False) for c in BUILTIN_LOGITS_PROCESSORS)
    update_batch(procs, params)
    return procs


def update_batch(procs, params: list) -> None:
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    added = [(i, p, [1, 2, 3], []) for i, p in enumerate(params)]
    for proc in procs.all:
        proc.update_state(BatchUpdate(batch_size=len(params), removed=[], added=added, moved=[]))


def metadata_for(params: list, logitsprocs):
    """vLLM's SamplingMetadata for ``params`` (temperature, top-p, the given processors)."""
    temps = [p.temperature for p in params]
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
    md = sampling_metadata(temps, top_p=top_p if bool((top_p < 1).any()) else None)
    return dataclasses.replace(md, logitsprocs=logitsprocs)


def vllm_processed(params: list, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs [n, V] of the random rows' processed target, greedy argmax [n]) of raw logits [n, V],
    row i under ``params[i]``, by vLLM's V1 Sampler steps on CPU, in its order."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.sample.sampler import Sampler

    md = metadata_for(params, builtin_logitsprocs(params))
    logits = Sampler().apply_logits_processors(raw.clone().float(), md, False)  # bias, penalties, ...
    greedy = logits.argmax(-1)
    temps = torch.tensor([p.temperature for p in params])
    logits = Sampler.apply_temperature(logits, temps, all_random=False)
    for proc in md.logitsprocs.argmax_invariant:  # min-p
        logits = proc.apply(logits)
    logits = apply_top_k_top_p(logits, None, md.top_p)
    return logits.softmax(-1), greedy


def temperature_only(params: list, raw: torch.Tensor) -> torch.Tensor:
    temps = torch.tensor([max(p.temperature, 1e-5) for p in params])
    return (raw / temps[:, None]).softmax(-1)


# --- the scenario: one draft per request, two logits rows (draft position, bonus position) ---


@dataclasses.dataclass
class Scenario:
    kinds: list[str]  # [B] the kind of each request (REPLICAS of each)
    params: list  # [B] vLLM SamplingParams
    raw: dict[str, torch.Tensor]  # kind -> raw target logits [2, V]
    draft_logits: dict[str, torch.Tensor]  # kind -> the drafter's raw logits [V]
    target: dict[str, torch.Tensor]  # kind -> vLLM-processed target probs [2, V]
    greedy: dict[str, torch.Tensor]  # kind -> vLLM's greedy tokens [2] (bias applied)

    def draft(self, kind: str, probabilistic: bool, gen: torch.Generator) -> int:
        """What vLLM's drafters propose: a sample of softmax(draft logits / T) ("probabilistic")
        or the argmax ("greedy"); the greedy kinds propose the unbiased argmax (which the bias
        makes wrong) or the biased one (right)."""
        if kind == "greedy+bias, draft rejected":
            return int(self.raw[kind][0].argmax())
        if kind == "greedy+bias, draft accepted":
            return GREEDY_TOKEN
        if not probabilistic:
            return int(self.draft_logits[kind].argmax())
        return int(torch.multinomial(self.q(kind), 1, generator=gen))

    def q(self, kind: str) -> torch.Tensor:
        """[V]: vLLM's probabilistic drafting law, softmax(draft logits / T) (T = 1 for greedy requests)."""
        return (self.draft_logits[kind] / (KINDS[kind]["temperature"] or 1.0)).softmax(-1)


def scenario() -> Scenario:
    gen = torch.Generator().manual_seed(2026)
    raw, draft_logits = {}, {}
    for kind in KINDS:
        rows = torch.randn(2, V, generator=gen) * 1.5
        if kind in GREEDY_KINDS:  # GREEDY_TOKEN 1.0 below the top: the argmax only with the bias
            rows[:, GREEDY_TOKEN] = rows.max(dim=1).values - 1.0
        raw[kind] = rows
        draft_logits[kind] = rows[0] + torch.randn(V, generator=gen)  # a drafter close to the raw target
    kinds = [kind for kind in KINDS for _ in range(REPLICAS)]
    params = [params_of(kind) for kind in kinds]
    target, greedy = {}, {}
    for kind in KINDS:
        probs, argmax = vllm_processed([params_of(kind)] * 2, raw[kind])
        target[kind], greedy[kind] = probs, argmax
    return Scenario(kinds, params, raw, draft_logits, target, greedy)


def check_law(sc: Scenario, pairs: dict[str, torch.Tensor]) -> None:
    """Greedy kinds: vLLM's biased argmax, token for token; random kinds: chi-square of the
    completed pairs against vLLM's processed target, which differs from the temperature-only
    target by TV > 0.1 at both positions (so the test can tell them apart)."""
    gen = torch.Generator().manual_seed(7)
    for kind in GREEDY_KINDS:
        out = pairs[kind]
        biased = sc.greedy[kind]
        assert int(biased[0]) == GREEDY_TOKEN != int(sc.raw[kind][0].argmax())  # the bias decides
        assert bool((out[:, 0] == biased[0]).all()), kind
        accepted = kind.endswith("accepted")
        assert bool((out[:, 1] == (biased[1] if accepted else -1)).all()), kind
    for kind in RANDOM_KINDS:
        if kind != "plain":
            plain = temperature_only([params_of(kind)] * 2, sc.raw[kind])
            tv = 0.5 * (sc.target[kind] - plain).abs().sum(-1)
            assert bool((tv > 0.1).all()), (kind, tv)
        p = completed_block_pvalue(pairs[kind], sc.target[kind], gen)
        assert p > CHI2_ALPHA, (kind, p)


def collect(pairs: dict[str, list], kinds: list[str], out: torch.Tensor) -> None:
    for b, kind in enumerate(kinds):
        pairs[kind].append(out[b, :2].to(torch.int64))


# --- validation -------------------------------------------------------------------------------


def test_validation_lifts_exactly_the_two_refusals_with_our_section(model_dir, restore_seams):
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    served = [
        SamplingParams(min_p=0.1),
        SamplingParams(logit_bias={3: 1.0}),
        SamplingParams(temperature=0.0, logit_bias={3: 5.0}),
        SamplingParams(temperature=0.7, min_p=0.2, logit_bias={1: -2.0}, top_p=0.9),
    ]
    with_section = InputProcessor(engine_config(model_dir, SECTION))
    without = InputProcessor(engine_config(model_dir, None))
    for params in served:
        with_section._validate_params(params, ("generate",))
        with pytest.raises(VLLMValidationError, match="not yet supported with speculative decoding"):
            without._validate_params(params, ("generate",))
    assert served[3].min_p == pytest.approx(0.2) and served[3].logit_bias == {1: -2.0}  # not neutralised in place
    out_of_vocab = SamplingParams(logit_bias={1000: 1.0})  # the tiny model's vocabulary is 128
    for processor in (with_section, without):
        with pytest.raises(VLLMValidationError, match="out-of-vocab"):
            processor._validate_params(out_of_vocab, ("generate",))
    # outside an engine with our section (a bare verify call) vLLM's refusal stands
    config = engine_config(model_dir, SECTION)
    with pytest.raises(VLLMValidationError, match="not yet supported with speculative decoding"):
        served[0].verify(config.model_config, config.speculative_config, None, None)


def test_v1_logits_processors_built_only_with_our_section(model_dir, restore_seams):
    import vllm.v1.worker.gpu_model_runner as model_runner

    def names(section):
        built = model_runner.build_logitsprocs(engine_config(model_dir, section), torch.device("cpu"), False, False)
        return sorted(type(p).__name__ for p in built.all)

    assert names(SECTION) == ["LogitBiasLogitsProcessor", "MinPLogitsProcessor", "MinTokensLogitsProcessor"]
    assert names(None) == ["MinTokensLogitsProcessor"]  # vLLM's own choice with speculative decoding
    with pytest.raises(ValueError, match="Custom logits processors"):  # still refused
        model_runner.build_logitsprocs(
            engine_config(model_dir, SECTION), torch.device("cpu"), False, False, ("some.module:Processor",)
        )


def test_v1_draft_rows_get_vllms_bias_and_min_p_ragged(model_dir):
    """The draft-row additions against vLLM's processors applied to each row as its own request:
    ragged drafts (one request without drafts), greedy and random requests mixed."""
    from vllm.sampling_params import SamplingParams

    params = [
        SamplingParams(temperature=0.7, min_p=0.25, logit_bias={4: 3.0}),
        SamplingParams(temperature=0.0, logit_bias={1: -5.0, 2: 2.0}),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.3, logit_bias={0: 1.0}),
        SamplingParams(temperature=0.9, min_p=0.5),
    ]
    num_drafts = [3, 2, 0, 1, 4]
    cu = torch.tensor(np.cumsum(num_drafts), dtype=torch.int32)
    rows = [p for p, n in zip(params, num_drafts, strict=True) for _ in range(n)]
    raw = torch.randn(len(rows), 16, generator=torch.Generator().manual_seed(3)) * 2
    batch = builtin_logitsprocs(params)
    ours = min_p_logit_bias.add_logit_bias_to_draft_rows(raw.clone(), batch.non_argmax_invariant, cu, max(num_drafts))
    per_row = builtin_logitsprocs(rows)
    bias = next(p for p in per_row.non_argmax_invariant if type(p).__name__ == "LogitBiasLogitsProcessor")
    assert torch.equal(ours, bias.apply(raw.clone()))
    temps = torch.tensor([p.temperature for p in params])
    ours = min_p_logit_bias.apply_min_p_to_draft_rows(ours, batch.argmax_invariant, cu, temps)
    row_temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in rows])
    expected = per_row.argmax_invariant[0].apply(bias.apply(raw.clone()) / row_temps[:, None])  # min-p after T
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    assert int(torch.isinf(ours).sum()) > 5  # min-p masked something
    kept = ~torch.isinf(ours)
    torch.testing.assert_close(ours[kept] / row_temps[:, None].expand_as(ours)[kept], expected[kept])


# --- V1: vLLM's RejectionSampler.forward -------------------------------------------------------


def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    """CPU stand-in for vLLM's Triton kernel of the same name (same semantics)."""
    req = torch.searchsorted(cu_num_tokens.to(torch.int64), torch.arange(num_tokens), right=True)
    y = x[req]
    return torch.where(y == replace_from, torch.as_tensor(replace_to, dtype=y.dtype), y)


class FinalDraw(torch.nn.Module):
    """CPU stand-in for the last step of vLLM's TopKTopPSampler (its CPU path needs vllm._C):
    vLLM's apply_top_k_top_p, then one sample per row."""

    def __init__(self, gen: torch.Generator):
        super().__init__()
        self.gen = gen

    def forward(self, logits, generators, k, p):
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

        probs = apply_top_k_top_p(logits, k, p).softmax(-1)
        return torch.multinomial(probs, 1, generator=self.gen).reshape(-1), None


@pytest.mark.parametrize("probabilistic", [True, False], ids=["probabilistic-drafts", "greedy-drafts"])
def test_v1_forward_emits_vllms_processed_target(model_dir, restore_seams, monkeypatch, probabilistic):
    import vllm.v1.worker.gpu_model_runner as model_runner
    from vllm.config import set_current_vllm_config
    from vllm.v1.sample.sampler import Sampler

    config = engine_config(model_dir, SECTION)
    sc = scenario()
    module = seam_module(V1_MODULE)
    monkeypatch.setattr(module, "expand_batch_to_tokens", expand_batch_to_tokens)
    bonus_sampler = Sampler()
    bonus_sampler.greedy_sample = lambda logits: logits.argmax(dim=-1)  # vLLM's CPU path needs vllm._C
    bonus_sampler.topk_topp_sampler = FinalDraw(torch.Generator().manual_seed(11))
    with set_current_vllm_config(config):
        rejection_sampler = module.RejectionSampler(bonus_sampler, config.speculative_config, torch.device("cpu"))
    assert hasattr(module.rejection_sample, "__spec_samplers_sampler__")  # the observer installed ours
    logitsprocs = model_runner.build_logitsprocs(config, torch.device("cpu"), False, False)
    update_batch(logitsprocs, sc.params)
    md = metadata_for(sc.params, logitsprocs)
    B = len(sc.kinds)
    logits = torch.stack([sc.raw[kind] for kind in sc.kinds]).reshape(2 * B, V)  # rows: draft, bonus
    draft_probs = torch.stack([sc.q(kind) for kind in sc.kinds])  # [B, V]; greedy drafting passes None
    gen = torch.Generator().manual_seed(5)
    torch.manual_seed(6)  # our sampler draws from torch's default generator (no per-request seeds)
    pairs: dict[str, list] = {kind: [] for kind in KINDS}
    for _ in range(STEPS):
        drafts = [[sc.draft(kind, probabilistic, gen)] for kind in sc.kinds]
        spec = spec_metadata(drafts)
        spec.target_logits_indices = torch.arange(0, 2 * B, 2, dtype=torch.int32)
        spec.bonus_logits_indices = torch.arange(1, 2 * B, 2, dtype=torch.int32)
        out = rejection_sampler(spec, draft_probs if probabilistic else None, logits.clone(), md).sampled_token_ids
        collect(pairs, sc.kinds, out)
    check_law(sc, {kind: torch.stack(rows) for kind, rows in pairs.items()})


# --- Model Runner V2: vLLM's RejectionSampler._verify_in_chunks -------------------------------


class V2ProcessingStandIn(V2SamplerStandIn):
    """Model Runner V2's Sampler on the verification path: vLLM's own ``apply_sampling_params``
    (its pipeline and order) over CPU stand-ins for its Triton kernels, each applied to every row
    under the row's request (``expanded_idx_mapping``), built from vLLM's V1 CPU processors."""

    def __init__(self, params_by_state: dict, temperature, seed):
        from types import SimpleNamespace

        super().__init__(temperature, seed)
        self.params_by_state = params_by_state
        self.needs_logits_processing = np.ones(len(temperature), dtype=bool)
        self.logits_processors = [SimpleNamespace(apply=self._bias)]
        self.thinking_budget_state = SimpleNamespace(apply=lambda logits, ctx: None)
        states = self.sampling_states
        states.apply_temperature = self._temperature
        states.apply_min_p = self._min_p
        states.apply_top_k_top_p = self._top_k_top_p

    def apply_sampling_params(self, logits, *args, **kwargs):
        from vllm.v1.worker.gpu.sample.sampler import Sampler

        self.calls += 1
        return Sampler.apply_sampling_params(self, logits, *args, **kwargs)

    def _row_params(self, expanded_idx_mapping) -> list:
        return [self.params_by_state[int(s)] for s in expanded_idx_mapping]

    def _processor(self, expanded_idx_mapping, name: str):
        procs = builtin_logitsprocs(self._row_params(expanded_idx_mapping))
        return next(p for p in procs.all if type(p).__name__ == name)

    def _bias(self, logits, ctx):
        return self._processor(ctx.expanded_idx_mapping, "LogitBiasLogitsProcessor").apply(logits)

    def _temperature(self, logits, expanded_idx_mapping, idx_mapping_np):
        temps = torch.tensor([p.temperature for p in self._row_params(expanded_idx_mapping)])
        logits.div_(torch.where(temps > 0, temps, 1.0)[:, None])

    def _min_p(self, logits, expanded_idx_mapping, idx_mapping_np):
        self._processor(expanded_idx_mapping, "MinPLogitsProcessor").apply(logits)

    def _top_k_top_p(self, logits, expanded_idx_mapping, idx_mapping_np):
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

        top_p = torch.tensor([p.top_p for p in self._row_params(expanded_idx_mapping)], dtype=torch.float32)
        return apply_top_k_top_p(logits, None, top_p)


@pytest.mark.parametrize("probabilistic", [True, False], ids=["probabilistic-drafts", "greedy-drafts"])
def test_v2_verify_in_chunks_emits_vllms_processed_target(model_dir, restore_seams, probabilistic):
    config = engine_config(model_dir, SECTION)
    sc = scenario()
    B = len(sc.kinds)
    params_by_state = dict(enumerate(sc.params))
    draft_logits = torch.stack([sc.draft_logits[kind] for kind in sc.kinds])[:, None, :]  # [B, 1, V] pre-T
    logits = torch.stack([sc.raw[kind] for kind in sc.kinds]).reshape(2 * B, V)
    gen = torch.Generator().manual_seed(8)
    pairs: dict[str, list] = {kind: [] for kind in KINDS}
    rejection_sampler = None
    for step in range(STEPS):
        requests = [
            dict(
                state=b,
                pos=30,
                drafts=[sc.draft(kind, probabilistic, gen)],
                temperature=sc.params[b].temperature,
                seed=step * B + b + 1,  # vLLM's per-request seed: a new one per step gives fresh draws
            )
            for b, kind in enumerate(sc.kinds)
        ]
        inputs = v2_inputs(requests, V, 1, max_num_reqs=B)
        if rejection_sampler is None:
            rejection_sampler = v2_rejection_sampler(config, inputs)
            assert hasattr(seam_module(V2_MODULE).rejection_sample, "__spec_samplers_sampler__")
        rejection_sampler.sampler = V2ProcessingStandIn(params_by_state, inputs["temperature"], inputs["seed"])
        out, _ = verify_in_chunks(
            rejection_sampler, logits, draft_logits if probabilistic else None, inputs, max_chunk_logits=2 * B
        )
        collect(pairs, sc.kinds, out)
    check_law(sc, {kind: torch.stack(rows) for kind, rows in pairs.items()})


def test_registration_wraps_each_vllm_function_once(restore_seams, monkeypatch):
    """register() (also when vLLM loads plugins again) wraps each of WRAPS once, around vLLM's own."""
    import importlib

    import vllm.plugins

    from spec_samplers.integrations.vllm import plugin as plugin_impl

    for _ in range(2):
        monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
        vllm.plugins.load_general_plugins()
    for wrap in plugin_impl.WRAPS:
        module = importlib.import_module(wrap.module)
        owner = module if wrap.owner is None else getattr(module, wrap.owner)
        wrapper = getattr(owner, wrap.attribute)
        assert getattr(wrapper, "__spec_samplers_wraps__", False), wrap
        assert wrapper.__wrapped__.__module__.startswith("vllm."), wrap  # vLLM's own, wrapped once
