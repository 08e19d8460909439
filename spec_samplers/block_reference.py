"""PyTorch reference of block verification (Sun et al. 2024, "Block Verification Accelerates
Speculative Decoding", Algorithm 2): the BlockVerificationSampler's portable path and what its
kernels are compared against, token for token.

Notation (0-indexed, q = target, p = draft, as in the rest of the package): request b has k_b
drafts x_0 .. x_{k_b-1}; q_i, p_i are the distributions at position i (q_{k_b} is the bonus row).

* running ratio of the prefix of length m: rho_0 = 1, rho_{m+1} = min(rho_m q_m(x_m) / p_m(x_m), 1)
  (0 once a draft is out of range or has p_m(x_m) = 0: such a token was never a sample of p);
* residual mass at position m: Z_m = sum_x (rho_m q_m(x) - p_m(x))+ (for point-mass drafts the
  closed form rho_m (1 - q_m(x_m)));
* threshold of "the block may end after m drafts", m = 1 .. k_b:
  h_m = Z_m / (Z_m + 1 - rho_m) (1 when rho_m = 1) if position m has a valid draft, else rho_m
  (the last position, m = k_b, and a position whose draft is out of range end the block);
* accepted length tau = the largest m with u_m < h_m (0 if none): a later position can rescue an
  earlier failure, unlike token-wise rejection;
* emitted token at tau: a sample of (rho_tau q_tau - p_tau)+ normalised if position tau has a
  valid draft (q_tau if that residual has no mass), q_tau if its draft is out of range, the
  bonus token if tau = k_b.

The output is lossless for the whole block (the emitted prefix, completed by the target, has the
target's joint law) and its expected accepted length is at least token-wise rejection's on the
same inputs (the paper's Theorems 1-2; tests/test_block_verification.py checks both).

Random numbers are the rejection sampler's (SPEC section 4): u_m is the accept uniform of
position m - 1, the race at tau uses the recovery exponentials of position tau. Greedy rows use
the rejection sampler's argmax rule. Vectorised over the batch; the Python loops run over the
k positions.
"""

from __future__ import annotations

import torch

from spec_samplers import counter_rng
from spec_samplers.output import PLACEHOLDER_TOKEN_ID, build_output, num_leading_accepted
from spec_samplers.reference import (
    RESIDUAL_MASS_EPS,
    _gather_rows,
    _gather_scalars,
    _ragged_ids,
    _request_of_row,
    _valid_ids,
    padded_layout,
    probs_from_logits,
    race,
    ragged_layout,
)


def running_ratios(ratio: torch.Tensor) -> torch.Tensor:
    """ratio: [B, K] fp32 per-position q(x)/p(x) (0 for drafts that end the block).

    Returns rho [B, K+1] fp32: rho[:, 0] = 1, rho[:, m+1] = min(rho[:, m] * ratio[:, m], 1)
    (0 once rho reached 0, so 0 * inf never makes a NaN). The kernels evaluate the same
    operations in the same order."""
    B, K = ratio.shape
    rho = [torch.ones(B, dtype=torch.float32, device=ratio.device)]
    for m in range(K):
        prev = rho[-1]
        nxt = torch.minimum(prev * ratio[:, m], torch.ones((), device=ratio.device))
        rho.append(torch.where(prev > 0, nxt, torch.zeros((), device=ratio.device)))
    return torch.stack(rho, dim=1)


