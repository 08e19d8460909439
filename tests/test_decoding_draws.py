"""The decoding loop's draws go through the FlashInfer-compatible sampling operation: its Triton
kernels where the backend resolves to them (CUDA), its PyTorch reference elsewhere (CPU), with one
seed per draw. The choice is the device's: checked by recording Triton launches."""

from __future__ import annotations

import torch

from spec_samplers.bench.cost import trace
from spec_samplers.decoding.strategy import BONUS_STREAM, DRAFT_STREAM, draw
from spec_samplers.rng import derive_seeds
from spec_samplers.sampling.api import sampling_from_probs


def _inputs(device: torch.device, B: int = 6, V: int = 300):
    g = torch.Generator().manual_seed(5)
    probs = torch.rand(B, V, generator=g).to(device) if device.type != "meta" else torch.empty(B, V, device=device)
    seeds = torch.arange(B, dtype=torch.int64, device=device) * 7919 + 11
    offsets = torch.arange(B, dtype=torch.int64, device=device) + 3
    return probs, seeds, offsets


def test_cpu_draws_run_the_reference_of_the_sampling_operation():
    probs, seeds, offsets = _inputs(torch.device("cpu"))
    with trace.recording(execute=True) as launches:
        tokens = draw(probs, seeds, offsets, 2, DRAFT_STREAM)
    assert launches == []  # no kernel on CPU: the PyTorch reference
    pos = torch.full((6,), 2, dtype=torch.int64)
    per_draw = derive_seeds(seeds, offsets, pos, DRAFT_STREAM)
    expected = sampling_from_probs(probs, seed=per_draw, offset=torch.zeros_like(per_draw), backend="torch")
    assert tokens.dtype == torch.int64 and torch.equal(tokens, expected.to(torch.int64))
    # another stream or another position is another draw
    assert not torch.equal(draw(probs, seeds, offsets, 2, BONUS_STREAM), tokens)
    assert not torch.equal(draw(probs, seeds, offsets, 3, DRAFT_STREAM), tokens)


def test_draws_take_the_sampling_kernels_where_the_backend_resolves_to_them():
    """As on CUDA: meta tensors with the kernel path forced (what the cost model does) record the
    sampling operation's Triton launches, and nothing else launches."""
    probs, seeds, offsets = _inputs(torch.device("meta"))
    with trace.tracing(num_sms=132) as launches:
        tokens = draw(probs, seeds, offsets, 0, DRAFT_STREAM)
    assert tokens.shape == (6,) and tokens.dtype == torch.int64
    assert launches and {launch.module for launch in launches} == {"spec_samplers.kernels.sampling_kernels"}
