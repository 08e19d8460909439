"""The counter RNG (:mod:`spec_samplers.rng`, Philox4x32-10) as the FlashInfer-compatible sampling
operations use it (PyTorch side).

Every random number of :mod:`spec_samplers.sampling` is an Exp(1) variable keyed by
(output row's seed, output row's offset, vocabulary index) on its own stream, STREAM_SAMPLE, so
sampling never reuses the verification samplers' streams (STREAM_ACCEPT, STREAM_RECOVER), a row's
token never depends on its batch neighbours or on its row index, and the Triton mirror
(:func:`spec_samplers.kernels.sampling_kernels.sample_exponential`) reproduces it bit for bit.
Layout as the recovery race's: vocabulary index v uses counter v // 2 and the word pair (0, 1)
(v even) or (2, 3) (v odd), 64 random bits per element (:func:`spec_samplers.rng.exponential_from_words`).

Seeds given as one scalar for the whole batch (FlashInfer's form) become per-row seeds here
(:func:`derive_row_seeds`): row r's seed is words (0, 1) of (seed, offset, counter r) on
STREAM_ROW_SEED, so rows sharing a scalar seed still draw independent streams, as FlashInfer's
per-row Philox subsequences do.
"""

from __future__ import annotations

import torch

from spec_samplers import rng
from spec_samplers.rng import STREAM_ROW_SEED, STREAM_SAMPLE  # numbered in rng, with every other stream


def _pair_words(
    seeds: torch.Tensor, offsets: torch.Tensor, vocab_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two words of each vocabulary index (broadcast int64 tensors): the one call into the
    generator."""
    w0, w1, w2, w3 = rng.philox_words(seeds, offsets, vocab_index >> 1, STREAM_SAMPLE)
    odd = (vocab_index & 1) == 1
    return torch.where(odd, w2, w0), torch.where(odd, w3, w1)


def sample_exponentials_at(
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
    vocab_index: torch.Tensor,  # [N, M] int64: the vocabulary entries wanted per row
) -> torch.Tensor:
    """Exponentials of the sampling race at ``vocab_index``. Returns [N, M] fp32 in
    [rng.EXP_MIN, rng.EXP_MAX]."""
    a, b = _pair_words(seeds[:, None], offsets[:, None], vocab_index.to(torch.int64))
    return rng.exponential_from_words(a, b)


def sample_exponentials(
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
    vocab_size: int,
) -> torch.Tensor:
    """Exponentials of the sampling race for the whole vocabulary. Returns [N, vocab_size] fp32."""
    n = seeds.shape[0]
    half = (vocab_size + 1) // 2
    pairs = torch.arange(half, device=seeds.device, dtype=torch.int64)
    w0, w1, w2, w3 = rng.philox_words(seeds[:, None], offsets[:, None], pairs[None, :], STREAM_SAMPLE)
    exps = torch.stack((rng.exponential_from_words(w0, w1), rng.exponential_from_words(w2, w3)), dim=-1)
    return exps.reshape(n, 2 * half)[:, :vocab_size]


def race_keys(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """(w * RACE_SCALE) / E, the keys of :func:`spec_samplers.rng.race` (negative w: never wins
    against w >= 0)."""
    return (weights * rng.RACE_SCALE) / exponentials


def _race_eager(weights: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return torch.argmax(race_keys(weights, sample_exponentials(seeds, offsets, weights.shape[1])), dim=-1)


def sample_race(
    weights: torch.Tensor,  # [N, V] fp32: >= 0 for the kept tokens, < 0 for the others
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
) -> torch.Tensor:
    """[N] int64 argmax_v (w_v * RACE_SCALE) / E_v over the whole row (ties to the lowest index),
    without the [N, V] exponentials on the CPU: as :func:`spec_samplers.rng.recovery_race`, large
    CPU calls run one torch.compile'd loop (bit-identical words; SPEC_SAMPLERS_COMPILE=0 or a
    failed compile falls back to the eager path, for every race)."""
    return rng.run_race(_race_eager, weights, seeds, offsets)


def derive_row_seeds(seed: torch.Tensor, offset: torch.Tensor, num_rows: int) -> torch.Tensor:
    """[num_rows] int64 seeds of rows sharing one scalar ``seed`` and ``offset`` (0-d or [1] int64
    tensors): row r's seed is words (0, 1) of (seed, offset, counter r) on STREAM_ROW_SEED."""
    seeds = seed.reshape(1).to(torch.int64)
    offsets = offset.reshape(1).to(torch.int64)
    r = torch.arange(num_rows, device=seeds.device, dtype=torch.int64)
    return derive_seeds(seeds, offsets, r, STREAM_ROW_SEED)


def derive_seeds(seeds: torch.Tensor, offsets: torch.Tensor, counters: torch.Tensor, stream: int) -> torch.Tensor:
    """int64 seeds (broadcast shape) made of words (0, 1) of (seed, offset, counter) on ``stream``."""
    w0, w1, _, _ = rng.philox_words(seeds, offsets, counters, stream)
    hi = w1 - ((w1 >> 31) << 32)  # as a signed 32-bit value, so the product cannot overflow
    return (hi * 2**32) | w0
