"""Random verification inputs shared by the kernel tests and ``benchmarks/gpu_check.py``: one
factory, so the GPU check exercises the cases the CPU tests do (padded and ragged views of the
same data, probabilities and the logits they came from)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Case:
    target: torch.Tensor  # [B, K+1, V] padded (row K = bonus row)
    draft: torch.Tensor  # [B, K, V]
    draft_ids: torch.Tensor  # [B, K] int64
    bonus: torch.Tensor  # [B, 1] int64
    seeds: torch.Tensor  # [B] int64
    offsets: torch.Tensor  # [B] int64
    is_greedy: torch.Tensor  # [B] bool
    target_logits: torch.Tensor  # [B, K+1, V] fp32 (target = softmax(target_logits / T))
    draft_logits: torch.Tensor  # [B, K, V] fp32
    temperature: torch.Tensor  # [B] fp32, 0 on greedy rows


def make_case(
    B: int,
    K: int,
    V: int,
    seed: int,
    *,
    dtype: torch.dtype = torch.float32,
    greedy: str = "mixed",
    closeness: float = 0.5,
    bad_ids: bool = False,
    zero_mass: bool = False,
    worst_case: bool = False,
    device: str | torch.device = "cpu",
) -> Case:
    """Random inputs of one verification call, built on ``device`` from ``seed``.

    ``closeness`` scales the draft's logit noise: small means a draft close to the target and
    long accepted prefixes. ``bad_ids`` puts out-of-range draft and bonus ids in some rows.
    ``zero_mass`` makes some rows' draft equal to the target with drafts where both are 0, so
    the rejected position's residual has no mass. ``worst_case`` (timings) makes position 0's
    draft a zero-probability token in every request, so every request reads its vocabulary rows."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g, device=device)

    temperature = rand(B) * 1.5 + 0.5
    target_logits = randn(B, K + 1, V) * 2.0
    draft_logits = target_logits[:, :K] + closeness * randn(B, K, V)
    target = torch.softmax(target_logits / temperature[:, None, None], -1)
    draft = torch.softmax(draft_logits / temperature[:, None, None], -1)
    if K:
        draft_ids = torch.multinomial(draft.reshape(-1, V), 1, generator=g).view(B, K)
    else:
        draft_ids = torch.zeros(B, 0, dtype=torch.int64, device=device)
    bonus = torch.randint(0, V, (B, 1), generator=g, device=device)
    if worst_case and K:
        target[:, :, 0] = 0.0
        target = target / target.sum(-1, keepdim=True)
        draft_ids[:, 0] = 0
    if zero_mass and K:
        rows = torch.arange(B, device=device) % 2 == 0
        pos = torch.randint(0, K, (B,), generator=g, device=device)
        target[rows, :, 0] = 0.0  # token 0: zero probability under target and draft
        target = target / target.sum(-1, keepdim=True)
        draft[rows] = target[rows, :K]
        draft_ids[rows, pos[rows]] = 0
    if bad_ids and K:
        rows = torch.arange(0, B, 3, device=device)
        pos = torch.randint(0, K, (rows.numel(),), generator=g, device=device)
        draft_ids[rows, pos] = torch.tensor([V, V + 7, -1, -100], device=device).repeat(B)[: rows.numel()]
    if bad_ids:
        bonus[1::4, 0] = V
        bonus[3::4, 0] = -1
    if greedy == "all":
        is_greedy = torch.ones(B, dtype=torch.bool, device=device)
    elif greedy == "mixed":
        is_greedy = rand(B) < 0.4
    else:
        is_greedy = torch.zeros(B, dtype=torch.bool, device=device)
    temperature = torch.where(is_greedy, torch.zeros_like(temperature), temperature)
    if K:  # greedy requests draft greedily, so some drafts match the target's argmax
        greedy_ids = draft_logits.argmax(-1)
        keep = (draft_ids < 0) | (draft_ids >= V)  # keep the planted bad ids
        draft_ids = torch.where(is_greedy[:, None] & ~keep, greedy_ids, draft_ids)
    seeds = torch.randint(-(2**62), 2**62, (B,), generator=g, device=device)
    offsets = torch.randint(0, 2**40, (B,), generator=g, device=device)
    return Case(
        target.to(dtype),
        draft.to(dtype),
        draft_ids,
        bonus,
        seeds,
        offsets,
        is_greedy,
        target_logits,
        draft_logits,
        temperature,
    )


def ragged_view(
    target: torch.Tensor,  # [B, K+1, V]
    draft: torch.Tensor,  # [B, K, V]
    draft_ids: torch.Tensor,  # [B, K]
    k_per_request: torch.Tensor,  # [B] int64, k_b <= K
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop the bonus rows and keep the first k_b positions of each request.

    Returns (target_probs [T, V], draft_probs [T, V], draft_token_ids [T], cu_num_draft_tokens [B])."""
    B, K = draft_ids.shape
    keep = torch.arange(K, device=draft_ids.device)[None, :] < k_per_request[:, None]  # [B, K]
    return target[:, :K][keep], draft[keep], draft_ids[keep], torch.cumsum(k_per_request, 0)
