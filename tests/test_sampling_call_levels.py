"""The path of a sampling operation to its kernels (issue 28): a structure check, not a timing.

Each public operation of :mod:`spec_samplers.sampling` reaches every ``kernel[grid](...)`` with
at most three of the package's frames on the stack (the operation, a shared helper of
``api.py``, the launcher of ``kernels/sampling_launch.py``), and, in eager mode on real tensors,
none of :mod:`spec_samplers.custom_ops`. The launches are recorded at the kernel's ``run``
(``kernel[grid](...)`` calls it) and not run. With a :class:`LaunchConfig` the operations plan
their launches on meta tensors for a GPU they do not have (what the cost model reads).
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import pytest
import torch

import spec_samplers
import spec_samplers.sampling as sampling
from spec_samplers.kernels import backend
from spec_samplers.kernels import sampling_kernels as sk

PACKAGE = os.path.dirname(os.path.abspath(spec_samplers.__file__)) + os.sep
B, V = 2, 64


def _ops(x: dict[str, torch.Tensor], **kw: Any) -> dict[str, Any]:
    """Every public sampling operation that launches the sampling kernels, on [B, V] inputs."""
    p, lg = x["probs"], x["logits"]
    seed = dict(seed=1, **kw)
    return {
        "softmax": lambda: sampling.softmax(lg, 0.8, **kw),
        "sampling_from_probs": lambda: sampling.sampling_from_probs(p, **seed),
        "sampling_from_logits": lambda: sampling.sampling_from_logits(lg, **seed),
        "top_k_sampling_from_probs": lambda: sampling.top_k_sampling_from_probs(p, 5, **seed),
        "top_p_sampling_from_probs": lambda: sampling.top_p_sampling_from_probs(p, 0.9, **seed),
        "min_p_sampling_from_probs": lambda: sampling.min_p_sampling_from_probs(p, 0.1, **seed),
        "top_k_top_p_sampling_from_probs": lambda: sampling.top_k_top_p_sampling_from_probs(p, 5, 0.9, **seed),
        "top_k_top_p_sampling_from_logits": lambda: sampling.top_k_top_p_sampling_from_logits(lg, 5, 0.9, **seed),
        "top_k_renorm_probs": lambda: sampling.top_k_renorm_probs(p, 5, **kw),
        "top_p_renorm_probs": lambda: sampling.top_p_renorm_probs(p, 0.9, **kw),
        "top_k_mask_logits": lambda: sampling.top_k_mask_logits(lg, 5, **kw),
    }


OPS = list(_ops({"probs": torch.empty(0), "logits": torch.empty(0)}))


@pytest.mark.parametrize("name", OPS)
def test_each_launch_is_three_calls_from_the_operation(name, monkeypatch):
    stacks: list[list[str]] = []

    def record(self: Any, *args: Any, **kwargs: Any) -> None:
        frames = [f for f in traceback.extract_stack() if f.filename.startswith(PACKAGE)]
        stacks.append([f"{os.path.relpath(f.filename, PACKAGE)}:{f.name}" for f in frames])

    monkeypatch.setattr(type(sk.stats_kernel), "run", record)  # the JIT (or interpreted) function's run
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = {"probs": torch.rand(B, V, device=device), "logits": torch.randn(B, V, device=device)}
    _ops(inputs, backend="triton")[name]()
    assert stacks, f"{name}: no kernel launched"
    for stack in stacks:
        assert len(stack) <= 3, f"{name}: {' -> '.join(stack)}"
        assert stack[0] == f"sampling/api.py:{name}" and stack[-1].startswith("kernels/sampling_launch.py:"), stack
        assert not any(frame.startswith("custom_ops.py") for frame in stack), stack


@pytest.mark.parametrize("name", OPS)
def test_launches_are_planned_on_meta_tensors_for_a_given_gpu(name):
    """``planned_for(LaunchConfig(num_sms=..., kernels=True, launches=[]))``: the launches a GPU
    with that many multiprocessors would run, recorded (kernel, grid, arguments), none run."""
    meta = {"probs": torch.empty(B, 4096, device="meta"), "logits": torch.empty(B, 4096, device="meta")}
    config = backend.LaunchConfig(num_sms=132, kernels=True, launches=[])
    with backend.planned_for(config):
        _ops(meta)[name]()
    assert config.launches, name
    split = backend.plan_vocab_split(4096, B, 4 * 132, 1024)  # the vocabulary split of a 132-SM GPU
    for launch in config.launches:
        assert launch.name and callable(launch.kernel[launch.grid]) and isinstance(launch.args, dict)
        assert isinstance(launch.num_warps, int) and isinstance(launch.options, dict)
        if len(launch.grid) == 2:  # the (B, NB) vocabulary launches
            assert launch.grid == (B, split.num_blocks), (launch.name, launch.grid)
    # without kernels=True, meta tensors take the custom op's shape function: nothing planned
    config = backend.LaunchConfig(num_sms=132, launches=[])
    with backend.planned_for(config):
        _ops(meta)[name]()
    assert config.launches == []
