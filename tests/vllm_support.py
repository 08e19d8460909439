"""Shared helpers of the vLLM plugin tests (test_vllm_*.py): inputs built as vLLM builds them.

vLLM cannot run a model without a GPU, so the tests call the replaced seams directly, with inputs
made by vLLM's own helpers where they run on CPU (SpecDecodeMetadata.make_dummy, SamplingMetadata,
EngineArgs/VllmConfig) and, for Model Runner V2 whose input helpers are Triton kernels, with
tensors laid out exactly as those kernels lay them out; Model Runner V2's own
``RejectionSampler._verify_in_chunks`` runs around the seam with a stand-in for its Sampler.

The tests run against vLLM 0.33.x (what CI installs) and 0.32.x (.ci/check_vllm_032); calls
pass exactly the keywords the installed version's callers pass (``VLLM_033``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# vLLM picks its platform once, at first use; without a GPU and without this it finds none and
# cannot build a VllmConfig. Must run before anything imports vllm.platforms.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

# No import of vLLM here: these modules are collected in the light environment too (no vLLM),
# where the quick tier deselects them (tests/conftest.py); the full tier needs the vllm extra
# (tools/install_test_env.sh) and fails without it, it does not skip.
import spec_samplers.integrations.vllm as plugin  # noqa: E402


def _vllm_minor() -> tuple[int, int]:
    """The installed vLLM's (major, minor); (0, 0) without vLLM (its tests then fail on import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = version("vllm").split(".")[:2]
    except PackageNotFoundError:
        return 0, 0
    return int(major), int(minor)


#: the installed vLLM is 0.33.x (FLy keywords in both runners' calls, V1 RejectionSampler(sampler, spec_config, device))
VLLM_033 = _vllm_minor() >= (0, 33)

V1_MODULE = "vllm.v1.sample.rejection_sampler"
V2_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


def make_model_dir(root: Path) -> str:
    """A local model directory holding only a config.json: enough for vLLM's config, nothing downloaded."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(root)


def ngram_spec(k: int = 3) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def engine_config(model_dir: str, additional_config: dict | None, **spec_overrides):
    """A real VllmConfig, built by vLLM's EngineArgs as `LLM(...)` builds it (n-gram drafting)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        max_model_len=128,
        speculative_config={**ngram_spec(), **spec_overrides},
        additional_config=additional_config or {},
    )
    return args.create_engine_config()


def seam_module(name: str):
    import importlib

    return importlib.import_module(name)


def install(module_name: str, section: dict | None):
    """Configure one seam as the engine would for ``additional_config={"spec_samplers": section}``."""
    from types import SimpleNamespace

    additional = {} if section is None else {"spec_samplers": section}
    module = seam_module(module_name)
    plugin.configure_seam(module, SimpleNamespace(additional_config=additional, speculative_config=None))
    return module


@pytest.fixture
def restore_seams():
    """Put vLLM's own functions back after the test."""
    plugin.register()
    yield
    for module_name in (V1_MODULE, V2_MODULE):
        install(module_name, None)


def is_vllm_function(fn) -> bool:
    return getattr(fn, "__module__", "").startswith("vllm.") and not hasattr(fn, "__spec_samplers_sampler__")


# --- V1 runner inputs -------------------------------------------------------------------------


def sampling_metadata(temperature: list[float], generators: dict | None = None, top_k=None, top_p=None):
    """vLLM's SamplingMetadata as the V1 input batch makes it (no penalties, no logprobs)."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    B = len(temperature)
    temp = torch.tensor(temperature, dtype=torch.float32)
    all_greedy = all(t == 0 for t in temperature)
    all_random = all(t != 0 for t in temperature)
    return SamplingMetadata(
        temperature=None if all_greedy else temp,
        all_greedy=all_greedy,
        all_random=all_random,
        top_p=top_p,
        top_k=top_k,
        generators=generators or {},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(B),
        presence_penalties=torch.zeros(B),
        repetition_penalties=torch.ones(B),
        output_token_ids=[[] for _ in range(B)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def spec_metadata(draft_token_ids: list[list[int]]):
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    return SpecDecodeMetadata.make_dummy(draft_token_ids, torch.device("cpu"))


def call_v1(module, metadata, draft_probs, target_logits, bonus_token_ids, sampling_md):
    """The seam called exactly as vLLM's RejectionSampler.forward calls it (without synthetic mode
    and FLy, which the plugin's config refuses)."""
    fly = dict(fly_window_size=None, fly_entropy_threshold=None, fly_entropy_top_k=3) if VLLM_033 else {}
    return module.rejection_sample(
        metadata.draft_token_ids,
        metadata.num_draft_tokens,
        metadata.max_spec_len,
        metadata.cu_num_draft_tokens,
        draft_probs,
        target_logits,
        bonus_token_ids,
        sampling_md,
        synthetic_mode=False,
        synthetic_conditional_rates=None,
        use_fp64_gumbel=False,
        **fly,
    )


