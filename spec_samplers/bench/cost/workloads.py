"""The calls the cost model traces: one verification step from what the engine holds to tokens.

Each workload is built for a :class:`Shape` on a device: ``cpu`` inside :func:`shapes_only`
(full-shape tracing: shapes only, the device path a GPU takes), ``cpu`` (the interpreter's byte
counting at small shapes, with random values) or ``meta`` (shapes only). All of a
step's requests have k drafts and temperature :data:`TEMPERATURE`; draft ids are uniform over the
vocabulary, so nearly every request rejects its first draft and pays a recovery pass (the worst
case of docs/design.md section 6). On CPU each draft is its target row's least likely token, so
every request rejects its first draft (deterministic: the small-shape counts scale exactly).

* ``ours``: the sampler's ragged entry (``forward_ragged_from_logits`` for logits, ``forward_ragged``
  for probabilities) on [T, V] target rows, T = B*k, bonus ids given;
* ``ours-v1-seam``: vLLM's V1 ``RejectionSampler.forward`` with the plugin installed, from the
  model's [T + B, V] logits. The step is plain (temperature only, no logprobs), so it is the
  plugin's fast path (``v1_runner.verify_plain_step``): the logits verified in place, bonus rows
  included, the bonus drawn in our kernels; draft probabilities [T, V] fp32 as V1's drafters hand
  them over (p = softmax(logits / T) in fp32 and q laid out on the same rows: 2 tensors);
* ``vllm-v1``: vLLM's own V1 path from the same logits: its glue (``RejectionSampler.forward``:
  gather the target rows, fp32 copy, clone, temperature via ``apply_sampling_constraints``) then
  its ``rejection_sample`` (its bonus draw by its Sampler over [B, V] is not counted: vLLM's side
  is modeled short of it, ours includes it);
* ``ours-v2-seam``: Model Runner V2's ``RejectionSampler._verify`` with the plugin installed, from
  its [B(k+1), V] logits. The chunk is plain (temperature only, no logprobs), so it is the
  plugin's fast path (``v2_runner.verify_plain_chunk``): vLLM's glue is skipped and the raw logits
  are verified in place, bonus rows included, each request at its own temperature in our kernels;
  the drafter's cached logits [B, k, V] read in place too;
* ``vllm-mrv2``: Model Runner V2 from the same logits: its glue (``apply_sampling_params``: fp32
  copy, ``apply_temperature``) then vLLM's ``rejection_sample`` (which draws the bonus token too),
  draft logits [B, k, V] as cached.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

TEMPERATURE = 0.7
WORKLOADS = ("ours", "ours-v1-seam", "ours-v2-seam", "vllm-v1", "vllm-mrv2", "flashinfer-chain")
#: the workloads that import vLLM
VLLM_WORKLOADS = ("ours-v1-seam", "ours-v2-seam", "vllm-v1", "vllm-mrv2", "vllm-recovered-after")
#: the workloads that may launch a peer's Triton kernel (vLLM's: traced at Triton's launch path,
#: ``trace.recording``; ours are planned through their launchers' ``config=``)
PEER_WORKLOADS = (*VLLM_WORKLOADS, "vllm-recovered-before")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class Shape:
    batch_size: int
    k: int
    vocab_size: int
    dtype: str = "bfloat16"  # of the logits the engine holds
    sampler: str = "rejection_sampler"
    entry: str = "logits"  # "logits" or "probs" (ours only)
    drafts: str = "probs"  # "probs" (probabilistic drafts) or "point" (point-mass drafts)

    def at(self, batch_size: int, vocab_size: int) -> Shape:
        return Shape(batch_size, self.k, vocab_size, self.dtype, self.sampler, self.entry, self.drafts)


_SHAPES_ONLY: list[bool] = [False]


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Workloads built inside the block leave their floating-point inputs uninitialised and their
    token ids 0 (valid indices), on any device: a full-shape trace on CPU tensors (the device path
    a GPU takes, ``worker.compiled``; ``benchmarks/host_overhead.py``) reads shapes, not values."""
    _SHAPES_ONLY.append(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.pop()


class Inputs:
    """Tensors on ``device``: random values drawn on the CPU (seeded) and moved there; shapes
    only on meta and inside :func:`shapes_only`."""

    def __init__(self, device: torch.device, seed: int = 0):
        self.device = device
        values = device.type != "meta" and not _SHAPES_ONLY[-1]
        self.gen = torch.Generator().manual_seed(seed) if values else None

    def normal(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.gen is None:
            return torch.empty(shape, dtype=dtype, device=self.device)
        return torch.randn(shape, generator=self.gen).to(self.device, dtype)

    def probs(self, *shape: int) -> torch.Tensor:
        if self.gen is None:
            return torch.empty(shape, device=self.device)
        return torch.randn(shape, generator=self.gen).softmax(-1).to(self.device)

    def ids(self, n: int, vocab: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        if self.gen is None:
            return torch.zeros(n, dtype=dtype, device=self.device)
        return torch.randint(0, vocab, (n,), generator=self.gen, dtype=dtype).to(self.device)

    def rejected(self, target: torch.Tensor, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """[rows] the least likely token of each target row: a draft the verifier rejects."""
        if self.gen is None:
            return torch.zeros(target.shape[0], dtype=dtype, device=self.device)
        return target.float().argmin(-1).to(dtype)

    def arange(self, n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.arange(n, dtype=dtype, device=self.device)

    def full(self, n: int, value: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.full((n,), value, dtype=dtype, device=self.device)


def prepare_vllm() -> None:
    """Let vLLM import its real Triton kernels on a machine without a GPU.

    vLLM swaps Triton for a placeholder when no Triton driver is active (no GPU here), and its
    kernels would then be plain functions; the CUDA driver is declared active for its import.
    Run before anything imports vLLM (the workers run it first)."""
    import os

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from triton.backends import backends

    driver = backends["nvidia"].driver
    driver.is_active = staticmethod(lambda: True)


def _sampler(shape: Shape) -> Any:
    from spec_samplers.registry import get_sampler

    return get_sampler(shape.sampler, backend="triton")


def ours(shape: Shape, device: torch.device) -> Callable[[], Any]:
    B, k, V = shape.batch_size, shape.k, shape.vocab_size
    x, T = Inputs(device), shape.batch_size * shape.k
    sampler = _sampler(shape)
    cu = x.arange(B) * k + k
    bonus, seeds = x.ids(B, V), x.ids(B, 2**62)
    with_draft = shape.drafts == "probs"
    if shape.entry == "logits":
        dtype = DTYPES[shape.dtype]
        target, draft = x.normal(T, V, dtype=dtype), x.normal(T, V, dtype=dtype) if with_draft else None
        ids, temp = x.rejected(target), x.full(B, TEMPERATURE)
        entry = sampler.forward_ragged_from_logits
        extra = _randomness(entry, seeds)
        return lambda: entry(target, bonus, draft, ids, cu, k, temperature=temp, **extra)
    target, draft = x.probs(T, V), x.probs(T, V) if with_draft else None
    ids = x.rejected(target)
    entry = sampler.forward_ragged
    extra = _randomness(entry, seeds)
    return lambda: entry(target, bonus, draft, ids, cu, k, **extra)


def _randomness(entry: Callable[..., Any], seeds: torch.Tensor) -> dict[str, torch.Tensor]:
    """``seeds=`` for an entry that takes it (a deterministic sampler's does not)."""
    return {"seeds": seeds} if "seeds" in inspect.signature(entry).parameters else {}


def v1_inputs(shape: Shape, x: Inputs) -> SimpleNamespace:
    """What V1's ``RejectionSampler.forward`` holds for one step (metadata as a namespace)."""
    B, k, V = shape.batch_size, shape.k, shape.vocab_size
    T = B * k
    rows = x.arange(T + B).view(B, k + 1)
    metadata = SimpleNamespace(  # a plain step: temperature only (v1_runner.plain_step)
        all_greedy=False,
        all_random=True,
        temperature=x.full(B, TEMPERATURE),
        top_k=None,
        top_p=None,
        generators={},
        max_num_logprobs=None,
        no_penalties=True,
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=SimpleNamespace(argmax_invariant=[], non_argmax_invariant=[]),
    )
    logits = x.normal(T + B, V, dtype=DTYPES[shape.dtype])  # what the model returns: [T + B, V]
    target_index = rows[:, :k].reshape(-1)
    ids = x.rejected(logits[target_index], torch.int32)
    cu = (x.arange(B, torch.int32) + 1) * k
    spec = SimpleNamespace(  # SpecDecodeMetadata: request r's k draft rows, then its bonus row
        draft_token_ids=ids,
        num_draft_tokens=[k] * B,
        cu_num_draft_tokens=cu,
        cu_num_sampled_tokens=(x.arange(B, torch.int32) + 1) * (k + 1),
        target_logits_indices=target_index,
        bonus_logits_indices=rows[:, k],
        max_spec_len=k,
    )
    return SimpleNamespace(
        logits=logits,
        target_index=target_index,
        draft_probs=x.probs(T, V) if shape.drafts == "probs" else None,
        ids=ids,
        num_draft=[k] * B,
        cu=cu,
        bonus=x.ids(B, V, torch.int32).view(B, 1),
        metadata=metadata,
        spec=spec,
    )


def _v1_glue(a: SimpleNamespace) -> torch.Tensor:
    """``RejectionSampler.forward`` up to ``rejection_sample`` (raw-logprobs mode: the clone)."""
    from vllm.v1.sample.rejection_sampler import apply_sampling_constraints

    target = a.logits[a.target_index].to(torch.float32).clone()
    return apply_sampling_constraints(target, a.cu, a.metadata)


def vllm_v1(shape: Shape, device: torch.device) -> Callable[[], Any]:
    from vllm.v1.sample.rejection_sampler import rejection_sample

    a = v1_inputs(shape, Inputs(device))
    return lambda: rejection_sample(a.ids, a.num_draft, shape.k, a.cu, a.draft_probs, _v1_glue(a), a.bonus, a.metadata)


def ours_v1_seam(shape: Shape, device: torch.device) -> Callable[[], Any]:
    """V1's ``RejectionSampler.forward`` as the plugin wraps it, on a plain step: its fast path."""
    from spec_samplers.integrations.vllm import v1_runner
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier

    a = v1_inputs(shape, Inputs(device))
    verifier = RaggedVerifier(_sampler(shape))
    vllm_sampler = SimpleNamespace(synthetic_mode=False, fly_window_size=None)
    if not v1_runner.plain_step(vllm_sampler, verifier, a.spec, a.draft_probs, a.logits, a.metadata):
        # a sampler without the in-place bonus row (typical acceptance): vLLM's glue, then our seam
        return lambda: v1_runner.verify(
            verifier, a.ids, a.num_draft, shape.k, a.cu, a.draft_probs, _v1_glue(a), a.bonus, a.metadata
        )
    return lambda: v1_runner.verify_plain_step(verifier, a.spec, a.draft_probs, a.logits, a.metadata)


def v2_arguments(shape: Shape, x: Inputs, logits: torch.Tensor) -> dict[str, Any]:
    """Model Runner V2's ``rejection_sample`` arguments after ``target_logits``, laid out as its
    input kernels lay them out (one request per state slot, every request with k drafts)."""
    B, k, V = shape.batch_size, shape.k, shape.vocab_size
    L = B * (k + 1)
    i32 = torch.int32
    return dict(
        draft_logits=x.normal(B, k, V, dtype=DTYPES[shape.dtype]) if shape.drafts == "probs" else None,
        # the draft scored by row i is draft_sampled[i + 1]
        draft_sampled=x.rejected(logits.roll(1, 0)),
        cu_num_logits=x.arange(B + 1, i32) * (k + 1),
        pos=x.arange(L) + 100,
        idx_mapping=x.arange(B, i32),
        expanded_idx_mapping=x.arange(L, i32) // (k + 1),
        expanded_local_pos=x.arange(L, i32) % (k + 1),
        temperature=x.full(B, TEMPERATURE),
        seed=x.ids(B, 2**62),
        num_speculative_steps=k,
    )


def _v2_glue(logits: torch.Tensor, a: dict[str, Any], vllm_modules: dict[str, Any] | None = None) -> torch.Tensor:
    """``Sampler.apply_sampling_params`` for temperature-only requests: fp32 copy, temperature."""
    apply_temperature = _vllm_module("vllm.v1.worker.gpu.sample.gumbel", vllm_modules).apply_temperature
    processed = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
    apply_temperature(processed, a["expanded_idx_mapping"], a["temperature"])
    return processed


def _vllm_module(name: str, given: dict[str, Any] | None) -> Any:
    """vLLM's module ``name``: from ``given`` (``bench.vllm_source.load``: vLLM's files imported
    without vLLM) when it holds it, else the installed vLLM's."""
    import importlib

    return given[name] if given and name in given else importlib.import_module(name)


def vllm_mrv2(shape: Shape, device: torch.device, vllm_modules: dict[str, Any] | None = None) -> Callable[[], Any]:
    """``vllm_modules``: see :func:`_vllm_module` (the GPU check's ``--vllm-src``)."""
    utils = _vllm_module("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils", vllm_modules)
    x = Inputs(device)
    logits = x.normal(shape.batch_size * (shape.k + 1), shape.vocab_size, dtype=DTYPES[shape.dtype])
    a = v2_arguments(shape, x, logits)
    return lambda: utils.rejection_sample(_v2_glue(logits, a, vllm_modules), **a)


def v2_rejection_sampler(a: dict[str, Any]) -> Any:
    """Model Runner V2's RejectionSampler and Sampler as ``_verify`` reads them for the step of
    :func:`v2_arguments` (vLLM's classes, their attributes set directly: no engine to build them):
    the standard method, raw logprobs, every request temperature-only (the plugin's per-request
    flags down)."""
    import numpy as np
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    from spec_samplers.integrations.vllm import v2_runner

    sampler: Any = object.__new__(Sampler)
    num_slots = a["temperature"].shape[0]
    sampler.sampling_states = SimpleNamespace(
        temperature=SimpleNamespace(gpu=a["temperature"]),
        seeds=SimpleNamespace(gpu=a["seed"]),
        max_num_logprobs=lambda idx_mapping_np: -1,
    )
    sampler.logprobs_mode, sampler.return_sampling_mask = "raw_logprobs", False
    setattr(sampler, v2_runner.NEEDS_MORE_ATTRIBUTE, np.zeros(num_slots, dtype=bool))
    rs: Any = object.__new__(RejectionSampler)
    rs.sampler, rs.num_speculative_steps, rs.watermark_key = sampler, a["num_speculative_steps"], None
    rs.synthetic_conditional_rates, rs.use_block_verification, rs.fly_window_size = None, False, 0
    return rs


def ours_v2_seam(shape: Shape, device: torch.device) -> Callable[[], Any]:
    """MRv2's ``RejectionSampler._verify`` as the plugin wraps it, on a plain chunk: its fast path."""
    import numpy as np

    from spec_samplers.integrations.vllm import v2_runner
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier

    x = Inputs(device)
    logits = x.normal(shape.batch_size * (shape.k + 1), shape.vocab_size, dtype=DTYPES[shape.dtype])
    a = v2_arguments(shape, x, logits)
    verifier = RaggedVerifier(_sampler(shape))
    rs = v2_rejection_sampler(a)
    if not v2_runner.plain_chunk(rs, verifier, logits, np.arange(shape.batch_size)):
        # a sampler without the in-place bonus row (typical acceptance): vLLM's glue, then our seam
        return lambda: v2_runner.verify(verifier, _v2_glue(logits, a), **a)
    chunk = {name: a[name] for name in v2_runner.CHUNK_ARGUMENTS}  # _verify's, after the logits
    return lambda: v2_runner.verify_plain_chunk(rs, verifier, logits, **chunk)


def ours_v2_plain_chunk(shape: Shape, device: torch.device) -> Callable[[], Any]:
    """What ``ours-v2-seam`` runs on a plain chunk (``v2_runner.verify_plain_chunk``), called
    directly, without vLLM's classes: the GPU check's seam where vLLM is not installed. The fast
    path reads the sampler's temperatures and seeds and the number of steps only; the plain-chunk
    decision before it (host flags, no GPU work) is left out."""
    from spec_samplers.integrations.vllm import v2_runner
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier

    x = Inputs(device)
    logits = x.normal(shape.batch_size * (shape.k + 1), shape.vocab_size, dtype=DTYPES[shape.dtype])
    a = v2_arguments(shape, x, logits)
    states = SimpleNamespace(temperature=SimpleNamespace(gpu=a["temperature"]), seeds=SimpleNamespace(gpu=a["seed"]))
    rs = SimpleNamespace(sampler=SimpleNamespace(sampling_states=states), num_speculative_steps=shape.k)
    verifier = RaggedVerifier(_sampler(shape))
    chunk = {name: a[name] for name in v2_runner.CHUNK_ARGUMENTS}
    return lambda: v2_runner.verify_plain_chunk(rs, verifier, logits, **chunk)


#: the file of an older vLLM's ``vllm/v1/sample/rejection_sampler.py`` (unpacked from its wheel at
#: run time, never committed) whose recovered-token kernel ``vllm-recovered-before`` profiles
OLD_VLLM_ENV = "SPEC_SAMPLERS_OLD_VLLM_REJECTION_SAMPLER"


def _old_vllm_kernel(name: str) -> Any:
    """The Triton kernel ``name`` of the file :data:`OLD_VLLM_ENV` names, compiled from that
    file's source alone (the function, with ``triton`` and ``tl`` in scope: no vLLM import)."""
    import ast
    import os

    import triton
    import triton.language as tl

    path = os.environ.get(OLD_VLLM_ENV)
    if not path:
        raise RuntimeError(f"vllm-recovered-before: set {OLD_VLLM_ENV} to an older vLLM's rejection_sampler.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        raise RuntimeError(f"vllm-recovered-before: no function {name} in {path}")
    scope: dict[str, Any] = {"triton": triton, "tl": tl}
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), scope)
    return scope[name]


def vllm_recovered(shape: Shape, device: torch.device, before: bool) -> Callable[[], Any]:
    """vLLM V1's ``sample_recovered_tokens`` (its recovery kernel and the exponentials it reads),
    fp32 probabilities [B*k, V]: vLLM 0.33's (after vLLM PR #34974: the vocabulary in blocks of
    8192), or with ``before`` the kernel of the file :data:`OLD_VLLM_ENV` names (before that PR:
    one block of the whole padded vocabulary per program) driven as that release drove it
    (exponentials drawn in place, kernel over (B, k)). The calibration's points
    (benchmarks/cost_calibration.py)."""
    B, k, V = shape.batch_size, shape.k, shape.vocab_size
    x = Inputs(device)
    target, draft = x.probs(B * k, V), x.probs(B * k, V)
    ids = x.ids(B * k, V, torch.int32)
    cu = (x.arange(B, torch.int32) + 1) * k
    if not before:
        from vllm.v1.sample.rejection_sampler import sample_recovered_tokens

        metadata: Any = SimpleNamespace(generators={})  # the one field it reads
        return lambda: sample_recovered_tokens(k, [k] * B, cu, ids, draft, target, metadata, device)
    import triton

    kernel = _old_vllm_kernel("sample_recovered_tokens_kernel")

    def call() -> torch.Tensor:
        q = torch.empty(B, V, dtype=torch.float32, device=device)
        q.exponential_()
        out = torch.empty_like(ids)
        kernel[(B, k)](out, cu, ids, draft, target, q, V, triton.next_power_of_2(V), NO_DRAFT_PROBS=False)
        return out

    return call


BUILDERS: dict[str, Callable[[Shape, torch.device], Callable[[], Any]]] = {
    "vllm-recovered-after": lambda shape, device: vllm_recovered(shape, device, before=False),
    "vllm-recovered-before": lambda shape, device: vllm_recovered(shape, device, before=True),
    "ours": ours,
    "ours-v1-seam": ours_v1_seam,
    "ours-v2-seam": ours_v2_seam,
    "vllm-v1": vllm_v1,
    "vllm-mrv2": vllm_mrv2,
}


def build(workload: str, shape: Shape, device: torch.device) -> Callable[[], Any]:
    """The call of ``workload`` at ``shape`` with inputs on ``device`` (built outside the call,
    so tracing the call sees only the step itself)."""
    if workload not in BUILDERS:
        raise ValueError(f"workload: expected one of {', '.join(BUILDERS)}, got {workload!r}")
    return BUILDERS[workload](shape, device)
