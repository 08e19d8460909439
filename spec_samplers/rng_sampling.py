"""The counter RNG (:mod:`spec_samplers.rng`, Philox4x32-10) as the FlashInfer-compatible sampling
operations use it (PyTorch side).

Every token of :mod:`spec_samplers.sampling` is drawn by the package's one rule, the two-level
race (:func:`spec_samplers.rng.two_level_race`), keyed by (output row's seed, output row's offset)
on its own stream, STREAM_SAMPLE, with counter base 0, so sampling never reuses the verification
samplers' streams (STREAM_ACCEPT, STREAM_RECOVER), a row's token never depends on its batch
neighbours or on its row index, and the Triton kernels (``race_kernel`` and its finalize in
:mod:`spec_samplers.kernels.sampling_kernels`) reproduce it bit for bit.

Seeds given as one scalar for the whole batch (FlashInfer's form) become per-row seeds here
(:func:`derive_row_seeds`): row r's seed is words (0, 1) of (seed, offset, counter r) on
STREAM_ROW_SEED, so rows sharing a scalar seed still draw independent streams, as FlashInfer's
per-row Philox subsequences do.
"""

from __future__ import annotations

import torch

from spec_samplers import rng
from spec_samplers.rng import STREAM_ROW_SEED, STREAM_SAMPLE  # numbered in rng, with every other stream


def sample_race(
    weights: torch.Tensor,  # [N, V] fp32: >= 0 for the kept tokens, 0 for the others
    seeds: torch.Tensor,  # [N] int64
    offsets: torch.Tensor,  # [N] int64
) -> torch.Tensor:
    """[N] int64: a sample of each row of ``weights`` by the two-level race
    (:func:`spec_samplers.rng.two_level_race`) on STREAM_SAMPLE with counter base 0 (level 1 at
    counters LEVEL1_COUNTER + group // 2, level 2 at index-in-group // 2)."""
    return rng.two_level_race(weights, seeds, offsets, torch.zeros_like(seeds), STREAM_SAMPLE)


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