def vllm_greedy_v1(draft_token_ids: list[list[int]], target_logits: torch.Tensor, bonus: list[int]) -> torch.Tensor:
    """vLLM's rejection_greedy_sample_kernel, one request at a time: [B, K+1] int32."""
    K = max(len(d) for d in draft_token_ids)
    out = torch.full((len(draft_token_ids), K + 1), -1, dtype=torch.int32)
    argmax = target_logits.argmax(dim=-1).tolist()
    t = 0
    for b, drafts in enumerate(draft_token_ids):
        rejected = False
        for i, x in enumerate(drafts):
            if not rejected:
                out[b, i] = argmax[t + i]
                rejected = x != argmax[t + i]
        if not rejected:
            out[b, len(drafts)] = bonus[b]
        t += len(drafts)
    return out


def check_layout(out: torch.Tensor, draft_token_ids: list[list[int]], vocab_size: int) -> list[list[int]]:
    """Checks vLLM's output layout row by row and returns each row's emitted tokens."""
    K = max(len(d) for d in draft_token_ids)
    assert out.shape == (len(draft_token_ids), K + 1)
    rows = []
    for b, drafts in enumerate(draft_token_ids):
        row = out[b].tolist()
        n = sum(1 for x in row if x != -1)
        assert 1 <= n <= len(drafts) + 1, (b, row)
        assert all(x == -1 for x in row[n:]), (b, row)  # placeholders only after the emitted tokens
        assert row[: n - 1] == drafts[: n - 1], (b, row, drafts)  # accepted tokens are the drafts
        assert all(0 <= x < vocab_size for x in row[:n]), (b, row)
        rows.append(row[:n])
    return rows


# --- Model Runner V2 inputs -------------------------------------------------------------------


def v2_inputs(requests: list[dict], vocab_size: int, num_speculative_steps: int, max_num_reqs: int | None = None):
    """Model Runner V2's verification inputs for ``requests``, each a dict with ``state`` (request
    state index), ``pos`` (position of its first logits row), ``drafts`` (list of ids),
    ``temperature``, ``seed``. Laid out as vLLM's InputBatch and ``expand_idx_mapping`` /
    ``gather_draft_sampled`` kernels lay them out: request r owns logits rows [cu[r], cu[r+1]),
    row cu[r]+i scores the draft at input row cu[r]+i+1, the last row is the bonus position."""
    max_num_reqs = max_num_reqs or (max(r["state"] for r in requests) + 1)
    cu = np.zeros(len(requests) + 1, dtype=np.int32)
    cu[1:] = np.cumsum([len(r["drafts"]) + 1 for r in requests])
    draft_sampled, pos, expanded_idx, expanded_pos = [], [], [], []
    temperature = torch.ones(max_num_reqs, dtype=torch.float32)
    seed = torch.zeros(max_num_reqs, dtype=torch.int64)
    for r in requests:
        n = len(r["drafts"])
        draft_sampled += [0] + list(r["drafts"])  # row 0: the token sampled last step
        pos += [r["pos"] + i for i in range(n + 1)]
        expanded_idx += [r["state"]] * (n + 1)
        expanded_pos += list(range(n + 1))
        temperature[r["state"]] = r.get("temperature", 1.0)
        seed[r["state"]] = r.get("seed", 0)
    return dict(
        draft_sampled=torch.tensor(draft_sampled, dtype=torch.int32),
        cu_num_logits=torch.from_numpy(cu),
        pos=torch.tensor(pos, dtype=torch.int64),
        idx_mapping=torch.tensor([r["state"] for r in requests], dtype=torch.int32),
        expanded_idx_mapping=torch.tensor(expanded_idx, dtype=torch.int32),
        expanded_local_pos=torch.tensor(expanded_pos, dtype=torch.int32),
        temperature=temperature,
        seed=seed,
        num_speculative_steps=num_speculative_steps,
    )


#: the inputs Model Runner V2 passes to rejection_sample positionally, after the two logits tensors
V2_POSITIONAL = (
    "draft_sampled",
    "cu_num_logits",
    "pos",
    "idx_mapping",
    "expanded_idx_mapping",
    "expanded_local_pos",
    "temperature",
    "seed",
)


def v2_args(inputs: dict) -> list:
    """:data:`V2_POSITIONAL` of ``inputs``, in order."""
    return [inputs[name] for name in V2_POSITIONAL]


