"""vLLM's sampling-parameter processing spelled out step by step in float64: the independent
reference the SamplingParams tests compare against (tests only; the package's own definition is
spec_samplers.sampling.reference.filtered_softmax_reference)."""

from __future__ import annotations

import torch

from spec_samplers import SamplingParams


def reference_row(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """One row, step by step as vLLM describes it, in float64."""
    x = logits.double()
    if p.is_greedy:
        out = torch.zeros_like(x)
        out[int(torch.argmax(x))] = 1
        return out
    probs = torch.softmax(x / p.temperature, -1)
    if p.min_p > 0:
        probs = torch.where(probs >= p.min_p * probs.max(), probs, 0)
        probs = probs / probs.sum()
    if p.top_k > 0:
        kth = sorted(probs.tolist(), reverse=True)[min(p.top_k, len(probs)) - 1]
        probs = torch.where(probs >= kth, probs, 0)
        probs = probs / probs.sum()
    if p.top_p < 1:
        keep = torch.tensor([float(probs[probs > v].sum()) < p.top_p for v in probs.tolist()])
        probs = torch.where(keep, probs, 0)
        probs = probs / probs.sum()
    return probs


def processed_rows(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """[..., V] -> [..., V] float64, :func:`reference_row` on every row."""
    flat = logits.reshape(-1, logits.shape[-1])
    return torch.stack([reference_row(x, p) for x in flat]).view(logits.shape)
