"""The fused softmax's row statistics (kernels/softmax_kernels.py) against the PyTorch logits rule
(torch_ops.probs_from_logits): the row max and the greedy argmax exactly, the denominator to
rounding (its order, exp2 and 1 / T differ from torch's), on rows with the rule's limits
(+inf logits, NaN, rows all -inf, T = +inf, tiny and subnormal T, ties), across vocabulary splits
whose blocks, vector steps and tails differ."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

from spec_samplers.kernels.backend import vocab_split
from spec_samplers.kernels.verify_launch import plan_softmax_stats
from spec_samplers.layout import RowLayout
from spec_samplers.torch_ops import scaled_exp

INF = float("inf")


def _reference(x: torch.Tensor, temp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row max, sum of exp((x - max) / T), argmax) of [B, R, V] logits by the PyTorch rule."""
    x = x.float()
    x = torch.where(torch.isnan(x), -INF, x)
    m = x.amax(-1, keepdim=True)
    t = torch.where(temp > 0, temp, 1.0)[:, None, None]
    return m[..., 0], scaled_exp(x, m, t).sum(-1), x.argmax(-1)


def _logits(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    B, K, V = 6, 2, 1003
    t = torch.randn(B, K + 1, V, generator=gen) * 3
    d = torch.randn(B, K, V, generator=gen) * 3
    t[0, 0, 5] = INF  # two +inf entries share the mass
    t[0, 0, 1000] = INF
    t[0, 1] = -INF  # no distribution
    t[0, 2] = float("nan")  # NaN counts as -inf: one finite entry
    t[0, 2, 77] = 1.0
    t[1, 0, 10:20] = float("nan")
    t[1, 1, 3] = INF  # the +inf entries in different blocks and lanes
    t[1, 1, 999] = INF
    t[2, 0] = 0.0  # all tied: argmax 0
    t[2, 1, :100] = -INF
    t[2, 1, [30, 700, 701]] = 50.0  # tied maxima in different blocks: the lowest index
    t[3, 0, 600] = 3e38  # x / T overflows
    d[0] = t[0, :K]  # a draft equal to the target: the same statistics
    temp = torch.tensor([1.0, 0.7, INF, 1e-30, 0.0, 1e-42])  # greedy, subnormal
    return t.to(dtype), d.to(dtype), temp


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("block_v,num_blocks", [(16, 3), (64, 4), (256, 2), (None, None)])
def test_statistics_follow_the_logits_rule(dtype, block_v, num_blocks):
    t, d, temp = _logits(dtype)
    B, K = t.shape[0], d.shape[1]
    layout = RowLayout.padded(B, K, t.shape[-1])
    split = vocab_split(t.shape[-1], B, DEVICE, block_v, num_blocks)
    t, d, temp = t.to(DEVICE), d.to(DEVICE), temp.to(DEVICE)
    launches, amax_val, amax_idx, stats = plan_softmax_stats(layout, t, d, temp, split)
    for launch in launches:
        launch.kernel[launch.grid](**launch.args, num_warps=launch.num_warps, **launch.options)
    m, s, arg = _reference(t.cpu(), temp.cpu())
    got = stats.target.cpu()
    assert torch.equal(got[..., 0], m)
    assert torch.allclose(got[..., 1], s, rtol=2e-6, atol=0)
    assert torch.equal(got[..., 2], torch.zeros_like(m))
    # the block partials' argmax combined as the consumers do: the largest, ties to the lowest block
    best = amax_val.cpu().argmax(-1, keepdim=True)
    assert torch.equal(amax_idx.cpu().gather(-1, best)[..., 0].long(), arg)
    dm, ds, _ = _reference(d.cpu(), temp.cpu())
    d_got = stats.draft.cpu()[:, :K]
    assert torch.equal(d_got[..., 0], dm)
    assert torch.allclose(d_got[..., 1], ds, rtol=2e-6, atol=0)
    assert torch.equal(d_got[0], got[0, :K])  # equal rows, equal statistics (bit for bit)
    assert got[0, :, 1].tolist() == [2.0, 0.0, 1.0]  # exact limits: two +inf, none, one finite