def call_v2(module, target_logits, draft_logits, inputs: dict):
    """The seam called exactly as Model Runner V2's RejectionSampler._verify calls it (standard
    method, no watermark)."""
    fly = dict(fly_window_size=0, fly_entropy_threshold=0.3, fly_entropy_top_k=3) if VLLM_033 else {}
    return module.rejection_sample(
        target_logits,
        draft_logits,
        *v2_args(inputs),
        inputs["num_speculative_steps"],
        None,
        use_fp64=False,
        use_block_verification=False,
        **fly,
    )


# --- Model Runner V2's RejectionSampler around the seam ---------------------------------------


class V2SamplerStandIn:
    """What Model Runner V2's RejectionSampler reads from its Sampler on the verification path.
    vLLM's real Sampler applies penalties, temperature, top-k/top-p with Triton kernels (GPU);
    here the logits arrive already processed, so ``apply_sampling_params`` returns them."""

    logprobs_mode = "raw_logprobs"
    return_sampling_mask = False
    use_fp64_gumbel = False
    compute_nans = False

    def __init__(self, temperature: torch.Tensor, seed: torch.Tensor):
        from types import SimpleNamespace

        self.sampling_states = SimpleNamespace(
            temperature=SimpleNamespace(gpu=temperature),
            seeds=SimpleNamespace(gpu=seed),
        )
        self.calls = 0

    def apply_sampling_params(self, logits, *args, **kwargs):
        self.calls += 1
        return logits


def v2_input_batch(inputs: dict):
    """The InputBatch fields RejectionSampler._verify_in_chunks reads, from v2_inputs(...)."""
    from types import SimpleNamespace

    cu = inputs["cu_num_logits"]
    num_reqs = cu.shape[0] - 1
    return SimpleNamespace(
        num_reqs=num_reqs,
        cu_num_logits=cu,
        cu_num_logits_np=cu.numpy(),
        idx_mapping=inputs["idx_mapping"],
        idx_mapping_np=inputs["idx_mapping"].numpy(),
        expanded_idx_mapping=inputs["expanded_idx_mapping"],
        expanded_local_pos=inputs["expanded_local_pos"],
        seq_lens_cpu_upper_bound=torch.zeros(num_reqs, dtype=torch.int32),
    )


def v2_rejection_sampler(vllm_config, inputs: dict):
    """Model Runner V2's RejectionSampler built as its model runner builds it, inside
    set_current_vllm_config (so the plugin's observer configures the seam from ``vllm_config``)."""
    from vllm.config import set_current_vllm_config

    module = seam_module(V2_MODULE)
    with set_current_vllm_config(vllm_config):
        return module.RejectionSampler(
            V2SamplerStandIn(inputs["temperature"], inputs["seed"]), vllm_config.speculative_config, torch.device("cpu")
        )


def verify_in_chunks(rejection_sampler, target_logits, draft_logits, inputs: dict, max_chunk_logits: int):
    """RejectionSampler._verify_in_chunks as RejectionSampler.__call__ calls it (no logprobs).
    Returns (sampled [R, S+1], num_sampled [R])."""
    from vllm.v1.worker.gpu.sample.states import NO_LOGPROBS

    sampled, num_sampled, logprobs, _ = rejection_sampler._verify_in_chunks(
        target_logits,
        v2_input_batch(inputs),
        draft_logits,
        inputs["draft_sampled"],
        inputs["pos"],
        max_chunk_logits,
        NO_LOGPROBS,
    )
    assert logprobs is None
    return sampled, num_sampled


# --- whole-block losslessness (block verification) --------------------------------------------


def completed_block_pvalue(out: torch.Tensor, q: torch.Tensor, gen: torch.Generator) -> float:
    """Chi-square p-value of the completed blocks against the product of the targets.

    out: [N, k+1] emitted tokens, -1 padded; q: [k+1, V] per-position targets that do not depend
    on the prefix. Slots after the emitted tokens are filled with fresh target samples, so a
    lossless verifier's completed rows have the law q_0 x ... x q_k over all V^(k+1) cells."""
    from stats_helpers import chi2_pvalue

    N, kp1 = out.shape
    V = q.shape[1]
    seq = out.to(torch.int64).clone()
    for i in range(kp1):
        missing = seq[:, i] == -1
        if bool(missing.any()):
            seq[missing, i] = torch.multinomial(q[i], int(missing.sum()), replacement=True, generator=gen)
    cells = (seq * (V ** torch.arange(kp1 - 1, -1, -1))).sum(dim=1)
    joint = q[0]
    for i in range(1, kp1):
        joint = (joint[:, None] * q[i][None, :]).reshape(-1)
    return chi2_pvalue(cells, joint)
