"""The output layout every sampler returns: accepted drafts, one more token, then -1."""

from __future__ import annotations

import torch

from spec_samplers.constants import PLACEHOLDER_TOKEN_ID

__all__ = ["PLACEHOLDER_TOKEN_ID", "build_output", "num_leading_accepted"]


def num_leading_accepted(accepted: torch.Tensor) -> torch.Tensor:
    """accepted: [B, k] bool. Returns [B] int64, the length of each row's accepted prefix."""
    return accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)


def build_output(
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    num_accepted: torch.Tensor,  # [B] int64 in [0, k]
    final_token_ids: torch.Tensor,  # [B] int64: recovered token, or bonus when num_accepted == k
) -> torch.Tensor:
    """[B, k+1] int64: drafts [0, n), final token at n, PLACEHOLDER_TOKEN_ID after."""
    B, k = draft_token_ids.shape
    pos = torch.arange(k + 1, device=draft_token_ids.device)[None, :]
    n = num_accepted[:, None]
    drafts = torch.nn.functional.pad(draft_token_ids.to(torch.int64), (0, 1), value=PLACEHOLDER_TOKEN_ID)
    out = torch.where(pos < n, drafts, torch.full_like(drafts, PLACEHOLDER_TOKEN_ID))
    return torch.where(pos == n, final_token_ids.to(torch.int64)[:, None], out)
