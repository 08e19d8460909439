"""Launches per call (issue 40): Triton launches plus eager PyTorch ops, counted on CPU tensors
planned as for a 132-SM GPU (``backend.planned_for(LaunchConfig(num_sms=132, kernels=True))``: the
launches are recorded, not run) with ``tools/direct_path.py``'s counter, for every sampler entry
and sampling operation of its level calls. A count, not a timing: each eager op is a kernel
launch on a GPU, and the planning hook takes the GPU's decisions on CPU tensors.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _load_tool():
    spec = importlib.util.spec_from_file_location("direct_path", ROOT / "tools" / "direct_path.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["direct_path"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


dp = _load_tool()

#: issue 40's "done when": at most this many launches (Triton + eager) per call
SAMPLER_LIMIT = 3
SAMPLING_LIMIT = 4

#: calls still over the limit, with the count they must not exceed (a regression guard, not the
#: goal): sampling_params= crosses the host's SamplingParams in one copy and runs the filter cuts
#: of target and draft as two launches; the sampling operations combine their statistics'
#: partials and canonicalise top-k / top-p / min-p with eager ops
OVER_LIMIT = {
    "rejection.forward_from_logits[sampling_params]": 9,
    "typical.forward_from_logits[sampling_params]": 9,
    "sampling.sampling_from_logits": 5,
    "sampling.top_k_sampling_from_probs": 13,
    "sampling.top_p_sampling_from_probs": 14,
    "sampling.min_p_sampling_from_probs": 11,
    "sampling.top_k_top_p_sampling_from_probs": 22,
    "sampling.top_k_top_p_sampling_from_logits": 22,
    "sampling.softmax": 10,
    "sampling.top_k_renorm_probs": 12,
    "sampling.top_p_renorm_probs": 13,
    "sampling.top_k_mask_logits": 12,
}

_CALLS = {
    c.name: c for c in dp._sampler_calls("triton", 1) + dp._tree_calls("triton", 2) + dp._sampling_calls("triton", 3)
}
_CALLS.pop("sampling.chain_speculative_sampling")  # not a sampling operation of the list


@pytest.mark.parametrize("name", list(_CALLS))
def test_launches_per_call(name):
    row = dp.count_launches(_CALLS[name])
    assert row["syncs"] == 0, f"{name}: host syncs"
    limit = SAMPLER_LIMIT if not name.startswith("sampling.") else SAMPLING_LIMIT
    assert row["launches"] <= OVER_LIMIT.get(name, limit), f"{name}: {row['triton']} + {row['eager_ops']}"


NO_EAGER = [
    "rejection.forward",
    "typical.forward_ragged_from_logits[draft_rows]",
    "block.forward",
    # the tree kernels derive the layout, draw the final token and count in the launch
    "rejection.forward_tree_ragged_from_logits",
    "typical.forward_tree_from_logits",
]


@pytest.mark.parametrize("name", NO_EAGER)
def test_sampler_entry_runs_no_eager_op(name):
    """The acceptance counters are added by the kernels' finishing step (atomics): a Triton-path
    sampler call runs its launches and nothing else."""
    row = dp.count_launches(_CALLS[name])
    assert row["eager"] == 0, row["eager_ops"]


def test_counters_are_counted_in_the_planned_launch():
    """The finishing launch receives the sampler's counters (so a plan on meta tensors, as the cost
    model makes, has the counting in the launch itself), and meta planning leaves them untouched."""
    from spec_samplers import RejectionSampler
    from spec_samplers.kernels import backend

    B, k, V = 2, 3, 64
    meta = torch.device("meta")
    target, draft = torch.empty(B, k + 1, V, device=meta), torch.empty(B, k, V, device=meta)
    ids, bonus = torch.empty(B, k, dtype=torch.int64, device=meta), torch.empty(B, 1, dtype=torch.int64, device=meta)
    sampler = RejectionSampler()
    config = backend.LaunchConfig(num_sms=132, kernels=True, launches=[])
    with backend.planned_for(config):
        sampler(target, bonus, draft, ids, seeds=torch.empty(B, dtype=torch.int64, device=meta))
    (launch,) = config.launches
    assert launch.args["counts"] is not None and launch.args["counts"].shape == (2 + k,)
    assert sampler.num_accepted_tokens.device.type == "cpu" and sampler.num_draft_tokens == 0


def test_a_shared_seed_derives_the_row_seeds_in_a_kernel_on_cpu_tensors_too():
    """Under the planning hook CPU tensors take the GPU's decisions: a scalar seed becomes the rows'
    seeds in one launch (``row_seeds``), not in PyTorch's ~90 Philox ops. (Still eager: the
    scalar seed and offset become [1] tensors, the offset is expanded to [B]: 3 ops.)"""
    import spec_samplers.sampling as sampling

    probs = torch.softmax(torch.randn(2, 64, generator=torch.Generator().manual_seed(0)), -1)
    call = dp.Call("sampling_from_probs[seed=1]", "sampling_from_probs", sampling.sampling_from_probs, (probs,), {})
    call.kwargs.update(seed=1, backend="triton")
    row = dp.count_launches(call)
    assert row["triton"] == ["row_seeds", "race", "race_finalize"] and row["eager"] <= 3, row
