"""PyTorch reference implementations: the samplers' portable path, and what the kernels,
tests and benchmarks compare against.

Everything is vectorised over the batch (no Python loop over rows, no host synchronisation).
Rejection sampling reads only gathered scalars for the accept test and one [B, V] row per
sequence (the first rejected position) for the recovery, never a [B, k, V] residual.
"""

from __future__ import annotations

import torch

from spec_samplers import counter_rng
from spec_samplers.output import build_output, num_leading_accepted

#: a residual (q - p)+ whose mass is at most this is rounding noise: recover from q instead
RESIDUAL_MASS_EPS = 1e-6
#: Medusa's and vLLM V0's epsilon inside the entropy's log
ENTROPY_EPS = 1e-5


def clean_probs(x: torch.Tensor) -> torch.Tensor:
    """fp32 copy of x with NaN, Inf and negative entries set to 0 (non-strict safety)."""
    x = x.to(torch.float32)
    return torch.where(torch.isfinite(x) & (x > 0), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _valid_ids(ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(in-range mask, ids clamped into [0, V) as int64) so gathers never read out of bounds."""
    ids = ids.to(torch.int64)
    return (ids >= 0) & (ids < vocab_size), ids.clamp(0, vocab_size - 1)


def race(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """Exponential race: argmax_x weights[x] / E[x], a sample of weights / sum(weights).

    weights, exponentials: [N, V] fp32 (exponentials > 0). Ties go to the lowest index.
    Returns [N] int64.
    """
    return torch.argmax(weights / exponentials, dim=-1)


def rejection_sample_reference(
    target_with_bonus_probs: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
    draft_probs: torch.Tensor | None,  # [B, k, V] or None (point-mass drafts)
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None = None,  # [B] int64, default 0
    is_greedy: torch.Tensor | None = None,  # [B] bool, default all False
) -> torch.Tensor:
    """Lossless rejection sampling (SPEC section 3). Returns [B, k+1] int64.

    Accept x_i iff x_i in [0, V), p_i(x_i) > 0 and u_i * p_i(x_i) < q_i(x_i). At the first
    rejected position j, recover z ~ (q_j - p_j)+ by an exponential race (q_j when the residual
    has no mass); when all k drafts are accepted, emit the bonus token (or, if it is outside
    [0, V), a sample of q_k). Greedy rows accept x_i iff x_i == argmax q_i and recover argmax q_j.
    """
    B, kp1, V = target_with_bonus_probs.shape
    k = kp1 - 1
    device = target_with_bonus_probs.device
    if offsets is None:
        offsets = torch.zeros(B, dtype=torch.int64, device=device)
    rows = torch.arange(B, device=device)
    draft_valid, drafts = _valid_ids(draft_token_ids, V)

    # Accept test on gathered scalars only.
    q_x = clean_probs(target_with_bonus_probs[:, :k].gather(2, drafts[:, :, None]).squeeze(2))  # [B, k]
    if draft_probs is None:
        p_x = torch.ones_like(q_x)
    else:
        p_x = clean_probs(draft_probs.gather(2, drafts[:, :, None]).squeeze(2))  # [B, k]
    u = counter_rng.accept_uniforms(seeds, offsets, k)  # [B, k]
    accepted = draft_valid & (p_x > 0) & (u * p_x < q_x)
    if is_greedy is not None:
        target_argmax = torch.argmax(clean_probs(target_with_bonus_probs[:, :k]), dim=-1)  # [B, k]
        accepted = torch.where(is_greedy[:, None], draft_valid & (drafts == target_argmax), accepted)
    num_accepted = num_leading_accepted(accepted)  # [B]

    # One vocabulary row per sequence: the first rejected position j (j == k: the bonus row).
    j = num_accepted
    q_j = clean_probs(target_with_bonus_probs[rows, j])  # [B, V]
    has_draft = j < k
    if k == 0:
        residual = q_j
    elif draft_probs is None:
        x_j = drafts[rows, j.clamp(max=k - 1)]
        remove = has_draft & draft_valid[rows, j.clamp(max=k - 1)]
        residual = q_j.clone()
        residual[rows, x_j] = torch.where(remove, torch.zeros_like(q_j[:, 0]), q_j[rows, x_j])
    else:
        p_j = clean_probs(draft_probs[rows, j.clamp(max=k - 1)])
        residual = torch.where(has_draft[:, None], (q_j - p_j).clamp_min(0), q_j)
    no_mass = residual.sum(dim=-1) <= RESIDUAL_MASS_EPS
    residual = torch.where(no_mass[:, None], q_j, residual)
    exps = counter_rng.recover_exponentials(seeds, offsets, j, V)
    recovered = race(residual, exps)
    if is_greedy is not None:
        recovered = torch.where(is_greedy, torch.argmax(q_j, dim=-1), recovered)

    bonus_valid, bonus = _valid_ids(bonus_token_ids[:, 0], V)
    final = torch.where(has_draft | ~bonus_valid, recovered, bonus)
    return build_output(draft_token_ids, num_accepted, final)


def typical_accept_reference(
    target_with_bonus_probs: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    posterior_threshold: float,
    posterior_alpha: float,
) -> torch.Tensor:
    """Typical acceptance (Medusa section 3.3.1, vLLM V0 semantics). Returns [B, k+1] int64.

    Accept x_i iff q_i(x_i) > min(posterior_threshold, posterior_alpha * exp(-H_i)) with
    H_i = -sum_x q_i(x) log(q_i(x) + 1e-5); recover argmax q_j at the first rejection. A bonus id
    outside [0, V) is replaced by argmax q_k.
    """
    B, kp1, V = target_with_bonus_probs.shape
    k = kp1 - 1
    draft_valid, drafts = _valid_ids(draft_token_ids, V)
    accepted = torch.zeros((B, k), dtype=torch.bool, device=target_with_bonus_probs.device)
    argmaxes = []
    # One position at a time keeps the fp32 copy at [B, V] instead of upcasting [B, k+1, V].
    for i in range(kp1):
        q_i = clean_probs(target_with_bonus_probs[:, i])  # [B, V]
        argmaxes.append(torch.argmax(q_i, dim=-1))
        if i == k:
            break
        entropy = -(q_i * torch.log(q_i + ENTROPY_EPS)).sum(dim=-1)
        threshold = torch.clamp(posterior_alpha * torch.exp(-entropy), max=posterior_threshold)
        candidate = q_i.gather(1, drafts[:, i : i + 1]).squeeze(1)
        accepted[:, i] = draft_valid[:, i] & (candidate > threshold)
    num_accepted = num_leading_accepted(accepted)
    target_argmax = torch.stack(argmaxes, dim=1)  # [B, k+1]
    recovered = target_argmax.gather(1, num_accepted[:, None]).squeeze(1)
    bonus_valid, bonus = _valid_ids(bonus_token_ids[:, 0], V)
    final = torch.where((num_accepted < k) | ~bonus_valid, recovered, bonus)
    return build_output(draft_token_ids, num_accepted, final)
