"""How tokens are drawn: each request's SamplingParams and its own random stream.

Draws go through the FlashInfer-compatible sampling operation (``sampling_from_probs``: its Triton
kernels on CUDA, its PyTorch reference elsewhere, the same tokens), with one seed per draw derived
from (request seed, offset, position) on a stream of its own by the counter-based generator the
samplers use (``spec_samplers.rng``): an exact sample of p. A request's tokens therefore depend on its seed and its own
step counters only, never on its batch neighbours. The streams (``rng.STREAM_DECODE_*``) separate
the decoding loop's draws (draft tokens, bonus tokens, plain autoregressive steps) from each other
and from the verification sampler's, which receives the same request seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from spec_samplers import rng as _rng
from spec_samplers.rng import derive_seeds
from spec_samplers.sampling_params import (
    SamplingParams,
    SamplingTensors,
    as_params_list,
    process_logits,
    sampling_tensors,
)

#: the decoding loop's streams
DRAFT_STREAM = _rng.STREAM_DECODE_DRAFT
BONUS_STREAM = _rng.STREAM_DECODE_BONUS
STEP_STREAM = _rng.STREAM_DECODE_STEP

_MASK64 = (1 << 64) - 1


def _to_int64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def derive_seed(seed: int, index: int) -> int:
    """A request's seed from a generation seed and the request's index (splitmix64), as int64."""
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return _to_int64(z ^ (z >> 31))


def request_seeds(params: Sequence[SamplingParams], seed: int | None) -> list[int]:
    """int64 seed of each request: its SamplingParams.seed if set; else derived from ``seed`` and
    the request's index; else drawn from torch's default generator (reproducible under
    ``torch.manual_seed``)."""
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise TypeError(f"seed: expected an int or None, got {type(seed).__name__}")
    need = seed is None and any(p.seed is None for p in params)
    drawn = torch.randint(0, _rng.SEED_HIGH, (len(params),), dtype=torch.int64).tolist() if need else []
    out = []
    for i, p in enumerate(params):
        own = p.seed_int64
        out.append(own if own is not None else derive_seed(seed, i) if seed is not None else drawn[i])
    return out


def draw(
    probs: torch.Tensor,  # [N, V] fp32
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
    position: int,
    stream: int,
) -> torch.Tensor:
    """An exact sample of each row of ``probs`` (rows need not be normalised), keyed by
    (seed, offset, position) on ``stream``: [N] int64. Vectorised, no host synchronisation.

    The draw is the FlashInfer-compatible ``sampling_from_probs`` with a per-draw seed (words of
    (seed, offset, position) on ``stream``): its Triton kernels on CUDA, its PyTorch reference
    elsewhere, and on CPU fp32 rows with numba one compiled pass that derives the seed too
    (``cpu.draw.decode_rows``); the same tokens on all three."""
    from spec_samplers.cpu import draw as cpu_draw
    from spec_samplers.sampling.api import sampling_from_probs

    if cpu_draw.available(probs):  # the compiled CPU path (numba): the seeds and the race in one pass
        return cpu_draw.decode_rows(probs, seeds.cpu(), offsets.cpu(), position, stream)
    pos = torch.full((probs.shape[0],), position, dtype=torch.int64, device=probs.device)
    draw_seeds = derive_seeds(seeds.to(probs.device), offsets.to(probs.device), pos, stream)
    tokens = sampling_from_probs(probs, seed=draw_seeds, offset=torch.zeros_like(draw_seeds), backend="auto")
    return cast(torch.Tensor, tokens).to(torch.int64)  # (a tuple only with return_valid=True)


class SampleStrategy:
    """Token sampling strategy of a batch: per-request SamplingParams and seeds.

    Args:
        sampling_params: one SamplingParams for every request, a list with one per request, or
            None (the defaults: temperature 1).
        batch_size: number of requests (needed when ``sampling_params`` is not a list).
        seeds: [B] int64 seeds, or None for :func:`request_seeds` of the params.
        device: where the parameter tensors live (the model's device).

    Example::

        >>> strategy = SampleStrategy(SamplingParams(temperature=0.7, seed=1), batch_size=2)
        >>> strategy.sample(torch.randn(2, 32)).shape          # logits [B, V] -> ids [B]
        torch.Size([2])
    """

    def __init__(
        self,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        batch_size: int | None = None,
        seeds: torch.Tensor | Sequence[int] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if batch_size is None:
            if not isinstance(sampling_params, Sequence):
                raise TypeError("SampleStrategy: batch_size is required unless sampling_params is a list")
            batch_size = len(sampling_params)
        self.params = as_params_list(sampling_params, batch_size)
        self.tensors: SamplingTensors = sampling_tensors(self.params, batch_size, device)
        if seeds is None:
            seeds = request_seeds(self.params, None)
        self.seeds = torch.as_tensor(seeds, dtype=torch.int64).to(device)  # [B]
        self.steps = torch.zeros(batch_size, dtype=torch.int64, device=device)  # [B], plain sampling steps
        self._row_temperatures: dict[int, torch.Tensor] = {}  # probs' temperature per row, by rows a request

    @property
    def batch_size(self) -> int:
        return self.seeds.shape[0]

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed fp32 probabilities of logits [B, V] or [B, Q, V] (same shape)."""
        from spec_samplers.cpu import draw as cpu_draw

        st = self.tensors
        rows = logits if logits.dim() == 2 else logits.reshape(-1, logits.shape[-1])
        Q = logits.shape[1] if logits.dim() == 3 else 1
        plain = logits.dim() in (2, 3) and logits.shape[0] == st.num_rows
        plain = plain and not (st.any_min_p or st.any_top_k or st.any_top_p)
        if plain and cpu_draw.available(rows):  # (other row counts: process_logits names the error)
            # temperature alone: process_logits' pipe is sampling.softmax, whose CPU path is this
            # kernel (the same floats), called without the pipe's Python: on a cache a forward
            # pass just swept, that Python cost ~10x the kernel (0.4 against 0.04 ms a call)
            temperature = self._row_temperatures.get(Q)
            if temperature is None:  # (once per rows-per-request count: 1 and the round's k + 1)
                temperature = torch.where(st.is_greedy, 0.0, st.temperature).repeat_interleave(Q)
                self._row_temperatures[Q] = temperature
            return cpu_draw.softmax_rows(rows, temperature).view(logits.shape)
        if logits.dim() == 2:
            return process_logits(logits, st)
        return process_logits(rows, st.repeat_rows(Q)).view(logits.shape)

    def draw(self, probs: torch.Tensor, offsets: torch.Tensor, position: int, stream: int) -> torch.Tensor:
        """Sample probs [B, V] on ``stream`` at (offsets [B], position): [B] int64."""
        return draw(probs, self.seeds, offsets, position, stream)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token of each request from logits [B, V]: [B] int64 (one step of each
        request's plain-sampling stream)."""
        out = self.draw(self.probs(logits), self.steps, 0, STEP_STREAM)
        self.steps = self.steps + 1
        return out

    def select(self, indices: torch.Tensor) -> SampleStrategy:
        """The strategy of requests ``indices`` ([M] int64) only."""
        index = indices.to(self.seeds.device)
        new = object.__new__(SampleStrategy)
        new.params = [self.params[i] for i in indices.tolist()]
        new.tensors = self.tensors.select(index)
        new.seeds = self.seeds[index]
        new.steps = self.steps[index]
        new._row_temperatures = {}
        return new
