"""PyTorch references: the samplers' portable path, and what the kernels, tests and benchmarks
compare against. One function per sampler, over a :class:`~spec_samplers.layout.VerifyBatch`
(padded or ragged, probabilities or logits).

Rows are addressed through the layout's index maps, so both layouts share one core. Random
numbers are keyed by (request seed, offset, position within the request, vocab index), so the
two layouts give identical tokens on the same data. Everything is vectorised over the batch (no
Python loop over rows, no host synchronisation). Rejection sampling reads gathered scalars for the
accept test and one vocabulary row per request (its first rejected position) for the recovery,
never a [B, k, V] residual.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from spec_samplers import rng
from spec_samplers.constants import (
    ENTROPY_EPS,
    ENTROPY_EPS_FP32,
    PLACEHOLDER_TOKEN_ID,
    RESIDUAL_MASS_EPS,
    fp32_value,
    input_error,
)
from spec_samplers.layout import VerifyBatch
from spec_samplers.output import build_output, num_leading_accepted
from spec_samplers.sampling.reference import filtered_softmax_reference
from spec_samplers.torch_ops import clean_probs, probs_from_logits, valid_ids

__all__ = [
    "ENTROPY_EPS",
    "RESIDUAL_MASS_EPS",
    "block_reference",
    "rejection_reference",
    "typical_reference",
    "flat_inputs",
    "typical_accepts",
    "typical_threshold",
]


def _select_rows(flat: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [N, V] fp32 <- flat[idx] (flat [R, V], R > 0, any float dtype; idx [N] in [0, R))."""
    if flat.dtype == out.dtype:
        return torch.index_select(flat, 0, idx, out=out)
    return out.copy_(flat.index_select(0, idx))


def _row_mask(rows: torch.Tensor) -> torch.Tensor:
    """rows [N] (-1 = none) -> [N, 1] fp32, 1 where present (a multiplier of the same dtype: the
    vectorised kernel)."""
    return (rows >= 0)[:, None].to(torch.float32)


def _clean_rows_(rows: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """rows [N, V] fp32 in place: NaN, Inf and negatives to 0, rows with keep [N, 1] == 0 to 0.
    Three passes (indexing, clean_probs and where took six, the where alone as long as the rest;
    a clamp with an [N, 1] bound, or a where, is not vectorised on the CPU: 15x a pass)."""
    rows.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).clamp_min_(0.0)
    return rows.mul_(keep)


