"""PyTorch reference implementations: the samplers' portable path, and what the kernels,
tests and benchmarks compare against.

Both layouts share one core that addresses vocabulary rows through index maps:

* padded (vLLM V0): ``target_with_bonus_probs`` [B, k+1, V], ``draft_probs`` [B, k, V];
* ragged (vLLM V1 and later): ``target_probs`` [T, V] and ``draft_probs`` [T, V] with one row per
  draft token, requests delimited by ``cu_num_draft_tokens`` (inclusive cumulative sum of k_b,
  some k_b may be 0), no bonus rows.

Random numbers are keyed by (request seed, offset, position within the request, vocab index), so
the two layouts give identical tokens on the same data. Everything is vectorised over the batch
(no Python loop over rows, no host synchronisation). Rejection sampling reads gathered scalars
for the accept test and one vocabulary row per request (its first rejected position) for the
recovery, never a [B, k, V] residual.
"""

from __future__ import annotations

import torch

from spec_samplers import rng
from spec_samplers.output import PLACEHOLDER_TOKEN_ID, build_output, num_leading_accepted

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
    """Exponential race: argmax_x weights[x] / E[x] (:func:`spec_samplers.rng.race`), a sample of
    weights / sum(weights). weights, exponentials: [N, V] fp32. Returns [N] int64."""
    return rng.race(weights, exponentials)


# ---------------------------------------------------------------------------------------------
# Layout maps: where each (request, position) reads its vocabulary rows.


