"""vLLM's sampling fields (``SamplingParams``) and the logits processing they ask for.

``process_logits`` turns logits into the distribution a request samples from, in vLLM's order:
temperature, min-p, top-k, top-p, each step renormalising what it keeps. Verification is lossless
for that processed target when the drafts were sampled from the draft's logits processed with the
same parameters (what :class:`spec_samplers.decoding.SpeculativeDecoder` does).

Example::

    >>> import torch
    >>> from spec_samplers import SamplingParams
    >>> from spec_samplers.sampling_params import process_logits
    >>> logits = torch.randn(3, 10)                                    # [N, V]
    >>> params = [SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=0),
    ...           SamplingParams(top_k=4, min_p=0.05)]
    >>> probs = process_logits(logits, params)                         # [N, V] fp32, rows sum to 1
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from spec_samplers.constants import input_error
from spec_samplers.logits_processor import LogitsPipe, LogitsProcessor, MinP, Softmax, Temperature, TopK, TopP

#: vLLM's _SAMPLING_EPS: a temperature below this is greedy sampling
SAMPLING_EPS = 1e-5
_INT64_MIN = -(2**63)
_UINT64_END = 2**64


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """The sampling fields of vLLM's ``SamplingParams``, with its names, defaults and validation.

    Args:
        temperature: finite and >= 0; below 1e-5 (vLLM's epsilon) the request is greedy, and then,
            as in vLLM, top_p, top_k and min_p are reset to their neutral values.
        top_p: cumulative probability of the top tokens to keep, in (0, 1]; 1 keeps all.
        top_k: number of top tokens to keep; 0 or -1 keeps all (vLLM accepts -1 quietly).
        min_p: keep tokens whose probability is at least min_p times the largest, in [0, 1].
        seed: random seed of the request (an int in [-2**63, 2**64)), or None.

    Bad values raise :class:`spec_samplers.SpecSamplerInputError` (a ValueError) naming the field,
    the expected and the actual value. Unlike vLLM 0.32, temperatures above 2 are accepted and
    temperatures in (0, 0.01) are not raised to 0.01: the processing runs in fp32 and handles both.

    Example::

        >>> SamplingParams(temperature=0.8, top_p=0.95).is_greedy
        False
        >>> SamplingParams(top_p=0)
        Traceback (most recent call last):
        ...
        spec_samplers.constants.SpecSamplerInputError: top_p: expected a number in (0, 1], got 0
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if not _is_number(t) or not math.isfinite(t) or t < 0:
            raise input_error("temperature", "a finite number >= 0", repr(t))
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise input_error("top_p", "a number in (0, 1]", repr(self.top_p))
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            raise input_error("top_k", "an int, 0 or -1 (disabled) or >= 1", repr(self.top_k))
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise input_error("min_p", "a number in [0, 1]", repr(self.min_p))
        seed = self.seed
        if seed is not None and (
            not isinstance(seed, int) or isinstance(seed, bool) or not _INT64_MIN <= seed < _UINT64_END
        ):
            raise input_error("seed", "None or an int in [-2**63, 2**64)", repr(seed))
        if t < SAMPLING_EPS:  # vLLM's greedy reset
            object.__setattr__(self, "top_p", 1.0)
            object.__setattr__(self, "top_k", 0)
            object.__setattr__(self, "min_p", 0.0)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def seed_int64(self) -> int | None:
        """The seed as a signed 64-bit int (two's complement for seeds >= 2**63)."""
        if self.seed is None:
            return None
        return (self.seed - _INT64_MIN) % _UINT64_END + _INT64_MIN

    @classmethod
    def from_any(cls, params: object) -> SamplingParams:
        """Copy the five sampling fields of any object that has them (e.g. ``vllm.SamplingParams``)."""
        if isinstance(params, cls):
            return params
        try:
            fields = {name: getattr(params, name) for name in ("temperature", "top_p", "top_k", "min_p", "seed")}
        except AttributeError as exc:
            raise input_error(
                "sampling_params", "SamplingParams or an object with its fields", type(params).__name__
            ) from exc
        return cls(**fields)


class SamplingTensors(NamedTuple):
    """Per-row parameters as tensors (built once per batch by :func:`sampling_tensors`).

    The flags are host bools saying whether any row uses a step, so unused steps are skipped
    without reading the tensors back.
    """

    temperature: torch.Tensor  # [N] fp32, 1 on greedy rows
    top_p: torch.Tensor  # [N] fp32, 1 = off
    top_k: torch.Tensor  # [N] int64, 0 = off
    min_p: torch.Tensor  # [N] fp32, 0 = off
    is_greedy: torch.Tensor  # [N] bool
    any_min_p: bool
    any_top_k: bool
    any_top_p: bool
    any_greedy: bool
    all_greedy: bool

    @property
    def num_rows(self) -> int:
        return self.temperature.shape[0]

    def repeat_rows(self, repeats: int) -> SamplingTensors:
        """Each row ``repeats`` times in a row (for [B, m, V] logits viewed as [B*m, V])."""
        return self._replace(**{f: getattr(self, f).repeat_interleave(repeats) for f in _TENSOR_FIELDS})

    def select(self, index: torch.Tensor) -> SamplingTensors:
        """Rows ``index`` ([M] int64), e.g. the requests still running."""
        return self._replace(**{f: getattr(self, f)[index.to(self.temperature.device)] for f in _TENSOR_FIELDS})


_TENSOR_FIELDS = ("temperature", "top_p", "top_k", "min_p", "is_greedy")


def as_params_list(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, num_rows: int, name: str = "sampling_params"
) -> list[SamplingParams]:
    """One SamplingParams per row: None means the defaults, a single one applies to every row."""
    if sampling_params is None:
        return [SamplingParams()] * num_rows
    if not isinstance(sampling_params, Sequence):
        return [SamplingParams.from_any(sampling_params)] * num_rows
    if len(sampling_params) != num_rows:
        raise input_error(name, f"one SamplingParams or a list of {num_rows}", f"a list of {len(sampling_params)}")
    return [SamplingParams.from_any(p) for p in sampling_params]


def sampling_tensors(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, num_rows: int, device: torch.device | str
) -> SamplingTensors:
    """Per-row tensors of ``sampling_params`` (one for every row, or a list of ``num_rows``)."""
    rows = as_params_list(sampling_params, num_rows)
    greedy = [p.is_greedy for p in rows]
    # One host tensor, one copy: a tensor per field from a list would cost a blocking copy each.
    # fp64 holds every field exactly (fp32 rounding happens on the device, as torch.tensor's would).
    # Rows padded to a multiple of 4 entries: each fp32 field then starts 16-byte aligned, as a
    # tensor of its own would (kernels specialise on pointer alignment; no extra variants).
    width = -(-num_rows // 4) * 4
    pad = [0.0] * (width - num_rows)
    host = torch.tensor(
        [
            [1.0 if g else p.temperature for p, g in zip(rows, greedy)] + pad,
            [p.top_p for p in rows] + pad,
            [p.min_p for p in rows] + pad,
            [max(p.top_k, 0) for p in rows] + pad,
            [float(g) for g in greedy] + pad,
        ],
        dtype=torch.float64,
    ).reshape(5, width)
    device = torch.device(device)
    if device.type == "cuda":
        host = host.pin_memory()  # the copy below then does not wait for the device
    packed = host.to(device, non_blocking=True)
    floats = packed[:3].to(torch.float32)
    return SamplingTensors(
        temperature=floats[0, :num_rows],
        top_p=floats[1, :num_rows],
        top_k=packed[3, :num_rows].to(torch.int64),
        min_p=floats[2, :num_rows],
        is_greedy=packed[4, :num_rows] != 0,
        any_min_p=any(p.min_p > 0 for p in rows),
        any_top_k=any(p.top_k > 0 for p in rows),
        any_top_p=any(p.top_p < 1 for p in rows),
        any_greedy=any(greedy),
        all_greedy=all(greedy) and num_rows > 0,
    )


class _Filters(NamedTuple):
    """filter_tensors' host buffer of one batch of parameters (:data:`_FILTERS`)."""

    params: object  # the parameters (kept: their ids are the key, so no other object reuses them)
    host: np.ndarray  # [5 * width] fp32 words: temperature, top_p, min_p, then top_k as int64
    pinned: torch.Tensor | None  # ``host`` in pinned memory, made at the first CUDA call
    width: int
    filters: bool  # some row filters (else only the temperature is returned)


#: (num_rows, device, id of the SamplingParams or of each in a list) -> their host buffer: a batch
#: of unchanged parameters (SamplingParams is frozen) costs one copy, no Python per row
_FILTERS: dict[tuple[object, ...], _Filters] = {}


def filter_tensors(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, num_rows: int, device: torch.device | str
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(temperature [N] fp32, 0 on greedy rows; {top_k [N] int64, top_p, min_p [N] fp32}, or {}
    when no row filters): what a sampler that applies the filters itself reads (``VerifyBatch``).

    Every field is final on the host (fp32 rounded as a device ``.to(torch.float32)`` rounds), in
    one buffer, so the call costs one copy to the device and no kernel: the fields are views (of
    a new tensor each call). The buffer of the same SamplingParams objects (one, or each of a list
    or tuple) is remembered; other parameter objects (e.g. vLLM's, which can change) are read
    every call."""
    kind = type(sampling_params)
    key: tuple[object, ...] | None = None
    if kind is SamplingParams or sampling_params is None:  # (None: the defaults)
        key = (num_rows, device, id(sampling_params))
    elif isinstance(sampling_params, (list, tuple)):
        key = (num_rows, device, kind, *map(id, sampling_params))
    entry = _FILTERS.get(key) if key is not None else None
    if entry is None:
        entry = _filters_host(sampling_params, num_rows)
        frozen = not isinstance(entry.params, tuple) or all(type(p) is SamplingParams for p in entry.params)
        if key is not None and frozen:
            if len(_FILTERS) >= 256:
                _FILTERS.clear()
            _FILTERS[key] = entry
    width = entry.width
    device = torch.device(device)
    if device.type == "cuda":  # pinned: the copy below then does not wait for the device
        if entry.pinned is None:
            entry = entry._replace(pinned=torch.from_numpy(entry.host).pin_memory())
            if key is not None and key in _FILTERS:
                _FILTERS[key] = entry
        packed = entry.pinned
    else:
        packed = torch.from_numpy(entry.host.copy())  # (a CPU result is the caller's own tensor)
    assert packed is not None
    packed = packed.to(device, non_blocking=True)
    floats = packed[: 3 * width].view(3, width)
    temperature = floats[0, :num_rows]
    if not entry.filters:
        return temperature, {}
    top_k = packed[3 * width :].view(torch.int64)[:num_rows]
    return temperature, dict(top_k=top_k, top_p=floats[1, :num_rows], min_p=floats[2, :num_rows])


def _filters_host(sampling_params: SamplingParams | Sequence[SamplingParams] | None, num_rows: int) -> _Filters:
    """The host buffer of :func:`filter_tensors`."""
    rows = as_params_list(sampling_params, num_rows)
    width = -(-num_rows // 4) * 4  # each field 16-byte aligned, as a tensor of its own would be
    host = np.zeros(5 * width, dtype=np.float32)  # 3 fp32 fields, then top_k as int64 (2 words)
    fields = host[: 3 * width].reshape(3, width)
    fields[0, :num_rows] = [0.0 if p.is_greedy else p.temperature for p in rows]
    fields[1, :num_rows] = [p.top_p for p in rows]
    fields[2, :num_rows] = [p.min_p for p in rows]
    host[3 * width :].view(np.int64)[:num_rows] = [max(p.top_k, 0) for p in rows]
    filters = any(p.min_p > 0 or p.top_k > 0 or p.top_p < 1 for p in rows)
    params = sampling_params if not isinstance(sampling_params, Sequence) else tuple(sampling_params)
    return _Filters(params, host, None, width, filters)


@functools.cache
def _processing_pipe(min_p: bool, top_k: bool, top_p: bool) -> LogitsPipe:
    """vLLM's processing as a compiled LogitsPipe, without the steps no row uses."""
    steps: list[LogitsProcessor] = [Temperature(), Softmax()]
    steps += [MinP()] if min_p else []
    steps += [TopK()] if top_k else []
    steps += [TopP()] if top_p else []
    return LogitsPipe(steps)


def process_logits(
    logits: torch.Tensor,  # [N, V] fp32/fp16/bf16
    sampling_params: SamplingParams | Sequence[SamplingParams] | SamplingTensors | None,
    backend: str = "auto",
) -> torch.Tensor:
    """Probabilities [N, V] fp32 that row n samples from under its SamplingParams.

    vLLM's order: softmax(logits / temperature), then min-p, top-k, top-p, each renormalised;
    greedy rows (temperature < 1e-5) are one-hot at the argmax of their logits (lowest index on
    ties). ``sampling_params``: one for every row, a list of N, or :class:`SamplingTensors` of N
    rows. Computed by the compiled :class:`~spec_samplers.logits_processor.LogitsPipe`
    ``[Temperature(), Softmax(), MinP(), TopK(), TopP()]`` (steps no row uses are left out), whose
    ops are :mod:`spec_samplers.sampling`'s (Triton kernels on CUDA): the one implementation of
    the filters; ``backend`` ("auto", "torch", "triton") picks theirs. Vectorised over rows; no host
    synchronisation. Logits may hold -inf (masked tokens) but
    every row needs a finite one and no NaN.

    Example::

        >>> probs = process_logits(torch.tensor([[2.0, 1.0, 0.0]]), SamplingParams(top_k=2))
        >>> probs[0, 2].item()
        0.0
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        actual = f"shape {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise input_error("logits", "a 2-d tensor [N, V]", actual)
    if not logits.is_floating_point():
        raise input_error("logits", "a floating-point tensor", logits.dtype)
    N, V = logits.shape
    st = (
        sampling_params
        if isinstance(sampling_params, SamplingTensors)
        else sampling_tensors(sampling_params, N, logits.device)
    )
    if st.num_rows != N:
        raise input_error("sampling_params", f"parameters for {N} rows", f"{st.num_rows} rows")
    if N == 0:
        return torch.empty(0, V, dtype=torch.float32, device=logits.device)
    # Greedy rows at temperature 0: the softmax gives the one-hot of their argmax, and their
    # filters are neutral (SamplingParams resets them), so the one-hot passes through unchanged.
    runtime: dict[str, torch.Tensor] = {"temperature": torch.where(st.is_greedy, 0.0, st.temperature)}
    if st.any_min_p:
        runtime["min_p"] = st.min_p
    if st.any_top_k:
        runtime["top_k"] = st.top_k
    if st.any_top_p:
        runtime["top_p"] = st.top_p
    return _processing_pipe(st.any_min_p, st.any_top_k, st.any_top_p)(logits, backend=backend, **runtime)
