"""The vLLM seams' launch budgets, counted (not timed) on CPU tensors planned as for a 132-SM GPU
(``backend.planned_for(LaunchConfig(num_sms=132, kernels=True))``: every decision a GPU takes).

Triton launches are recorded, not run; eager ops are counted as tests/test_host_syncs.py counts
them (every aten op that is not a view or an allocation is a launch on a GPU). The seams' glue
(metadata checks, the bonus rows' inputs, at least one token, ``num_sampled``, the final mask) runs
in one kernel before the sampler and one after it: no eager op of its own. The sampler's
acceptance counters (``_update_counters``) are counted apart: they are the sampler's, not the
seam's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_host_syncs import _Counter

from spec_samplers import RejectionSampler
from spec_samplers.base import SpecDecodeBaseSampler
from spec_samplers.integrations.vllm import fast_path, v2_runner
from spec_samplers.integrations.vllm.ragged import RaggedVerifier
from spec_samplers.kernels import backend

V, K = 4096, 4
VERIFY = ["softmax_partials", "residual_partials"]  # the sampler's own launches (logits, point-mass drafts)


class _SeamCounter(_Counter):
    """Eager ops outside the sampler's acceptance counters (``counters``: those inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_counters = False
        self.counters = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.in_counters:
            before = sum(self.eager.values())
            out = super().__torch_dispatch__(func, types, args, kwargs)
            moved = sum(self.eager.values()) - before
            self.counters += moved
            self.eager[func.overloadpacket.__name__] -= moved
            return out
        return super().__torch_dispatch__(func, types, args, kwargs)


def _count(call, monkeypatch) -> tuple[list[str], dict[str, int], list[str]]:
    counter = _SeamCounter()
    update = SpecDecodeBaseSampler._update_counters

    def counted(self, *args, **kwargs):
        counter.in_counters = True
        try:
            return update(self, *args, **kwargs)
        finally:
            counter.in_counters = False

    monkeypatch.setattr(SpecDecodeBaseSampler, "_update_counters", counted)
    recorded: list = []
    with backend.planned_for(backend.LaunchConfig(num_sms=132, kernels=True, launches=recorded)):
        call()  # (the first call moves the sampler's counters to the device, once)
        recorded.clear()
        with counter:
            call()
    eager = {name: n for name, n in counter.eager.items() if n}
    return [launch.name for launch in recorded], eager, counter.syncs


def _mrv2(B: int, dtype: torch.dtype = torch.bfloat16):
    L = B * (K + 1)
    i32 = torch.int32
    args = (
        torch.empty(L, V, dtype=dtype),
        None,
        torch.randint(0, V, (L,), dtype=i32),
        torch.arange(0, L + 1, K + 1, dtype=i32),
        torch.arange(L),
        torch.arange(B, dtype=i32),
        torch.arange(B, dtype=i32).repeat_interleave(K + 1),
        torch.arange(K + 1, dtype=i32).repeat(B),
        torch.rand(B),
        torch.randint(0, 2**40, (B,)),
        K,
    )
    verifier = RaggedVerifier(RejectionSampler())
    return lambda: v2_runner.verify(verifier, *args)


@pytest.mark.parametrize("B", [1, 64])
def test_mrv2_seam_glue_is_two_launches_and_no_eager_op(B, monkeypatch):
    launches, eager, syncs = _count(_mrv2(B), monkeypatch)
    assert syncs == []
    assert launches == ["bonus_row_inputs", *VERIFY, "chunk_outputs"]
    assert eager == {}, f"eager ops of the MRv2 seam outside the sampler's counters: {eager}"


def _v1_step(B: int):
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm_support import sampling_metadata

    T = B * K
    sampled = np.cumsum([K + 1] * B)
    i32 = torch.int32
    metadata = SpecDecodeMetadata(
        draft_token_ids=torch.randint(0, V, (T,), dtype=i32),
        num_draft_tokens=[K] * B,
        cu_num_draft_tokens=torch.arange(K, T + 1, K, dtype=i32),
        cu_num_sampled_tokens=torch.tensor(sampled, dtype=i32),
        target_logits_indices=torch.tensor([s - K - 1 + i for s in sampled for i in range(K)], dtype=i32),
        bonus_logits_indices=torch.tensor(sampled - 1, dtype=i32),
        logits_indices=torch.arange(int(sampled[-1]), dtype=i32),
    )
    logits = torch.empty(T + B, V, dtype=torch.bfloat16)
    sm = sampling_metadata([0.8] * B)
    verifier = RaggedVerifier(RejectionSampler())
    return lambda: fast_path.verify_plain_step(verifier, metadata, None, logits, sm)


@pytest.mark.vllm  # builds vLLM's SpecDecodeMetadata
@pytest.mark.parametrize("B", [1, 64])
def test_v1_plain_step_glue_is_two_launches_and_one_seed_draw(B, monkeypatch):
    launches, eager, syncs = _count(_v1_step(B), monkeypatch)
    assert syncs == []
    assert launches == ["step_inputs", *VERIFY, "chunk_outputs"]
    # vLLM's rule draws the unseeded requests' randomness from torch's default generator: one op
    assert eager == {"randint": 1}, f"eager ops of the V1 plain step outside the sampler's counters: {eager}"