def padded_layout(batch_size: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Maps for [B, k+1, V] targets viewed as [B*(k+1), V] and [B, k, V] drafts as [B*k, V].

    Returns (target_rows [B, k+1], draft_rows [B, k], num_draft [B]) int64; target_rows[:, k]
    is the bonus row.
    """
    b = torch.arange(batch_size, device=device, dtype=torch.int64)[:, None]
    target_rows = b * (k + 1) + torch.arange(k + 1, device=device)[None, :]
    draft_rows = b * k + torch.arange(k, device=device)[None, :]
    return target_rows, draft_rows, torch.full((batch_size,), k, dtype=torch.int64, device=device)


def ragged_layout(cu_num_draft_tokens: torch.Tensor, max_spec_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Maps for ragged [T, V] rows. cu_num_draft_tokens: [B] inclusive cumsum of k_b.

    Returns (target_rows [B, K+1], draft_rows [B, K], num_draft [B]) int64 with K = max_spec_len;
    entries past a request's k_b (and every bonus row, which the ragged layout lacks) are -1.
    """
    cu = cu_num_draft_tokens.to(torch.int64)
    num_draft = torch.diff(cu, prepend=torch.zeros(1, dtype=torch.int64, device=cu.device))
    start = cu - num_draft
    pos = torch.arange(max_spec_len + 1, device=cu.device, dtype=torch.int64)[None, :]
    target_rows = torch.where(pos < num_draft[:, None], start[:, None] + pos, -1)
    return target_rows, target_rows[:, :max_spec_len], num_draft


def _gather_rows(flat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """flat [R, V], rows [N] (-1 = none) -> [N, V] fp32, zero where rows == -1."""
    if flat.shape[0] == 0:
        return torch.zeros(rows.shape[0], flat.shape[1], dtype=torch.float32, device=flat.device)
    out = clean_probs(flat[rows.clamp(min=0)])
    return torch.where((rows >= 0)[:, None], out, torch.zeros((), device=flat.device))


def _gather_scalars(flat: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """flat [R, V], rows [B, K] (-1 = none), ids [B, K] in [0, V) -> [B, K] fp32 flat[rows, ids]."""
    if flat.shape[0] == 0:
        return torch.zeros(rows.shape, dtype=torch.float32, device=flat.device)
    vals = clean_probs(flat[rows.clamp(min=0), ids])
    return torch.where(rows >= 0, vals, torch.zeros((), device=flat.device))


# ---------------------------------------------------------------------------------------------
# Rejection sampling.


def _rejection_core(
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

    # Accept test on gathered scalars only.
    q_x = _gather_scalars(target_flat, target_rows[:, :K], drafts)  # [B, K]
    p_x = torch.ones_like(q_x) if draft_flat is None else _gather_scalars(draft_flat, draft_rows, drafts)
    u = rng.accept_uniforms(seeds, offsets, K)  # [B, K]
    # u < q/p rather than u * p < q: q >= p then always accepts (u < 1), subnormal p included
    accepted = draft_valid & (p_x > 0) & (u < q_x / p_x)
    if is_greedy is not None and K > 0:
        target_argmax = torch.argmax(_gather_rows(target_flat, target_rows[:, :K].reshape(-1)), dim=-1).view(B, K)
        accepted = torch.where(is_greedy[:, None], draft_valid & (drafts == target_argmax), accepted)
    num_accepted = num_leading_accepted(accepted)  # [B]

    # One vocabulary row per request: its first rejected position j (j == k_b: the bonus row).
    j = num_accepted
    has_draft = j < num_draft
    jd = j.clamp(max=max(K - 1, 0))
    q_j = _gather_rows(target_flat, target_rows[rows, j])  # [B, V]
    if K == 0:
        residual = q_j
    elif draft_flat is None:
        x_j = drafts[rows, jd]
        remove = has_draft & draft_valid[rows, jd]
        residual = q_j.clone()
        residual[rows, x_j] = torch.where(remove, torch.zeros_like(q_j[:, 0]), q_j[rows, x_j])
    else:
        # An out-of-range draft was never a sample of p: recover from q, not (q - p)+.
        p_row = torch.where(has_draft & draft_valid[rows, jd], draft_rows[rows, jd], -1)
        residual = (q_j - _gather_rows(draft_flat, p_row)).clamp_min(0)
    no_mass = residual.sum(dim=-1) <= RESIDUAL_MASS_EPS
    residual = torch.where(no_mass[:, None], q_j, residual)
    recovered = rng.recovery_race(residual, seeds, offsets, j)  # race(residual, recover_exponentials(...))
    if is_greedy is not None:
        recovered = torch.where(is_greedy, torch.argmax(q_j, dim=-1), recovered)

    # Bonus: as given when in range; else a sample of the bonus row; else (no bonus row) a placeholder.
    bonus_valid, bonus = _valid_ids(bonus_token_ids, V)
    has_bonus_row = target_rows[rows, j] >= 0
    fallback = torch.where(has_bonus_row, recovered, torch.full_like(recovered, PLACEHOLDER_TOKEN_ID))
    final = torch.where(has_draft, recovered, torch.where(bonus_valid, bonus, fallback))
    return build_output(draft_ids, num_accepted, final)


def rejection_sample_reference(
    target_with_bonus_probs: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
    draft_probs: torch.Tensor | None,  # [B, k, V] or None (point-mass drafts)
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None = None,  # [B] int64, default 0
    is_greedy: torch.Tensor | None = None,  # [B] bool, default all False
) -> torch.Tensor:
    """Lossless rejection sampling, padded layout (SPEC section 3). Returns [B, k+1] int64.

    Accept x_i iff x_i in [0, V), p_i(x_i) > 0 and u_i * p_i(x_i) < q_i(x_i). At the first
    rejected position j, recover z ~ (q_j - p_j)+ by an exponential race (q_j when the residual
    has no mass or x_j is out of range); when all k drafts are accepted, emit the bonus token (or, if it is outside
    [0, V), a sample of q_k). Greedy rows accept x_i iff x_i == argmax q_i and recover argmax q_j.
    """
    B, kp1, V = target_with_bonus_probs.shape
    k = kp1 - 1
    target_rows, draft_rows, num_draft = padded_layout(B, k, target_with_bonus_probs.device)
    return _rejection_core(
        target_with_bonus_probs.reshape(B * kp1, V), target_rows,
        None if draft_probs is None else draft_probs.reshape(B * k, V), draft_rows, num_draft,
        draft_token_ids, bonus_token_ids[:, 0], seeds, offsets, is_greedy,
    )


def _ragged_ids(draft_token_ids: torch.Tensor, draft_rows: torch.Tensor) -> torch.Tensor:
    """[T] flat ids -> [B, K] (0 where a request has no draft at that position)."""
    if draft_token_ids.shape[0] == 0:
        return torch.zeros(draft_rows.shape, dtype=torch.int64, device=draft_rows.device)
    return torch.where(draft_rows >= 0, draft_token_ids.to(torch.int64)[draft_rows.clamp(min=0)], 0)


def rejection_sample_ragged_reference(
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
    """Rejection sampling, ragged layout. Returns [B, K+1] int64, -1 padded.

    Same rule and random numbers as :func:`rejection_sample_reference`. The ragged layout has no
    bonus rows, so a bonus id outside [0, V) becomes -1 (a missing token, never a wrong one).
    """
    target_rows, draft_rows, num_draft = ragged_layout(cu_num_draft_tokens, max_spec_len)
    return _rejection_core(
        target_probs, target_rows, draft_probs, draft_rows, num_draft,
        _ragged_ids(draft_token_ids, draft_rows), bonus_token_ids.reshape(-1), seeds, offsets, is_greedy,
    )


# ---------------------------------------------------------------------------------------------
# Logits inputs (the kernels fuse this softmax; here it is spelled out).


def probs_from_logits(
    logits: torch.Tensor,  # [N, V] fp32/fp16/bf16
    temperature: torch.Tensor,  # [N] float, 0 = greedy
) -> torch.Tensor:
    """[N, V] fp32: softmax(logits / T) per row; a row with T == 0 becomes the one-hot of its
    argmax (the greedy token, ties to the lowest index). NaN logits count as -inf; T that is not
    > 0 (other than the greedy 0) is treated as 1."""
    x = logits.to(torch.float32)
    x = torch.where(torch.isnan(x), torch.full((), float("-inf"), device=x.device), x)
    t = torch.where(temperature > 0, temperature.to(torch.float32), torch.ones((), device=x.device))
    probs = torch.softmax(x / t[:, None], dim=-1)
    onehot = torch.nn.functional.one_hot(torch.argmax(x, dim=-1), x.shape[-1]).to(torch.float32)
    return torch.where((temperature == 0)[:, None], onehot, probs)


def _request_of_row(cu_num_draft_tokens: torch.Tensor, num_rows: int) -> torch.Tensor:
    """[T] request index of each ragged row (no host synchronisation)."""
    rows = torch.arange(num_rows, device=cu_num_draft_tokens.device, dtype=torch.int64)
    return torch.searchsorted(cu_num_draft_tokens.to(torch.int64), rows, right=True)


def rejection_sample_from_logits_reference(
    target_logits: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
    draft_logits: torch.Tensor | None,  # [B, k, V] or None (point-mass drafts)
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    temperature: torch.Tensor,  # [B] float, 0 = greedy request
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor | None = None,  # [B] int64
) -> torch.Tensor:
    """Rejection sampling from logits: q = softmax(target_logits / T), p = softmax(draft_logits / T)
    (the request's T for both), requests with T == 0 greedy on argmax of the target logits.
    Returns [B, k+1] int64, the tokens :func:`rejection_sample_reference` gives on those probs."""
    B, kp1, V = target_logits.shape
    t_rows = temperature.repeat_interleave(kp1) if B else temperature
    target = probs_from_logits(target_logits.reshape(B * kp1, V), t_rows).view(B, kp1, V)
    draft = None
    if draft_logits is not None:
        draft = probs_from_logits(draft_logits.reshape(-1, V), temperature.repeat_interleave(kp1 - 1)).view(B, kp1 - 1, V)
    return rejection_sample_reference(target, bonus_token_ids, draft, draft_token_ids, seeds, offsets, temperature == 0)


def rejection_sample_ragged_from_logits_reference(
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
    """Ragged twin of :func:`rejection_sample_from_logits_reference`. Returns [B, K+1] int64."""
    row_t = temperature[_request_of_row(cu_num_draft_tokens, target_logits.shape[0]).clamp(max=max(temperature.shape[0] - 1, 0))]
    target = probs_from_logits(target_logits, row_t)
    draft = None if draft_logits is None else probs_from_logits(draft_logits, row_t)
    return rejection_sample_ragged_reference(
        target, bonus_token_ids, draft, draft_token_ids, cu_num_draft_tokens, max_spec_len, seeds, offsets, temperature == 0,
    )


# ---------------------------------------------------------------------------------------------
# Typical acceptance.


def _typical_core(
    target_flat: torch.Tensor,  # [R, V]
    target_rows: torch.Tensor,  # [B, K+1] int64, -1 = none
    num_draft: torch.Tensor,  # [B] int64
    draft_ids: torch.Tensor,  # [B, K]
    bonus_token_ids: torch.Tensor,  # [B]
    posterior_threshold: float,
    posterior_alpha: float,
) -> torch.Tensor:
    B, K = draft_ids.shape
    V = target_flat.shape[1]
    device = target_flat.device
    in_request = torch.arange(K, device=device)[None, :] < num_draft[:, None]
    draft_valid, drafts = _valid_ids(draft_ids, V)
    draft_valid = draft_valid & in_request
    accepted = torch.zeros((B, K), dtype=torch.bool, device=device)
    argmaxes = []
    # One position at a time keeps the fp32 copy at [B, V] instead of upcasting [B, K+1, V].
    for i in range(K + 1):
        q_i = _gather_rows(target_flat, target_rows[:, i])  # [B, V]
        argmaxes.append(torch.argmax(q_i, dim=-1))
        if i == K:
            break
        entropy = -(q_i * torch.log(q_i + ENTROPY_EPS)).sum(dim=-1)
        threshold = torch.clamp(posterior_alpha * torch.exp(-entropy), max=posterior_threshold)
        candidate = q_i.gather(1, drafts[:, i : i + 1]).squeeze(1)
        accepted[:, i] = draft_valid[:, i] & (candidate > threshold)
    num_accepted = num_leading_accepted(accepted)
    rows = torch.arange(B, device=device)
    recovered = torch.stack(argmaxes, dim=1)[rows, num_accepted]
    bonus_valid, bonus = _valid_ids(bonus_token_ids, V)
    has_bonus_row = target_rows[rows, num_accepted] >= 0
    fallback = torch.where(has_bonus_row, recovered, torch.full_like(recovered, PLACEHOLDER_TOKEN_ID))
    final = torch.where(num_accepted < num_draft, recovered, torch.where(bonus_valid, bonus, fallback))
    return build_output(draft_ids, num_accepted, final)


def typical_accept_reference(
    target_with_bonus_probs: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
    draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    posterior_threshold: float,
    posterior_alpha: float,
) -> torch.Tensor:
    """Typical acceptance (Medusa section 3.3.1, vLLM V0 semantics), padded layout.
    Returns [B, k+1] int64.

    Accept x_i iff q_i(x_i) > min(posterior_threshold, posterior_alpha * exp(-H_i)) with
    H_i = -sum_x q_i(x) log(q_i(x) + 1e-5); recover argmax q_j at the first rejection. A bonus id
    outside [0, V) is replaced by argmax q_k.
    """
    B, kp1, V = target_with_bonus_probs.shape
    k = kp1 - 1
    target_rows, _, num_draft = padded_layout(B, k, target_with_bonus_probs.device)
    return _typical_core(
        target_with_bonus_probs.reshape(B * kp1, V), target_rows, num_draft, draft_token_ids,
        bonus_token_ids[:, 0], posterior_threshold, posterior_alpha,
    )


def typical_accept_ragged_reference(
    target_probs: torch.Tensor,  # [T, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B] int32/int64
    draft_token_ids: torch.Tensor,  # [T] int32/int64
    cu_num_draft_tokens: torch.Tensor,  # [B] inclusive cumsum of k_b
    max_spec_len: int,  # K
    posterior_threshold: float,
    posterior_alpha: float,
) -> torch.Tensor:
    """Typical acceptance, ragged layout. Returns [B, K+1] int64, -1 padded (an out-of-range
    bonus id becomes -1: the ragged layout has no bonus rows)."""
    target_rows, draft_rows, num_draft = ragged_layout(cu_num_draft_tokens, max_spec_len)
    return _typical_core(
        target_probs, target_rows, num_draft, _ragged_ids(draft_token_ids, draft_rows),
        bonus_token_ids.reshape(-1), posterior_threshold, posterior_alpha,
    )


def typical_accept_from_logits_reference(
    target_logits: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
    bonus_token_ids: torch.Tensor,  # [B, 1]
    draft_token_ids: torch.Tensor,  # [B, k]
    temperature: torch.Tensor,  # [B] float, 0 = greedy request (q one-hot at the argmax)
    posterior_threshold: float,
    posterior_alpha: float,
) -> torch.Tensor:
    """Typical acceptance on q = softmax(target_logits / T) (:func:`probs_from_logits`).
    Returns [B, k+1] int64."""
    B, kp1, V = target_logits.shape
    t_rows = temperature.repeat_interleave(kp1) if B else temperature
    target = probs_from_logits(target_logits.reshape(B * kp1, V), t_rows).view(B, kp1, V)
    return typical_accept_reference(target, bonus_token_ids, draft_token_ids, posterior_threshold, posterior_alpha)


def typical_accept_ragged_from_logits_reference(
    target_logits: torch.Tensor,  # [T, V]
    bonus_token_ids: torch.Tensor,  # [B]
    draft_token_ids: torch.Tensor,  # [T]
    cu_num_draft_tokens: torch.Tensor,  # [B]
    max_spec_len: int,  # K
    temperature: torch.Tensor,  # [B] float, 0 = greedy request
    posterior_threshold: float,
    posterior_alpha: float,
) -> torch.Tensor:
    """Ragged twin of :func:`typical_accept_from_logits_reference`. Returns [B, K+1] int64."""
    row_t = temperature[_request_of_row(cu_num_draft_tokens, target_logits.shape[0]).clamp(max=max(temperature.shape[0] - 1, 0))]
    return typical_accept_ragged_reference(
        probs_from_logits(target_logits, row_t), bonus_token_ids, draft_token_ids, cu_num_draft_tokens, max_spec_len,
        posterior_threshold, posterior_alpha,
    )
