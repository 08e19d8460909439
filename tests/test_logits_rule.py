"""The shared logits rule (spec_samplers.torch_ops.scaled_exp / probs_from_logits) against its kernel
twin (kernels/common.py: logits_rule, weights, load_q) value for value, its limits, and its precision
promise (docs/contract.md: weights down to 1e-12 of the row max within ~1e-5 relative).

On CUDA the two sides run the same IEEE operations and the same ex2, so the values must be equal
bit for bit. In the CPU interpreter the kernel's exp2 is numpy's and torch's is its own: they may
differ in the last bit, so there the weights are compared to 2**-22 relative (a few ulps) and
everything else (which entries are 0, which are exactly 1) exactly."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

from spec_samplers.constants import WEIGHT_MIN
from spec_samplers.kernels import common as kc
from spec_samplers.kernels.backend import precise_math
from spec_samplers.torch_ops import probs_from_logits, reciprocal_sum, scaled_exp

INF = float("inf")
#: the interpreter's exp2 (numpy) against torch's on the CPU: a few ulps; equal on CUDA
RTOL = 0.0 if DEVICE.type == "cuda" else 2.0**-22


@triton.jit
def _rule_kernel(
    x_ptr, max_ptr, temp_ptr, sum_ptr, cut_ptr, e_ptr, q_ptr, V, BLOCK: tl.constexpr, PRECISE: tl.constexpr
):
    """Row r of [R, V] logits: the rule's weights e (kc.weights) and q (kc.load_q) from the given
    row max, T, sum and cut (one program per row, the per-row constants computed once)."""
    r = tl.program_id(0)
    rule = kc.logits_rule(tl.load(max_ptr + r), tl.load(temp_ptr + r), tl.load(sum_ptr + r), tl.load(cut_ptr + r))
    m, c, _, _ = rule
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        x = tl.load(x_ptr + r * V + offs, mask=mask, other=float("-inf"))
        x = tl.maximum(x, float("-inf"))
        tl.store(e_ptr + r * V + offs, kc.weights(x, m, c, PRECISE), mask=mask)
        tl.store(q_ptr + r * V + offs, kc.load_q(x_ptr + r * V, offs, mask, rule, True, PRECISE), mask=mask)


def _kernel_rule(x, row_max, temp, row_sum, cut):
    R, V = x.shape
    e = torch.empty_like(x)
    q = torch.empty_like(x)
    args = [t.to(DEVICE).contiguous() for t in (x, row_max, temp, row_sum, cut)]
    _rule_kernel[(R,)](*args, e, q, V, BLOCK=64, PRECISE=precise_math())
    return e.cpu(), q.cpu()


def _torch_rule(x, row_max, temp, row_sum, cut):
    """The PyTorch side of the same quantities (on DEVICE, so CUDA compares CUDA with CUDA)."""
    x, row_max, temp, row_sum, cut = (t.to(DEVICE) for t in (x, row_max, temp, row_sum, cut))
    x = torch.fmax(x, torch.full((), -INF, device=DEVICE))
    e = scaled_exp(x, row_max[:, None], temp[:, None])
    q = torch.where(e >= cut[:, None], e * reciprocal_sum(row_sum)[:, None], 0.0)
    return e.cpu(), q.cpu()


def _rows() -> tuple[torch.Tensor, torch.Tensor]:
    """[R, V] fp32 logits and [R] temperatures: random rows at several scales and temperatures, and
    the rule's limits (+inf logits, NaN, rows all -inf, T = +inf, tiny and subnormal T, ties,
    differences that overflow fp32, logits near the fp32 range)."""
    gen = torch.Generator().manual_seed(19)
    V = 200
    scales = [0.1, 1.0, 3.0, 10.0, 40.0, 1e3]
    temps = [1.0, 0.7, 1.3, 0.05, 25.0, 1e-3]
    rows, ts = [], []
    for s, t in zip(scales, temps):
        rows.append(torch.randn(V, generator=gen) * s + torch.randn((), generator=gen) * 50)
        ts.append(t)
    x = torch.randn(V, generator=gen)
    special = []
    r = x.clone()
    r[[3, 150]] = INF  # +inf entries share the mass, at any T
    special += [(r, 1.0), (r, INF), (r, 1e-40)]
    special.append((torch.full((V,), -INF), 1.0))  # no mass
    r = torch.full((V,), float("nan"))
    r[7] = -2.0  # NaN counts as -inf: one finite entry
    special.append((r, 0.3))
    r = x.clone()
    r[:50] = -INF
    special += [(r, INF), (r, 1e-38), (r, 1e-45)]  # uniform over x > -inf; one-hot on the max
    r = x.clone()
    r[[10, 20]] = 5.0  # tied maxima share under a tiny T
    special += [(r, 1e-30), (r, 1e-45)]
    r = x.clone()
    r[0], r[1] = 3e38, -3e38  # x - m overflows to -inf: weight 0, also at T = +inf
    special += [(r, 0.5), (r, INF)]
    special.append((torch.linspace(-200.0, 0.0, V), 1.0))  # weights down to 2**-288: the cut at 2**-126
    for r, t in special:
        rows.append(r)
        ts.append(t)
    return torch.stack(rows), torch.tensor(ts)


def test_kernel_twin_computes_the_rule_value_for_value():
    x, temp = _rows()
    clean = torch.where(torch.isnan(x), -INF, x)
    row_max = clean.amax(-1)
    row_sum = scaled_exp(clean, row_max[:, None], temp[:, None]).sum(-1)
    cut = torch.zeros_like(temp)
    cut[1] = 0.01  # a truncating sampler's cut
    e_k, q_k = _kernel_rule(x, row_max, temp, row_sum, cut)
    e_t, q_t = _torch_rule(x, row_max, temp, row_sum, cut)
    # the same entries are 0 and exactly 1, and nothing is NaN or inf
    for k, t in ((e_k, e_t), (q_k, q_t)):
        assert torch.isfinite(k).all() and torch.isfinite(t).all()
        assert torch.equal(k == 0, t == 0)
        assert torch.equal(k == 1, t == 1)
        assert torch.allclose(k, t, rtol=RTOL, atol=0.0)
    assert bool(((e_t == 0) | (e_t >= WEIGHT_MIN)).all())  # no subnormal weight on either side


def test_rule_limits():
    x, temp = _rows()
    n = 6  # the random rows come first
    e = scaled_exp(
        torch.where(torch.isnan(x), -INF, x), torch.where(torch.isnan(x), -INF, x).amax(-1, keepdim=True), temp[:, None]
    )
    inf_at = torch.zeros(x.shape[1])
    inf_at[[3, 150]] = 1.0
    for k in range(3):  # +inf entries share the mass at T = 1, +inf and a subnormal T
        assert torch.equal(e[n + k], inf_at)
    assert torch.equal(e[n + 3], torch.zeros(x.shape[1]))  # no mass
    assert e[n + 4].nonzero().flatten().tolist() == [7] and e[n + 4, 7] == 1.0
    finite = torch.ones(x.shape[1])
    finite[:50] = 0.0
    assert torch.equal(e[n + 5], finite)  # T = +inf: uniform over x > -inf
    for k in (6, 7):  # a tiny and the smallest subnormal T: one-hot on the max
        assert e[n + k].nonzero().flatten().tolist() == [int(x[n + k].argmax())]
    for k in (8, 9):  # ties share
        assert e[n + k].nonzero().flatten().tolist() == [10, 20]
    assert e[n + 10, 1] == 0.0 and e[n + 10, 0] == 1.0 and e[n + 10, 2:].sum() == 0.0  # 3e38 at T = 0.5
    assert e[n + 11, 1] == 0.0 and bool((e[n + 11, 2:] == 1.0).all())  # overflow -> 0, also at T = +inf
    ramp = e[n + 12]
    assert bool(((ramp == 0) == (torch.linspace(-200.0, 0.0, x.shape[1]) * math.log2(math.e) < -126)).all())
    probs = probs_from_logits(x, temp)
    assert torch.equal(probs[n + 3], torch.zeros(x.shape[1]))
    assert torch.equal(probs[n], inf_at / 2)
    assert torch.allclose(probs[:n].sum(-1), torch.ones(n), rtol=0, atol=1e-6)


@pytest.mark.parametrize("temp", [0.5, 1.0, 2.0, 7.3])
def test_weights_keep_their_relative_precision_down_to_1e_12(temp):
    """docs/contract.md: a weight w >= 1e-12 of the row max is within ~1e-5 relative of the exact
    exp((x - m) / T) (the stated bound is (4 ln2 |log2 w| + 4) * 2**-24, about 7e-6 at 1e-12; the
    CPU's exp2 is more accurate than CUDA's 2-ulp ex2, so this measures the rest of the rule)."""
    gen = torch.Generator().manual_seed(int(temp * 10))
    x = torch.randn(8, 4096, generator=gen, dtype=torch.float64) * 6 * temp + 10
    x32 = x.float()
    t = torch.full((8, 1), temp)
    m = x32.amax(-1, keepdim=True)
    e = scaled_exp(x32, m, t).double()
    exact = torch.exp((x32.double() - m.double()) / torch.tensor(temp, dtype=torch.float32).double())
    ok = exact >= 1e-12
    assert int(ok.sum()) > 1000
    rel = ((e - exact).abs() / exact)[ok]
    z = exact[ok].log2().abs()
    bound = (4 * math.log(2) * z + 4) * 2.0**-24
    assert bool((rel <= bound).all()), float((rel / bound).max())
    assert float(rel.max()) < 1e-5
