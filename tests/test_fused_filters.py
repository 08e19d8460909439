"""SamplingParams filters fused into verification (issue 12).

A batch with per-request top-k / top-p / min-p (``VerifyBatch.top_k`` ...) is verified straight from
the logits: the kernels compute each row's cut and kept sum (``filter_cut_kernel``) and read
filtered probabilities on the fly, never writing a probability tensor. Checked here:

* the fused kernels give the PyTorch reference's tokens, token for token (rejection, block,
  typical; padded and ragged; fp32 and bf16; greedy, filtered and unfiltered requests mixed;
  ties and -inf entries in the logits; vocabulary blocks crossed);
* the filter kernel alone finds the reference's kept set and exactly its kept sum;
* the fused law (``filtered_softmax_reference``) is vLLM's processing (``process_logits``, the
  unfused pipe): same kept tokens, probabilities equal to fp32 rounding;
* the launch plan of a filtered batch runs the filter kernel and allocates no [.., V] tensor.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, small_split

from spec_samplers import SamplingParams
from spec_samplers.kernels import sampling_kernels
from spec_samplers.kernels.verify_launch import (
    REJECTION,
    block_triton,
    plan_filter_cuts,
    plan_verify,
    rejection_triton,
    typical_triton,
)
from spec_samplers.layout import VerifyBatch
from spec_samplers.reference import block_reference, rejection_reference, typical_reference
from spec_samplers.sampling.reference import MASS_SCALE, filter_threshold, filtered_softmax_reference
from spec_samplers.sampling_params import process_logits, sampling_tensors
from spec_samplers.torch_ops import scaled_exp

PARAMS = [
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=0),
    SamplingParams(top_k=3, min_p=0.05),
    SamplingParams(temperature=1.3, top_k=5, top_p=0.7, min_p=0.02),
    SamplingParams(temperature=0.6),
    SamplingParams(top_k=100, top_p=0.5),
]


def filtered_batch(gen, B: int, K: int, V: int, dtype: torch.dtype, ragged: bool, draft: bool):
    """A batch whose requests cycle through PARAMS, with ties and -inf entries in the logits."""
    params = [PARAMS[i % len(PARAMS)] for i in range(B)]
    st = sampling_tensors(params, B, "cpu")
    target = torch.randn(B, K + 1, V, generator=gen) * 2
    target[:, :, 1] = target[:, :, 2]  # ties
    target[0, :, 3:6] = float("-inf")  # masked tokens
    drafts = torch.randn(B, K, V, generator=gen) * 2 + target[:, :K] * 0.5
    ids = torch.randint(0, V, (B, K), generator=gen)
    ids[:, 0] = target[:, 0].argmax(-1)  # some accepted drafts
    bonus = torch.randint(0, V, (B,), generator=gen)
    filters = dict(
        seeds=torch.randint(0, 2**62, (B,), generator=gen),
        temperature=torch.where(st.is_greedy, 0.0, st.temperature),
        top_k=st.top_k,
        top_p=st.top_p,
        min_p=st.min_p,
    )
    filters = {k: v.to(DEVICE) for k, v in filters.items()}
    target, drafts = target.to(dtype).to(DEVICE), drafts.to(dtype).to(DEVICE)
    ids, bonus = ids.to(DEVICE), bonus.to(DEVICE)
    if not ragged:
        return VerifyBatch.padded(target, bonus, drafts if draft else None, ids, **filters)
    counts = torch.arange(B) % (K + 1)  # 0..K drafts per request
    keep = (torch.arange(K)[None, :] < counts[:, None]).to(DEVICE)
    cu = counts.cumsum(0).to(DEVICE)
    return VerifyBatch.ragged(target[:, :K][keep], bonus, drafts[keep] if draft else None, ids[keep], cu, K, **filters)


@pytest.mark.not_quick  # every fused variant (10 s); the filter kernel stays in the tier
@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kernels_equal_reference(gen, ragged, dtype):
    B, K, V = 6, 3, 96
    for draft in (True, False):
        batch = filtered_batch(gen, B, K, V, dtype, ragged, draft)
        split = small_split(V, B, block_v=32, num_blocks=2)
        assert torch.equal(rejection_triton(batch, split=split), rejection_reference(batch))
        assert torch.equal(block_triton(batch, split=split), block_reference(batch))
    assert torch.equal(typical_triton(batch, 0.09, 0.3, split=split), typical_reference(batch, 0.09, 0.3))


@pytest.mark.parametrize("scratch", [None, 4], ids=["candidates-fit", "scratch-4"])
def test_filter_kernel_finds_the_reference_cut_and_sum(gen, scratch, monkeypatch):
    """Row by row: the kernel's cut keeps the reference's tokens, and its kept sum is the same
    float (a fixed-point sum does not depend on the order it is taken in). The kernel's weights
    may differ from torch's by an ulp (exp implementations), so the cut is compared by rank.
    With a scratch row of 4 entries the searches first pass over whole rows (pivot_search)."""
    if scratch is not None:
        monkeypatch.setattr(sampling_kernels, "SEARCH_SCRATCH", scratch)
    B, K, V = 6, 2, 80
    batch = filtered_batch(gen, B, K, V, torch.float32, False, False)
    x = batch.target.reshape(-1, V).float()
    row_max = x.amax(-1)
    stats = torch.zeros(B, K + 1, 3, device=DEVICE)
    stats[..., 0] = row_max.view(B, K + 1)
    for launch in plan_filter_cuts(batch, batch.target, None, stats, None):
        launch.kernel[launch.grid](**launch.args, num_warps=launch.num_warps, **launch.options)
    rows = torch.arange(B * (K + 1), device=DEVICE) // (K + 1)
    t = batch.temperature.clamp_min(0)[rows]
    e = scaled_exp(x, row_max[:, None], torch.where(t > 0, t, 1.0)[:, None])
    tau, kept = filter_threshold(
        e, e, batch.top_k[rows], batch.top_p[rows], batch.min_p[rows], fast=False, min_p_first=True
    )
    cut, kept_sum = stats[..., 2].reshape(-1), stats[..., 1].reshape(-1)
    n_ref = (e >= tau[:, None]).sum(-1)
    n_kernel = (e >= cut[:, None] * (1 - 1e-6)).sum(-1)  # the kernel's own e at the cut, within an ulp
    assert torch.equal(n_ref, n_kernel)
    # equal up to an ulp of each kept weight (the kernels' exp may differ from torch's by one)
    assert torch.allclose(kept_sum, kept.float() / MASS_SCALE, rtol=2e-6, atol=0)


def test_fused_law_is_vllm_processing(gen):
    """filtered_softmax_reference (what the fused path verifies against) == process_logits (the
    unfused LogitsPipe in vLLM's order, each step renormalised): same support, same values to
    fp32 rounding."""
    N, V = 60, 50
    logits = torch.randn(N, V, generator=gen) * 3
    logits[::7, 4] = logits[::7, 9]  # ties at the cut
    params = [PARAMS[i % len(PARAMS)] for i in range(N)]
    st = sampling_tensors(params, N, "cpu")
    fused = filtered_softmax_reference(
        logits, torch.where(st.is_greedy, 0.0, st.temperature), st.top_k, st.top_p, st.min_p
    )
    unfused = process_logits(logits, params, backend="torch")
    assert torch.equal(fused > 0, unfused > 0)
    assert torch.allclose(fused, unfused, rtol=1e-5, atol=1e-7)


def test_filtered_plan_runs_the_filter_kernel_and_writes_no_probabilities(gen):
    B, K, V = 4, 2, 64
    batch = filtered_batch(gen, B, K, V, torch.float32, False, True)
    launches, _ = plan_verify(batch, REJECTION, None)
    assert [launch.name for launch in launches].count("filter_cut") == 1  # target and draft rows: one launch
    for launch in launches:
        for name, arg in launch.args.items():
            if name == "scratch_ptr":  # the searches' candidates: at most SEARCH_SCRATCH a row, whatever V
                assert arg.shape[-1] <= min(V, sampling_kernels.SEARCH_SCRATCH)
            elif isinstance(arg, torch.Tensor) and name not in ("target_ptr", "draft_ptr", "x_ptr", "d_ptr"):
                assert arg.shape[-1] != V or arg.dim() < 2, f"{launch.name}.{name}: a [.., V] buffer"