def block_thresholds(mass: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """h = Z / (Z + (1 - rho)), 1 where rho >= 1 (then Z / Z or 0 / 0). Elementwise fp32."""
    full = rho >= 1.0
    one = torch.ones((), device=rho.device)
    return torch.where(full, one, mass / torch.where(full, one, mass + (1.0 - rho)))


def _block_core(
    target_flat: torch.Tensor,  # [R, V] fp32/fp16/bf16
    target_rows: torch.Tensor,  # [B, K+1] int64 row of (request, position), -1 = none
    draft_flat: torch.Tensor | None,  # [R', V] or None (point-mass drafts)
    draft_rows: torch.Tensor,  # [B, K] int64
    num_draft: torch.Tensor,  # [B] int64, k_b <= K
    draft_ids: torch.Tensor,  # [B, K] int (entries past k_b ignored)
    bonus_token_ids: torch.Tensor,  # [B] int
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None,  # [B] int64
    is_greedy: torch.Tensor | None,  # [B] bool
) -> torch.Tensor:
    B, K = draft_ids.shape
    V = target_flat.shape[1]
    device = target_flat.device
    if offsets is None:
        offsets = torch.zeros(B, dtype=torch.int64, device=device)
    rows = torch.arange(B, device=device)
    in_request = torch.arange(K, device=device)[None, :] < num_draft[:, None]  # [B, K]
    draft_valid, drafts = _valid_ids(draft_ids, V)
    draft_valid = draft_valid & in_request

    # Running ratios from gathered scalars.
    q_x = _gather_scalars(target_flat, target_rows[:, :K], drafts)  # [B, K]
    p_x = torch.ones_like(q_x) if draft_flat is None else _gather_scalars(draft_flat, draft_rows, drafts)
    ok = draft_valid & (p_x > 0)
    ratio = torch.where(ok, q_x / torch.where(ok, p_x, torch.ones_like(p_x)), torch.zeros_like(q_x))
    rho = running_ratios(ratio)  # [B, K+1]

    # Residual masses Z_m at positions with a valid draft (one vocabulary row per position for
    # full drafts; a closed form for point-mass drafts), thresholds h_m for m = 1..K.
    if draft_flat is None:
        mass = (rho[:, :K] * (1.0 - q_x)).clamp_min(0.0)  # [B, K]
    else:
        masses = []
        for m in range(K):
            q_m = _gather_rows(target_flat, target_rows[:, m])  # [B, V]
            p_m = _gather_rows(draft_flat, draft_rows[:, m])
            masses.append((rho[:, m, None] * q_m - p_m).clamp_min(0.0).sum(dim=-1))
        mass = torch.stack(masses, dim=1) if K else torch.zeros((B, 0), device=device)
    h = torch.where(draft_valid, block_thresholds(mass, rho[:, :K]), rho[:, :K])  # position m's h at [:, m]
    h = torch.cat([h[:, 1:], rho[:, K:]], dim=1)  # [B, K]: entry m-1 holds h_m
    u = counter_rng.accept_uniforms(seeds, offsets, K)  # [B, K]: entry m-1 tests h_m
    m_idx = torch.arange(1, K + 1, device=device)[None, :]
    stop = (u < h) & (m_idx <= num_draft[:, None])
    tau = torch.where(stop, m_idx, torch.zeros_like(m_idx)).amax(dim=1) if K else torch.zeros(B, dtype=torch.int64, device=device)
    if is_greedy is not None and K > 0:
        target_argmax = torch.argmax(_gather_rows(target_flat, target_rows[:, :K].reshape(-1)), dim=-1).view(B, K)
        greedy_len = num_leading_accepted(draft_valid & (drafts == target_argmax))
        tau = torch.where(is_greedy, greedy_len, tau)

    # One vocabulary row per request for the emitted token: position tau.
    j = tau
    has_draft = j < num_draft
    jd = j.clamp(max=max(K - 1, 0))
    q_j = _gather_rows(target_flat, target_rows[rows, j])  # [B, V]
    rho_j = rho[rows, j]
    resid = has_draft & draft_valid[rows, jd] if K else torch.zeros(B, dtype=torch.bool, device=device)
    if K == 0:
        residual = q_j
    elif draft_flat is None:
        scaled = rho_j[:, None] * q_j
        x_j = drafts[rows, jd]
        at_x = (scaled[rows, x_j] - 1.0).clamp_min(0.0)
        scaled[rows, x_j] = at_x
        residual = torch.where(resid[:, None], scaled, q_j)
    else:
        p_j = _gather_rows(draft_flat, torch.where(resid, draft_rows[rows, jd], -1))
        residual = torch.where(resid[:, None], (rho_j[:, None] * q_j - p_j).clamp_min(0.0), q_j)
    no_mass = residual.sum(dim=-1) <= RESIDUAL_MASS_EPS
    residual = torch.where(no_mass[:, None], q_j, residual)
    recovered = race(residual, counter_rng.recover_exponentials(seeds, offsets, j, V))
    if is_greedy is not None:
        recovered = torch.where(is_greedy, torch.argmax(q_j, dim=-1), recovered)

    bonus_valid, bonus = _valid_ids(bonus_token_ids, V)
    has_bonus_row = target_rows[rows, j] >= 0
    fallback = torch.where(has_bonus_row, recovered, torch.full_like(recovered, PLACEHOLDER_TOKEN_ID))
    final = torch.where(has_draft, recovered, torch.where(bonus_valid, bonus, fallback))
    return build_output(draft_ids, j, final)


def block_verify_reference(
    target_with_bonus_probs: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
    draft_probs: torch.Tensor | None,  # [B, k, V] or None (point-mass drafts)
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None = None,  # [B] int64, default 0
    is_greedy: torch.Tensor | None = None,  # [B] bool, default all False
) -> torch.Tensor:
    """Block verification, padded layout. Returns [B, k+1] int64, -1 padded.

    Example::

        >>> B, k, V = 2, 3, 8
        >>> target = torch.softmax(torch.randn(B, k + 1, V), -1)
        >>> draft = torch.softmax(torch.randn(B, k, V), -1)
        >>> ids = torch.multinomial(draft.view(-1, V), 1).view(B, k)
        >>> out = block_verify_reference(target, ids[:, :1], draft, ids, torch.arange(B))
    """
    B, kp1, V = target_with_bonus_probs.shape
    k = kp1 - 1
    target_rows, draft_rows, num_draft = padded_layout(B, k, target_with_bonus_probs.device)
    return _block_core(
        target_with_bonus_probs.reshape(B * kp1, V), target_rows,
        None if draft_probs is None else draft_probs.reshape(B * k, V), draft_rows, num_draft,
        draft_token_ids, bonus_token_ids[:, 0], seeds, offsets, is_greedy,
    )


def block_verify_ragged_reference(
    target_probs: torch.Tensor,  # [T, V] fp32/fp16/bf16: row t scores draft token t
    bonus_token_ids: torch.Tensor,  # [B] int32/int64
    draft_probs: torch.Tensor | None,  # [T, V] or None (point-mass drafts)
    draft_token_ids: torch.Tensor,  # [T] int32/int64
    cu_num_draft_tokens: torch.Tensor,  # [B] int32/int64, inclusive cumsum of k_b
    max_spec_len: int,  # K = max k_b: fixes the output width
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None = None,  # [B] int64
    is_greedy: torch.Tensor | None = None,  # [B] bool
) -> torch.Tensor:
    """Block verification, ragged layout. Returns [B, K+1] int64, -1 padded (an out-of-range
    bonus id becomes -1: the ragged layout has no bonus rows)."""
    target_rows, draft_rows, num_draft = ragged_layout(cu_num_draft_tokens, max_spec_len)
    return _block_core(
        target_probs, target_rows, draft_probs, draft_rows, num_draft,
        _ragged_ids(draft_token_ids, draft_rows), bonus_token_ids.reshape(-1), seeds, offsets, is_greedy,
    )


def block_verify_from_logits_reference(
    target_logits: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
    draft_logits: torch.Tensor | None,  # [B, k, V] or None (point-mass drafts)
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    temperature: torch.Tensor,  # [B] float, 0 = greedy request
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None = None,  # [B] int64
) -> torch.Tensor:
    """Block verification on q = softmax(target_logits / T), p = softmax(draft_logits / T);
    requests with T == 0 are greedy. Returns [B, k+1] int64."""
    B, kp1, V = target_logits.shape
    t_rows = temperature.repeat_interleave(kp1) if B else temperature
    target = probs_from_logits(target_logits.reshape(B * kp1, V), t_rows).view(B, kp1, V)
    draft = None
    if draft_logits is not None:
        draft = probs_from_logits(draft_logits.reshape(-1, V), temperature.repeat_interleave(kp1 - 1)).view(B, kp1 - 1, V)
    return block_verify_reference(target, bonus_token_ids, draft, draft_token_ids, seeds, offsets, temperature == 0)


def block_verify_ragged_from_logits_reference(
    target_logits: torch.Tensor,  # [T, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B] int32/int64
    draft_logits: torch.Tensor | None,  # [T, V] or None
    draft_token_ids: torch.Tensor,  # [T] int32/int64
    cu_num_draft_tokens: torch.Tensor,  # [B] inclusive cumsum of k_b
    max_spec_len: int,  # K
    temperature: torch.Tensor,  # [B] float, 0 = greedy request
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None = None,  # [B] int64
) -> torch.Tensor:
    """Ragged twin of :func:`block_verify_from_logits_reference`. Returns [B, K+1] int64."""
    row_t = temperature[_request_of_row(cu_num_draft_tokens, target_logits.shape[0]).clamp(max=max(temperature.shape[0] - 1, 0))]
    target = probs_from_logits(target_logits, row_t)
    draft = None if draft_logits is None else probs_from_logits(draft_logits, row_t)
    return block_verify_ragged_reference(
        target, bonus_token_ids, draft, draft_token_ids, cu_num_draft_tokens, max_spec_len, seeds, offsets, temperature == 0,
    )
