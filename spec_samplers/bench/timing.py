"""Time per call, bytes moved and achieved bandwidth.

On CUDA each call is bracketed by CUDA events and read after one synchronize (a host timer around
unsynchronised GPU work measures the launch, not the work); on the CPU the work is synchronous
and ``time.perf_counter`` brackets each call. The reported time is the median over the repeats.

Bytes: ``bytes`` is the size of every tensor passed to the call plus its output (the convention
of memory-bound kernel benchmarks; a sampler that ignores an input, such as typical acceptance
with ``draft_probs``, is still charged for it). ``floor_bytes`` = 2 * B * V * itemsize is SPEC
section 6's floor for rejection sampling: one target and one draft vocabulary row per sequence.
``gbps`` = bytes / time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from spec_samplers.bench.workloads import timing_inputs


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_L2_FLUSH: dict[torch.device, torch.Tensor] = {}


def flush_l2(device: torch.device) -> None:
    """Overwrite a 256 MiB buffer (larger than any GPU's L2) so the next call reads from DRAM."""
    if device not in _L2_FLUSH:
        _L2_FLUSH[device] = torch.empty(2**28, dtype=torch.int8, device=device)
    _L2_FLUSH[device].zero_()


def time_call(
    fn: Callable[[], object],
    device: torch.device,
    min_time_s: float = 0.2,
    min_repeats: int = 3,
    max_repeats: int = 200,
    warmup: int = 2,
    cold_l2: bool = False,
) -> dict[str, Any]:
    """Median seconds per ``fn()`` call over enough repeats to fill ``min_time_s``.

    ``cold_l2`` (CUDA): the L2 cache is flushed before every timed call (outside the events)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    first = time.perf_counter() - t0  # host time after synchronize: only used to size the loop
    repeats = int(min(max_repeats, max(min_repeats, math.ceil(min_time_s / max(first, 1e-9)))))
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for start, end in events:
            if cold_l2:
                flush_l2(device)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        times = [start.elapsed_time(end) / 1e3 for start, end in events]
        timer = "cuda_events"
    else:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        timer = "perf_counter"
    return {"time_s": statistics.median(times), "time_min_s": min(times), "repeats": repeats, "timer": timer}


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def time_sampler(
    sampler: Callable[..., torch.Tensor],
    batch_size: int,
    k: int,
    vocab_size: int,
    dtype: torch.dtype,
    device: torch.device,
    min_time_s: float = 0.2,
    seed: int = 0,
) -> dict[str, Any]:
    """Time ``sampler(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)`` on
    softmax inputs of the given size; returns the timing with bytes, floor_bytes and gbps."""
    inputs = timing_inputs(batch_size, k, vocab_size, dtype, device, seed)
    args = (
        inputs["target_with_bonus_probs"],
        inputs["bonus_token_ids"],
        inputs["draft_probs"],
        inputs["draft_token_ids"],
    )
    out = sampler(*args)
    result = time_call(lambda: sampler(*args), device, min_time_s=min_time_s)
    nbytes = tensor_bytes(*args, out)
    result.update(
        {
            "batch_size": batch_size,
            "k": k,
            "vocab_size": vocab_size,
            "dtype": str(dtype).replace("torch.", ""),
            "device": str(device),
            "bytes": nbytes,
            "floor_bytes": 2 * batch_size * vocab_size * inputs["target_with_bonus_probs"].element_size(),
            "gbps": nbytes / result["time_s"] / 1e9,
            "acceptance": float((out[:, 1:] != -1).float().mean()) if k else 1.0,
        }
    )
    return result