def _gather_rows(flat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """flat [R, V], rows [N] (-1 = none) -> [N, V] fp32, zero where rows == -1."""
    out = torch.empty(rows.shape[0], flat.shape[1], dtype=torch.float32, device=flat.device)
    if flat.shape[0] == 0:
        return out.zero_()
    return _clean_rows_(_select_rows(flat, rows.clamp(min=0), out), _row_mask(rows))


def _residual_(q: torch.Tensor, p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """p [N, V] fp32 (raw draft rows) in place <- (q - clean(p))+ for q [N, V] (clean), where
    clean(p) is p with NaN, Inf and negatives set to 0 and rows with keep [N, 1] == 0 to 0 (the
    residual is q there). Three passes: q - min(max(p, 0), q) is >= 0 (no clamp after), and the
    row mask is folded into the subtraction (q - p * 0 = q)."""
    p.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).clamp_(min=p.new_zeros(()), max=q)
    return torch.addcmul(q, p, keep, value=-1.0, out=p)


class _RecoveryRows:
    """The recovery rows of rejection sampling, never stored whole: q = _gather_rows(target_flat,
    q_rows) and the residual (q - p)+ with p = _gather_rows(draft_flat, p_rows) (p_rows -1: the
    residual is q there).

    One chunked pass (:func:`spec_samplers.rng.row_chunk` rows at a time, through two reused
    chunk buffers: in cache on the CPU, one chunk elsewhere) computes their fp64 race-group sums
    (and argmax q when asked); :meth:`group` then re-reads the chosen group's RACE_GROUP entries
    from the inputs and applies the same elementwise operations, so every value equals the
    unchunked one. Memory traffic: the two rows' reads, no [N, V] write.

    ``sums_q`` only matters where the residual has no mass (:func:`_recover_from`: the fallback
    to q, and "q has mass", which a residual with mass implies). On the CPU it is therefore
    computed after the pass for those rows alone (usually none: a quarter of the pass's time
    saved) and holds ``sums_r`` elsewhere; on other devices both come from the one pass, since
    finding the rows would synchronise with the host."""

    def __init__(
        self,
        target_flat: torch.Tensor,  # [R, V]
        q_rows: torch.Tensor,  # [N] int64, -1 = none
        draft_flat: torch.Tensor,  # [R', V]
        p_rows: torch.Tensor,  # [N] int64, -1 = none
        want_argmax: bool,
    ):
        self.target_flat, self.draft_flat = target_flat, draft_flat
        self.idx_q, self.keep_q = q_rows.clamp(min=0), _row_mask(q_rows)
        self.idx_p, self.keep_p = p_rows.clamp(min=0), _row_mask(p_rows)
        N, V = q_rows.shape[0], target_flat.shape[1]
        device = target_flat.device
        G = rng.race_num_groups(V) if V else 1
        self.sums_r = torch.empty(N, G, dtype=torch.float64, device=device)  # [N, G1] residual
        self.sums_q = torch.empty_like(self.sums_r)  # [N, G1] q
        self.q_argmax = torch.empty(N, dtype=torch.int64, device=device) if want_argmax else None
        step = rng.row_chunk(N, V, device)
        q_buf = torch.empty(min(step, N), V, dtype=torch.float32, device=device)
        res_buf = torch.empty_like(q_buf)
        lazy_q = device.type == "cpu"
        for r in range(0, N, step):
            n = min(step, N - r)
            q_c, res_c = self._rows(slice(r, r + n), q_buf[:n], res_buf[:n])
            rng.group_sums_into(res_c, self.sums_r[r : r + n])
            if not lazy_q:
                rng.group_sums_into(q_c, self.sums_q[r : r + n])
            if self.q_argmax is not None:
                torch.argmax(q_c, dim=-1, out=self.q_argmax[r : r + n])
        if lazy_q:
            self.sums_q.copy_(self.sums_r)
            empty = torch.nonzero(self.sums_r.sum(dim=-1) <= RESIDUAL_MASS_EPS).flatten()  # [N'] rows
            for r in range(0, empty.shape[0], step):
                rows = empty[r : r + step]
                q_c, _ = self._rows(rows, q_buf[: rows.shape[0]], res_buf[: rows.shape[0]])
                self.sums_q[rows] = rng.race_group_sums(q_c)

    def _rows(self, sel: slice | torch.Tensor, q: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, residual) of the rows ``sel`` (a slice or [n] int64 indices), written into q, res
        [n, V] fp32."""
        if self.target_flat.shape[0]:
            _clean_rows_(_select_rows(self.target_flat, self.idx_q[sel], q), self.keep_q[sel])
        else:
            q.zero_()
        if self.draft_flat.shape[0]:
            _residual_(q, _select_rows(self.draft_flat, self.idx_p[sel], res), self.keep_p[sel])
        else:
            res.copy_(q)
        return q, res

    def group(self, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual, q) [N, RACE_GROUP] fp32 entries of group ``group`` ([N] int64) of each row,
        -1 past the vocabulary (:func:`spec_samplers.rng.group_weights` of the whole rows)."""
        V = self.target_flat.shape[1]
        inside = None
        if V % rng.RACE_GROUP or V == 0:  # a partial group: entries past V read V - 1, then -1
            cols = group[:, None] * rng.RACE_GROUP + torch.arange(rng.RACE_GROUP, device=group.device)
            inside = cols < V
            cols = cols.clamp(max=max(V - 1, 0))

        def window(flat: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            if flat.shape[0] == 0:
                return torch.zeros(group.shape[0], rng.RACE_GROUP, dtype=torch.float32, device=group.device)
            if inside is None:  # rows as [R, G1, RACE_GROUP] (a view): one contiguous window each
                return flat.unflatten(1, (V // rng.RACE_GROUP, rng.RACE_GROUP))[idx, group].to(torch.float32)
            return flat[idx[:, None], cols].to(torch.float32)

        q = _clean_rows_(window(self.target_flat, self.idx_q), self.keep_q)
        if self.draft_flat.shape[0]:
            res = _residual_(q, window(self.draft_flat, self.idx_p), self.keep_p)
        else:
            res = q.clone()
        if inside is not None:
            return torch.where(inside, res, -1.0), torch.where(inside, q, -1.0)
        return res, q


def _gather_scalars(flat: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """flat [R, V], rows [B, K] (-1 = none), ids [B, K] in [0, V) -> [B, K] fp32 flat[rows, ids]."""
    if flat.shape[0] == 0:
        return torch.zeros(rows.shape, dtype=torch.float32, device=flat.device)
    vals = clean_probs(flat[rows.clamp(min=0), ids])
    return torch.where(rows >= 0, vals, torch.zeros((), device=flat.device))


def _valid_drafts(draft_ids: torch.Tensor, num_draft: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_ids [B, K], num_draft [B] -> (valid [B, K] bool: id in [0, V) and inside the
    request, ids [B, K] int64 clamped into [0, V))."""
    K = draft_ids.shape[1]
    in_request = torch.arange(K, device=draft_ids.device)[None, :] < num_draft[:, None]
    valid, ids = valid_ids(draft_ids, V)
    return valid & in_request, ids


def _greedy_accepts(
    target_flat: torch.Tensor,  # [R, V]
    target_rows: torch.Tensor,  # [B, K+1] int64, -1 = none
    draft_valid: torch.Tensor,  # [B, K] bool
    drafts: torch.Tensor,  # [B, K] int64 ids clamped into [0, V)
    q_x: torch.Tensor,  # [B, K] fp32 q at the drafts
) -> torch.Tensor:
    """[B, K] bool: the greedy rule's accept test, x_i == argmax q_i, at every position."""
    B, K = drafts.shape
    target_argmax = torch.argmax(_gather_rows(target_flat, target_rows[:, :K].reshape(-1)), dim=-1).view(B, K)
    # q_x > 0: a row without mass has argmax 0, which it does not give probability
    return draft_valid & (drafts == target_argmax) & (q_x > 0)


def _final_tokens(
    recovered: torch.Tensor,  # [B] int64: the token recovered at position j
    has_draft: torch.Tensor,  # [B] bool: position j holds a draft (else: all drafts accepted)
    bonus_token_ids: torch.Tensor,  # [B] int
    has_bonus_row: torch.Tensor,  # [B] bool: the layout has a target row at position j
    V: int,
) -> torch.Tensor:
    """[B] the token after the accepted prefix: the recovered token at a rejection; else the
    bonus as given when in range, else the sampler's token from the bonus row (``recovered``
    there), else (no bonus row) a placeholder."""
    bonus_valid, bonus = valid_ids(bonus_token_ids, V)
    fallback = torch.where(has_bonus_row, recovered, torch.full_like(recovered, PLACEHOLDER_TOKEN_ID))
    return torch.where(has_draft, recovered, torch.where(bonus_valid, bonus, fallback))


def _recover(
    residual: torch.Tensor,  # [B, V] fp32 (unnormalised) distribution to sample at position j
    q_j: torch.Tensor,  # [B, V] fp32 target row at position j
    j: torch.Tensor,  # [B] int64 position
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
    is_greedy: torch.Tensor | None,  # [B] bool
) -> torch.Tensor:
    """[B] a sample of ``residual`` (of q_j where the residual has no mass; argmax q_j on greedy
    rows) by the two-level race of position j (:func:`spec_samplers.rng.two_level_race`); -1
    (no token) where q_j has no mass (:func:`_recover_from`)."""
    sums = rng.race_group_sums(residual), rng.race_group_sums(q_j)
    q_argmax = None if is_greedy is None else torch.argmax(q_j, dim=-1)

    def group_rows(group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rng.group_weights(residual, group), rng.group_weights(q_j, group)

    return _recover_from(sums, group_rows, q_argmax, j, seeds, offsets, is_greedy)


def _recover_from(
    sums: tuple[torch.Tensor, torch.Tensor],  # [B, G1] fp64 group sums of the residual, of q_j
    group_rows: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],  # group -> [B, RACE_GROUP] x 2
    q_argmax: torch.Tensor | None,  # [B] int64 argmax q_j (when is_greedy is given)
    j: torch.Tensor,  # [B] int64 position
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
    is_greedy: torch.Tensor | None,  # [B] bool
) -> torch.Tensor:
    """:func:`_recover` from the group sums and a reader of one group's entries (residual, q_j):
    the residual's mass is the sum of its fp64 race-group sums (the kernels add the same group
    sums), and the fallback to q_j swaps group sums and the one re-read group, never a [B, V] row."""
    sums_r, sums_q = sums
    no_mass = sums_r.sum(dim=-1) <= RESIDUAL_MASS_EPS  # [B]
    e1, e2 = rng.race_exponentials(seeds, offsets, j << 32, sums_r.shape[1], rng.STREAM_RECOVER)
    group = rng.pick_group(torch.where(no_mass[:, None], sums_q, sums_r), e1)
    w_residual, w_q = group_rows(group)
    recovered = group * rng.RACE_GROUP + rng.race(torch.where(no_mass[:, None], w_q, w_residual), e2)
    if is_greedy is not None:
        assert q_argmax is not None
        recovered = torch.where(is_greedy, q_argmax, recovered)
    # A target row without probability mass has no token to give: -1 (no token) there.
    return torch.where(sums_q.sum(dim=-1) > 0, recovered, PLACEHOLDER_TOKEN_ID)


# ---------------------------------------------------------------------------------------------
# Rejection sampling.


def _random_accepts(
    target_flat: torch.Tensor,  # [R, V]
    target_rows: torch.Tensor,  # [B, K+1] int64, -1 = none
    draft_flat: torch.Tensor | None,  # [R', V] or None (point-mass drafts)
    draft_rows: torch.Tensor,  # [B, K] int64
    draft_valid: torch.Tensor,  # [B, K] bool: id in [0, V) and inside the request
    drafts: torch.Tensor,  # [B, K] int64 ids clamped into [0, V)
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
) -> torch.Tensor:
    """[B, K] bool: the random rule's accept test at every position, each tested on its own
    (gathered scalars only)."""
    K = drafts.shape[1]
    q_x = _gather_scalars(target_flat, target_rows[:, :K], drafts)  # [B, K]
    p_x = torch.ones_like(q_x) if draft_flat is None else _gather_scalars(draft_flat, draft_rows, drafts)
    u = rng.accept_uniforms(seeds, offsets, K)  # [B, K]
    # u < q/p rather than u * p < q: q >= p then always accepts (u < 1), subnormal p included
    return draft_valid & (p_x > 0) & (u < q_x / p_x)


def _rejection_core(f: FlatInputs, seeds: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rejection sampling on flat rows; seeds, offsets: [B] int64. Returns [B, K+1] int64."""
    B, K = f.draft_ids.shape
    V = f.target.shape[1]
    rows = torch.arange(B, device=f.target.device)
    draft_valid, drafts = _valid_drafts(f.draft_ids, f.num_draft, V)

    accepted = _random_accepts(f.target, f.target_rows, f.draft, f.draft_rows, draft_valid, drafts, seeds, offsets)
    if f.is_greedy is not None and K > 0:
        q_x = _gather_scalars(f.target, f.target_rows[:, :K], drafts)  # [B, K]
        greedy_accepted = _greedy_accepts(f.target, f.target_rows, draft_valid, drafts, q_x)
        accepted = torch.where(f.is_greedy[:, None], greedy_accepted, accepted)
    num_accepted = num_leading_accepted(accepted)  # [B]

    # One vocabulary row per request: its first rejected position j (j == k_b: the bonus row).
    j = num_accepted
    has_draft = j < f.num_draft
    jd = j.clamp(max=max(K - 1, 0))
    if K > 0 and f.draft is not None:
        # An out-of-range draft was never a sample of p: recover from q, not (q - p)+.
        p_row = torch.where(has_draft & draft_valid[rows, jd], f.draft_rows[rows, jd], -1)
        rec = _RecoveryRows(f.target, f.target_rows[rows, j], f.draft, p_row, f.is_greedy is not None)
        sums = (rec.sums_r, rec.sums_q)
        recovered = _recover_from(sums, rec.group, rec.q_argmax, j, seeds, offsets, f.is_greedy)
    else:
        q_j = _gather_rows(f.target, f.target_rows[rows, j])  # [B, V]
        residual = q_j
        if K > 0:  # point-mass drafts: q_j without the rejected draft's token
            x_j = drafts[rows, jd]
            remove = has_draft & draft_valid[rows, jd]
            residual = q_j.clone()
            residual[rows, x_j] = torch.where(remove, torch.zeros_like(q_j[:, 0]), q_j[rows, x_j])
        recovered = _recover(residual, q_j, j, seeds, offsets, f.is_greedy)
    final = _final_tokens(recovered, has_draft, f.bonus, f.target_rows[rows, j] >= 0, V)
    return build_output(f.draft_ids, num_accepted, final)


def _drop_malformed(out: torch.Tensor, num_draft: torch.Tensor) -> torch.Tensor:
    """out [B, K+1]: all -1 for the malformed ragged requests (num_draft -1, see spec_samplers.layout)."""
    return torch.where((num_draft >= 0)[:, None], out, PLACEHOLDER_TOKEN_ID)


def _rows_at(flat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """flat [R, V], rows [B, P] (-1 = none) -> [B * P, V] copies of the rows (unspecified where -1)."""
    if flat.shape[0] == 0:
        return torch.zeros(rows.numel(), flat.shape[1], dtype=flat.dtype, device=flat.device)
    return flat[rows.clamp(min=0).reshape(-1)]


def _own_rows(rows: torch.Tensor) -> torch.Tensor:
    """rows [B, P] -> the maps of :func:`_rows_at`'s output: b * P + i where present, else -1."""
    own = torch.arange(rows.numel(), device=rows.device, dtype=torch.int64).view(rows.shape)
    return torch.where(rows >= 0, own, -1)


def _ragged_ids(draft_token_ids: torch.Tensor, draft_rows: torch.Tensor) -> torch.Tensor:
    """[T] flat ids -> [B, K] (0 where a request has no draft at that position)."""
    if draft_token_ids.shape[0] == 0:
        return torch.zeros(draft_rows.shape, dtype=torch.int64, device=draft_rows.device)
    return torch.where(draft_rows >= 0, draft_token_ids.to(torch.int64)[draft_rows.clamp(min=0)], 0)


def _softmax_rows(
    batch: VerifyBatch, logits: torch.Tensor, per_request: int, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    """[R, V] fp32 probabilities of ``per_request`` consecutive rows per request, each at its
    request's temperature (``temperature`` [B], default the batch's; and filters, when the batch
    has them)."""
    if batch.temperature is None:
        raise input_error("temperature", "a [B] float tensor for logits inputs (VerifyBatch.temperature)", None)

    def rows(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.repeat_interleave(per_request)

    t = (batch.temperature if temperature is None else temperature).repeat_interleave(per_request)
    if not batch.filtered:
        return probs_from_logits(logits, t)
    return filtered_softmax_reference(logits, t, rows(batch.top_k), rows(batch.top_p), rows(batch.min_p))


class FlatInputs:
    """A batch as flat [R, V] fp32-convertible rows plus index maps (see :func:`flat_inputs`)."""

    def __init__(self, batch: VerifyBatch):
        layout = batch.layout
        device = batch.target.device
        B, K, V = layout.batch_size, layout.max_drafts, layout.vocab_size
        self.target_rows, self.draft_rows, self.num_draft = layout.maps(device)
        if batch.draft_rows is not None and not (layout.ragged and batch.temperature is not None):
            raise input_error("draft_rows", "None outside the ragged logits layout", "a tensor")
        target = batch.target.reshape(-1, V)
        draft = None if batch.draft is None else batch.draft.reshape(-1, V)
        self.is_greedy = batch.is_greedy
        ids = batch.draft_token_ids
        self.draft_ids = _ragged_ids(ids, self.draft_rows) if layout.ragged else ids.reshape(B, K)  # [B, K]
        if batch.temperature is not None:
            # probabilities from logits, each row at its request's temperature (0: greedy one-hot)
            t = batch.temperature
            if layout.ragged:
                # Gather each request's rows first: with inconsistent counts two requests may
                # share a row, and each reads it at its own temperature (as the kernels do).
                target = _rows_at(target, self.target_rows)
                self.target_rows = _own_rows(self.target_rows)
                if draft is not None:
                    draft = _rows_at(draft, self._indexed_rows(batch, draft.shape[0]))
                    self.draft_rows = _own_rows(self.draft_rows)
            target = _softmax_rows(batch, target, K + 1)
            if draft is not None and not batch.draft_is_probs:
                draft = _softmax_rows(batch, draft, K, _draft_temperature(batch))
            self.is_greedy = t == 0
        self.target = target  # [R, V]
        self.draft = draft  # [R', V] or None
        self.bonus = batch.bonus_token_ids  # [B]

    def _indexed_rows(self, batch: VerifyBatch, num_draft_rows: int) -> torch.Tensor:
        """[B, K] rows of the draft matrix each position reads (-1: none): the flat rows, or with
        ``batch.draft_rows`` their indices, where an index outside [0, N) rejects the draft (its
        id becomes -1, as the kernels' id test) and reads row 0 (never used)."""
        flat = self.draft_rows
        if batch.draft_rows is None or batch.draft_rows.shape[0] == 0:
            return flat
        index = batch.draft_rows.to(torch.int64)[flat.clamp(min=0)]  # [B, K]
        present = flat >= 0
        in_range = (index >= 0) & (index < num_draft_rows)
        self.draft_ids = torch.where(present & ~in_range, PLACEHOLDER_TOKEN_ID, self.draft_ids)
        return torch.where(present, torch.where(in_range, index, 0), -1)


def _draft_temperature(batch: VerifyBatch) -> torch.Tensor | None:
    """[B] T of the draft rows: ``batch.draft_temperature`` where > 0, else 1 (as the kernels),
    or None (the batch's temperature)."""
    t = batch.draft_temperature
    if t is None:
        return None
    return torch.where(t > 0, t.to(torch.float32), torch.ones((), device=t.device))


def flat_inputs(batch: VerifyBatch) -> FlatInputs:
    """Flat rows and maps of ``batch``, logits already turned into probabilities."""
    return FlatInputs(batch)


def _seeds_offsets(batch: VerifyBatch, sampler: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's [B] int64 seeds (the samplers that draw need them) and offsets (default 0)."""
    if batch.seeds is None:
        raise input_error(
            "seeds", f"[B] int64 per-request seeds (VerifyBatch.seeds): {sampler} draws random numbers", None
        )
    offsets = batch.offsets
    if offsets is None:
        offsets = torch.zeros(batch.layout.batch_size, dtype=torch.int64, device=batch.target.device)
    return batch.seeds, offsets


def rejection_reference(batch: VerifyBatch) -> torch.Tensor:
    """Lossless rejection sampling (docs/design.md section 3). Returns [B, K+1] int64, -1 padded.

    Accept x_i iff x_i in [0, V), p_i(x_i) > 0 and u_i * p_i(x_i) < q_i(x_i). At the first
    rejected position j, recover z ~ (q_j - p_j)+ by an exponential race (q_j when the residual
    has no mass or x_j is out of range); when all k drafts are accepted, emit the bonus token (or,
    if it is outside [0, V), a sample of the bonus row; -1 in the ragged layout, which has none).
    Greedy rows accept x_i iff x_i == argmax q_i and q_i(x_i) > 0, and recover argmax q_j.
    Logits inputs use q = softmax(target / T), p = softmax(draft / T), greedy where T == 0
    (:func:`~spec_samplers.torch_ops.probs_from_logits`). A recovery or resample from a target
    row without probability mass emits -1 (no token) instead; a malformed ragged request emits
    no token (:mod:`spec_samplers.layout`).

    Example::

        >>> from spec_samplers.layout import VerifyBatch
        >>> q = torch.softmax(torch.randn(2, 4, 8), -1)             # [B, k+1, V]
        >>> ids = torch.randint(0, 8, (2, 3))                       # [B, k]
        >>> batch = VerifyBatch.padded(q, torch.zeros(2, 1, dtype=torch.long), None, ids,
        ...                            seeds=torch.tensor([1, 2]))
        >>> rejection_reference(batch).shape
        torch.Size([2, 4])
    """
    f = flat_inputs(batch)
    return _drop_malformed(_rejection_core(f, *_seeds_offsets(batch, "rejection sampling")), f.num_draft)


def rejection_accepts_reference(batch: VerifyBatch) -> torch.Tensor:
    """[B, K] bool: whether each draft passes the random accept test of
    :func:`rejection_reference` on its own (same random numbers), whether or not an earlier draft
    was rejected (FlashInfer's "accepted" count); False past a request's drafts."""
    seeds, offsets = _seeds_offsets(batch, "rejection sampling")
    f = flat_inputs(batch)
    draft_valid, drafts = _valid_drafts(f.draft_ids, f.num_draft, batch.layout.vocab_size)
    return _random_accepts(f.target, f.target_rows, f.draft, f.draft_rows, draft_valid, drafts, seeds, offsets)


# ---------------------------------------------------------------------------------------------
# Typical acceptance.


def typical_accepts(
    q: torch.Tensor,  # [N, V] fp32 probabilities (cleaned)
    candidate: torch.Tensor,  # [N] fp32: q at the draft token
    posterior_threshold: float,
    posterior_alpha: float,
) -> torch.Tensor:
    """[N] bool: candidate > min(threshold, alpha * exp(-H(q))), H = -sum q log(q + eps).

    Computed in float64 from the fp32 probabilities, options and eps rounded to fp32 (what V0
    computes in fp32): the Triton kernel sums the entropy in another order, and in float64 the
    order moves H by ~1e-16 relative, so both backends decide alike unless q(x) lies within
    ~2**-45 of the threshold (fp32 sums disagreed on 56 of 300 constructed near-ties)."""
    return candidate.to(torch.float64) > typical_threshold(q, posterior_threshold, posterior_alpha)


def typical_threshold(q: torch.Tensor, posterior_threshold: float, posterior_alpha: float) -> torch.Tensor:
    """[N] float64 min(threshold, alpha * exp(-H(q))) of q [N, V] fp32 (see :func:`typical_accepts`)."""
    q64 = q.to(torch.float64)
    terms = q64 + ENTROPY_EPS_FP32  # in place from here: one float64 temporary, same operations
    entropy = -terms.log_().mul_(q64).sum(dim=-1)
    return torch.clamp(fp32_value(posterior_alpha) * torch.exp(-entropy), max=fp32_value(posterior_threshold))


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
    draft_valid, drafts = _valid_drafts(draft_ids, num_draft, V)
    accepted = torch.zeros((B, K), dtype=torch.bool, device=device)
    rows = torch.arange(B, device=device)
    # One position at a time keeps the fp32 copy at [B, V] instead of upcasting [B, K+1, V]. On
    # the CPU only the requests that accepted every earlier draft test position i (the entropy
    # pass is the cost; a later position of a request that rejected cannot change its tokens);
    # elsewhere every request does (picking the live ones would wait on the device).
    live_only = device.type == "cpu"
    for i in range(K):
        live = draft_valid[:, i] & accepted[:, :i].all(dim=1)
        at = live.nonzero().squeeze(1) if live_only else rows
        if at.numel() == 0:
            break
        # PyTorch sums the entropy of a lone row along another path than rows of a batch (the
        # last bits differ at large V): a lone row of a batch is tested twice over, as in a batch
        tested = at.repeat(2) if at.numel() == 1 and B > 1 else at
        q_i = _gather_rows(target_flat, target_rows[tested, i])  # [n, V]
        candidate = q_i.gather(1, drafts[tested, i : i + 1]).squeeze(1)
        ok = typical_accepts(q_i, candidate, posterior_threshold, posterior_alpha)[: at.numel()]
        accepted[at, i] = live[at] & ok
    num_accepted = num_leading_accepted(accepted)
    # the argmax of the one row each request recovers from (-1 where it has no probability mass:
    # its argmax 0 would have probability 0)
    q_j = _gather_rows(target_flat, target_rows[rows, num_accepted])  # [B, V]
    recovered = torch.where(q_j.amax(dim=-1) > 0, torch.argmax(q_j, dim=-1), PLACEHOLDER_TOKEN_ID)
    has_bonus_row = target_rows[rows, num_accepted] >= 0
    final = _final_tokens(recovered, num_accepted < num_draft, bonus_token_ids, has_bonus_row, V)
    return build_output(draft_ids, num_accepted, final)


def typical_reference(batch: VerifyBatch, posterior_threshold: float, posterior_alpha: float) -> torch.Tensor:
    """Typical acceptance (Medusa section 3.3.1, vLLM V0 semantics). Returns [B, K+1] int64.

    Accept x_i iff q_i(x_i) > min(posterior_threshold, posterior_alpha * exp(-H_i)) with
    H_i = -sum_x q_i(x) log(q_i(x) + 1e-5); recover argmax q_j at the first rejection. A bonus id
    outside [0, V) is replaced by argmax q_k (-1 in the ragged layout). ``batch.draft`` is unused.
    The test runs in float64 (:func:`typical_accepts`). A row without probability mass recovers
    -1 (no token); a malformed ragged request emits no token.
    """
    f = flat_inputs(batch)
    out = _typical_core(
        f.target, f.target_rows, f.num_draft, f.draft_ids, f.bonus, posterior_threshold, posterior_alpha
    )
    return _drop_malformed(out, f.num_draft)


# ---------------------------------------------------------------------------------------------
# Block verification (Sun et al. 2024, "Block Verification Accelerates Speculative Decoding",
# Algorithm 2). Notation (0-indexed, q = target, p = draft): request b has k_b drafts
# x_0 .. x_{k_b-1}; q_i, p_i are the distributions at position i (q_{k_b}: the bonus row).
#
# * running ratio of the prefix of length m: rho_0 = 1, rho_{m+1} = min(rho_m q_m(x_m) / p_m(x_m), 1)
#   (0 once a draft is out of range or has p_m(x_m) = 0: such a token was never a sample of p);
# * residual mass at position m: Z_m = sum_x (rho_m q_m(x) - p_m(x))+ (point-mass drafts: the
#   closed form rho_m (1 - q_m(x_m)));
# * threshold of "the block may end after m drafts", m = 1 .. k_b: h_m = Z_m / (Z_m + 1 - rho_m)
#   (1 when rho_m = 1) if position m has a valid draft, else rho_m (the block's last position,
#   m = k_b, and a position whose draft is out of range: the block is cut there, as vLLM does at
#   its -1 placeholder);
# * accepted length tau = the largest m with u_m < h_m (0 if none): a later position can rescue
#   an earlier failure, unlike token-wise rejection (strict < so that h = 0 never passes; the
#   paper's u <= h differs only on a null set);
# * emitted token at tau: a sample of (rho_tau q_tau - p_tau)+ normalised if position tau has a
#   valid draft (q_tau if that residual has no mass), q_tau if its draft is out of range, the bonus
#   token if tau = k_b.
#
# Lossless for the whole block, and P(tau >= i) = E_{x ~ p}[rho_i], never below token-wise
# rejection's prod min(1, q/p) (tests/test_block_verification.py checks both, exactly and
# statistically). Random numbers are the rejection sampler's: u_m is the accept uniform of
# position m - 1, the race at tau uses the recovery exponentials of position tau. The Python loops
# run over the k positions, never over the batch.


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


def _block_core(f: FlatInputs, seeds: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Block verification on flat rows; seeds, offsets: [B] int64. Returns [B, K+1] int64."""
    B, K = f.draft_ids.shape
    V = f.target.shape[1]
    device = f.target.device
    rows = torch.arange(B, device=device)
    draft_valid, drafts = _valid_drafts(f.draft_ids, f.num_draft, V)
    target_flat, target_rows, draft_flat, draft_rows = f.target, f.target_rows, f.draft, f.draft_rows

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
            # (rho_m q_m - p_m)+ in place in q_m: the same operations without three temporaries
            masses.append(q_m.mul_(rho[:, m, None]).sub_(p_m).clamp_min_(0.0).sum(dim=-1))
        mass = torch.stack(masses, dim=1) if K else torch.zeros((B, 0), device=device)
    h = torch.where(draft_valid, block_thresholds(mass, rho[:, :K]), rho[:, :K])  # position m's h at [:, m]
    h = torch.cat([h[:, 1:], rho[:, K:]], dim=1)  # [B, K]: entry m-1 holds h_m
    u = rng.accept_uniforms(seeds, offsets, K)  # [B, K]: entry m-1 tests h_m
    m_idx = torch.arange(1, K + 1, device=device)[None, :]
    stop = (u < h) & (m_idx <= f.num_draft[:, None])
    if K:
        tau = torch.where(stop, m_idx, torch.zeros_like(m_idx)).amax(dim=1)
    else:
        tau = torch.zeros(B, dtype=torch.int64, device=device)
    if f.is_greedy is not None and K > 0:
        greedy_len = num_leading_accepted(_greedy_accepts(target_flat, target_rows, draft_valid, drafts, q_x))
        tau = torch.where(f.is_greedy, greedy_len, tau)

    # One vocabulary row per request for the emitted token: position tau.
    j = tau
    has_draft = j < f.num_draft
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
    recovered = _recover(residual, q_j, j, seeds, offsets, f.is_greedy)
    final = _final_tokens(recovered, has_draft, f.bonus, target_rows[rows, j] >= 0, V)
    return build_output(f.draft_ids, j, final)


def block_reference(batch: VerifyBatch) -> torch.Tensor:
    """Block verification (comments above). Returns [B, K+1] int64, -1 padded; an out-of-range
    bonus id is handled as in :func:`rejection_reference`; greedy rows (``is_greedy`` or T == 0)
    follow the argmax rule.

    Example::

        >>> from spec_samplers.layout import VerifyBatch
        >>> q = torch.softmax(torch.randn(2, 4, 8), -1)             # [B, k+1, V]
        >>> p = torch.softmax(torch.randn(2, 3, 8), -1)             # [B, k, V]
        >>> ids = torch.multinomial(p.view(-1, 8), 1).view(2, 3)    # [B, k]
        >>> batch = VerifyBatch.padded(q, ids[:, :1], p, ids, seeds=torch.tensor([1, 2]))
        >>> block_reference(batch).shape
        torch.Size([2, 4])
    """
    f = flat_inputs(batch)
    return _drop_malformed(_block_core(f, *_seeds_offsets(batch, "block verification")), f.num_draft)
