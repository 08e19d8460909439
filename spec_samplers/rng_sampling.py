"""The counter RNG as the FlashInfer-compatible sampling operations use it (PyTorch side).

Every random number of :mod:`spec_samplers.sampling` is an Exp(1) variable keyed by
(output row's seed, output row's offset, vocabulary index) on its own stream, so sampling never
reuses the verification samplers' streams, a row's token never depends on its batch neighbours
or on its row index, and the Triton mirror
(:func:`spec_samplers.kernels.sampling_kernels.sample_exponential`) reproduces it bit for bit.

The generator itself is reached through :func:`_sample_words` alone (one place to swap it).

Seeds given as one scalar for the whole batch (FlashInfer's form) become per-row seeds here
(:func:`derive_row_seeds`): row r's seed is a 64-bit function of (seed, offset, r), so rows
sharing a scalar seed still draw independent streams, as FlashInfer's per-row Philox
subsequences do.
"""

from __future__ import annotations

import torch

from spec_samplers import counter_rng

#: stream of the exponentials of the sampling race (vocabulary index = token id)
STREAM_SAMPLE = 2
#: stream of the per-row seeds derived from a scalar seed (vocabulary index = 2 * row + word)
STREAM_ROW_SEED = 3


def _sample_words(
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
    counters: torch.Tensor,  # [N, M] (or broadcastable) int64 in [0, 2**32)
    stream: int,
) -> torch.Tensor:
    """32 random bits (in int64) per (row key, counter): the one call into the generator."""
    key = counter_rng.row_key(seeds, offsets, torch.zeros_like(seeds), stream)
    return counter_rng.element_bits(key[:, None], counters)


def words_to_exponential(words: torch.Tensor) -> torch.Tensor:
    """fp32 Exp(1) samples (finite, > 0) from the words of :func:`_sample_words`."""
    return counter_rng.bits_to_exponential(words)


def sample_exponentials(
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
    vocab_size: int,
) -> torch.Tensor:
    """Exponentials of the sampling race. Returns [N, vocab_size] fp32 (> 0)."""
    vocab = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    return words_to_exponential(_sample_words(seeds, offsets, vocab[None, :], STREAM_SAMPLE))


def sample_exponentials_at(
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
    vocab_index: torch.Tensor,  # [N, M] int64: the vocabulary entries wanted per row
) -> torch.Tensor:
    """The entries ``vocab_index`` of :func:`sample_exponentials`. Returns [N, M] fp32."""
    return words_to_exponential(_sample_words(seeds, offsets, vocab_index.to(torch.int64), STREAM_SAMPLE))


def derive_row_seeds(seed: torch.Tensor, offset: torch.Tensor, num_rows: int) -> torch.Tensor:
    """[num_rows] int64 seeds of rows sharing one scalar ``seed`` and ``offset`` (0-d or [1] int64
    tensors): row r's seed is the 64-bit word pair r of the (seed, offset) stream STREAM_ROW_SEED."""
    seeds = seed.reshape(1).to(torch.int64)
    offsets = offset.reshape(1).to(torch.int64)
    r = torch.arange(num_rows, device=seeds.device, dtype=torch.int64)
    words = _sample_words(seeds, offsets, torch.stack([2 * r, 2 * r + 1], dim=1).reshape(1, -1), STREAM_ROW_SEED)
    words = words.reshape(num_rows, 2)
    hi = words[:, 1] - ((words[:, 1] >> 31) << 32)  # as a signed 32-bit value, so the shift cannot overflow
    return (hi * 2**32) | words[:, 0]
