"""Hot paths neither synchronise with the host nor copy from it while blocking, and their eager
glue stays a handful of ops: counted, not timed, on fake CUDA tensors (no GPU needed).

A dispatch mode sees every PyTorch op a call runs; the Triton launches are recorded, not run
(``LaunchConfig.launches``). What
is counted, per call:

* syncs: ``aten._local_scalar_dense`` (``.item()``, ``bool(t)``, ``int(t)``) and blocking
  host-to-device copies (``torch.tensor(list, device=cuda)`` is one: a pageable copy waits for
  the device to drain);
* eager ops: every op that is not a view or an allocation (each is a kernel launch on a GPU).

The first GPU profile (H200, benchmarks/gpu_host_profile.py) counted 5 syncs in
``sampling_tensors`` and 107 launches in ``sampling.sampling_from_probs``; these counts are the
same quantities.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import spec_samplers.sampling as sampling
from spec_samplers import RejectionSampler, SamplingParams
from spec_samplers.bench.cost.trace import OpCounter
from spec_samplers.kernels import backend
from spec_samplers.sampling_params import filter_tensors, sampling_tensors

_Counter = OpCounter  # (shared with benchmarks/host_overhead.py: one definition of an eager launch)


def _count(make: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[_Counter, list[str]]:
    """Build the inputs with ``make()`` and count the second call of the function it returns
    (the first moves a sampler's counters to the device, once)."""
    recorded: list[Any] = []
    monkeypatch.setattr(backend, "_num_sms", lambda index: 132)  # an H100/H200's, without a device
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)  # fake tensors cannot pin
    counter = _Counter()
    with FakeTensorMode(allow_non_fake_inputs=True), backend.planned_for(backend.LaunchConfig(launches=recorded)):
        call = make()
        call()
        recorded.clear()
        with counter:
            call()
    return counter, [launch.name for launch in recorded]


def _probs() -> torch.Tensor:
    return torch.rand(2, 4096, device="cuda")


CASES = {
    # name: (make the call, eager ops at most, the Triton launches)
    "sampling_from_probs": (
        lambda: (lambda p: lambda: sampling.sampling_from_probs(p, seed=1, backend="triton"))(_probs()),
        0,  # (the race's finalize derives the rows' seeds of a scalar seed)
        ["race", "race_finalize"],  # (unfiltered probabilities need no row statistics)
    ),
    "top_k_sampling_from_probs": (
        lambda: (lambda p: lambda: sampling.top_k_sampling_from_probs(p, 50, seed=1, backend="triton"))(_probs()),
        0,  # (a Python top_k stays a kernel argument)
        ["thresholds", "race", "race_finalize"],
    ),
    "softmax": (
        lambda: (lambda x: lambda: sampling.softmax(x, 0.8, backend="triton"))(torch.randn(2, 4096, device="cuda")),
        0,
        ["stats", "softmax"],  # (the softmax kernel combines the statistics' block partials itself)
    ),
    "sampling_tensors": (
        lambda: lambda: sampling_tensors(SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05), 3, "cuda"),
        4,
        [],
    ),
    "filter_tensors": (  # what the samplers that apply the filters read: final values, views only
        lambda: lambda: filter_tensors(SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05), 3, "cuda"),
        1,  # the one non-blocking host-to-device copy
        [],
    ),
}


@pytest.mark.cuda_build
@pytest.mark.parametrize("name", list(CASES))
def test_call_makes_no_host_sync_and_few_launches(name, monkeypatch):
    make, max_eager, kernels = CASES[name]
    counter, launches = _count(make, monkeypatch)
    assert counter.syncs == [], f"{name}: host synchronisations {counter.syncs}"
    assert all(counter.copies), f"{name}: blocking host-to-device copies ({counter.copies})"
    assert launches == kernels
    assert sum(counter.eager.values()) <= max_eager, f"{name}: eager ops {dict(counter.eager)}"


@pytest.mark.cuda_build
def test_sampling_tensors_copies_once_from_pinned_memory(monkeypatch):
    """The five per-row fields cross in one non-blocking copy (they took five blocking ones)."""
    pinned: list[bool] = []
    counter, _ = _count(CASES["sampling_tensors"][0], monkeypatch)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned.append(True) or self)
    with FakeTensorMode(allow_non_fake_inputs=True):
        sampling_tensors(SamplingParams(top_k=3), 2, "cuda")
    assert counter.copies == [True] and pinned == [True]


@pytest.mark.cuda_build
def test_filtered_logits_verification_makes_no_host_sync(monkeypatch):
    """forward_from_logits with SamplingParams (the fused filters): no sync, no blocking copy."""

    def make() -> Any:
        B, k, V = 2, 3, 512
        target, draft = torch.randn(B, k + 1, V, device="cuda"), torch.randn(B, k, V, device="cuda")
        ids = torch.randint(0, V, (B, k), device="cuda")
        bonus = torch.randint(0, V, (B, 1), device="cuda")
        seeds = torch.arange(B, device="cuda")
        params = SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05)
        sampler = RejectionSampler(backend="triton")
        return lambda: sampler.forward_from_logits(target, bonus, draft, ids, sampling_params=params, seeds=seeds)

    # (the per-stream arrival counters and workspaces ask the CUDA runtime for the current stream)
    monkeypatch.setattr(backend, "arrival_counters", lambda device, n: torch.zeros(n, dtype=torch.int32))
    monkeypatch.setattr(backend, "_stream_key", lambda device: None)  # (fresh workspaces)
    counter, launches = _count(make, monkeypatch)
    assert counter.syncs == [] and all(counter.copies), (counter.syncs, counter.copies)
    assert "filter_cut" in launches
