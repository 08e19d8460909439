"""The grouped arguments of the verification kernels, declared once: the plans
(:mod:`spec_samplers.kernels.verify_launch`) pack them by keyword, the kernels read them by
attribute (``req.cu``, ``rows.stride_b``). No triton import: the fields' types are the Python
values a plan passes.

Triton passes a NamedTuple to a kernel and to its jit helpers as it is; a field that is None
becomes a constexpr, so the kernels' flags follow from which tensors are present (``req.cu is not
None``: the ragged layout) and a changing batch size reuses the compiled variant.
``tests/kernel_compile_check.py`` compiles every variant the plans produce with these classes in
the signature, so a field a kernel reads and the plan does not pack fails there; the kernels'
tests run the same plans under the interpreter.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

Tensor = torch.Tensor | None


class Rows(NamedTuple):
    """Rows of q or p (vocab stride 1) of a padded [B, K(+1), V] or ragged [T, V] tensor; every
    field None / 0 for an absent tensor (point-mass drafts)."""

    ptr: Tensor
    stride_b: int  # row (b, i) starts at b * stride_b + i * stride_k (padded), or at row start + i (ragged)
    stride_k: int  # 0 in the ragged layout (its rows are flat)
    #: [B, K+1, 3] fp32 per-row (max, sum, cut) of the fused softmax (logits: LOGITS follows from
    #: it; :func:`spec_samplers.kernels.common.row_stats`), None for probabilities
    stats: Tensor
    #: [T] int32/int64: the row each ragged row reads in an [N, V] matrix (``VerifyBatch.draft_rows``,
    #: :func:`spec_samplers.kernels.common.indexed_row_offset`), None: rows in place
    row_index: Tensor
    num_index_rows: int | None  # N with an index, else None (a constexpr: no extra signature)
    #: [B] the rows' own temperature (``VerifyBatch.draft_temperature``), None: the request's T
    temperature: Tensor


class Ids(NamedTuple):
    """The draft token ids, [B, K] padded or [T] ragged."""

    ptr: Tensor
    stride_b: int
    stride_k: int


class Seqs(NamedTuple):
    """What a verification kernel reads per position."""

    target: Rows  # q, K+1 rows per request (the last: the bonus row, padded layout)
    draft: Rows  # p, K rows per request; all None for point-mass drafts (HAS_DRAFT)
    ids: Ids


class Request(NamedTuple):
    """Per-request inputs, [B] each (None where absent)."""

    cu: Tensor  # inclusive cumsum of k_b (the ragged layout: RAGGED); None padded
    seeds: Tensor  # int64
    offsets: Tensor  # int64 counter offsets (HAS_OFFSETS)
    #: the temperatures T of logits inputs (LOGITS; T == 0 marks a greedy request), None for probabilities
    temperature: Tensor
    #: the greedy mask of probabilities inputs, None with ``temperature`` (greedy is then T == 0)
    is_greedy: Tensor
    bonus: Tensor  # [B, 1] bonus ids
    stride_bonus: int


class VerifyParts(NamedTuple):
    """Partials of rejection sampling and block verification, written by the vocabulary pass and
    read by the last program of each request; one per (request[, position], vocab block)."""

    mass: Tensor  # fp32 residual mass per vocab block, [B(, K+1), NB]
    #: fp64 race-group sums (:data:`spec_samplers.rng.RACE_GROUP` entries each) of the residual and
    #: of q (its zero-mass fallback), [B(, K+1), G1]
    r_sums: Tensor
    q_sums: Tensor
    #: the greedy requests' (max, argmax) partials of q, or of the logits, [B, K+1, NB] fp32 /
    #: int32; None without greedy requests
    amax_val: Tensor
    amax_idx: Tensor


class TypicalParts(NamedTuple):
    """Partials of typical acceptance, [B, K+1, NB] each."""

    entropy: Tensor  # fp64 sum of q log(q + eps)
    max: Tensor  # fp32 max of q
    argmax: Tensor  # int32
    logit_max: Tensor  # fp32 max of the logits (greedy requests of logits inputs), else None
    logit_argmax: Tensor  # int32, else None


class Posterior(NamedTuple):
    """Typical acceptance's options, fp32 values (rounded by the plan as the reference rounds)."""

    threshold: float
    alpha: float


class SoftmaxParts(NamedTuple):
    """Partials of the fused-softmax statistics, [B, K+1, NB] each."""

    t_max: Tensor  # fp32 max of the target logits
    t_sum: Tensor  # fp32 sum of exp((x - max) / T)
    d_max: Tensor  # of the draft logits (None without a draft)
    d_sum: Tensor
    logit_max: Tensor  # fp32 max of the raw target logits (the greedy token)
    logit_argmax: Tensor  # int32


class Stats(NamedTuple):
    """Per-row (max, sum, cut) statistics, [B, K+1, 3] fp32 each (:func:`spec_samplers.kernels.common.row_stats`)."""

    target: Tensor
    draft: Tensor  # None without a draft


class ProgramRequest(NamedTuple):
    """Inside a verification kernel: the program's request and the batch's sizes
    (:func:`spec_samplers.kernels.verify_kernels.open_request`)."""

    b: Any  # request index, program_id(0)
    start: Any  # its first flat row (ragged), else 0
    n: Any  # k_b
    seed: Any  # int64, 0 without seeds
    offset: Any  # int64 counter offset, 0 without offsets
    #: c = log2(e) / T, the logits rule's scale of the request's T
    #: (:func:`spec_samplers.kernels.common.logits_scale`); 1 for probabilities
    scale: Any
    K: Any
    V: Any
    num_rows: Any


class StatsRequest(NamedTuple):
    """Per-request inputs of the fused-softmax statistics, [B] each."""

    cu: Tensor  # inclusive cumsum of k_b (ragged), None padded
    temperature: Tensor  # T of the target rows (0: greedy, statistics at T = 1)
    draft_temperature: Tensor  # T of the draft rows, None: ``temperature``


class Drafts(NamedTuple):
    """Inside a verification kernel: the per-position vectors of the program's request."""

    pos: Any  # positions 0 .. BLOCK_K - 1
    ids: Any  # draft ids as given (int64)
    valid: Any  # id in [0, V) and inside the request
    rho: Any  # block verification's running ratios (1.0: rejection sampling, unscaled)


class ResidualRow(NamedTuple):
    """Inside a verification kernel: what the residual of position j needs besides the
    vocabulary (:func:`spec_samplers.kernels.verify_kernels.residual_row`)."""

    q_off: Any  # element offset of q_j's row
    q_rule: Any  # its logits-rule constants (:func:`spec_samplers.kernels.common.row_stats`)
    p_off: Any  # of p_j's row (q_j's without a draft)
    p_rule: Any
    p_keep: Any  # p_j is read: its row exists and x_j is valid
    x_removed: Any  # x_j where valid, else -1
    valid: Any  # x_j valid
    rho: Any  # rho_j


class PassFlags(NamedTuple):
    """Inside a verification kernel: the constexpr flags of the residual pass and the race."""

    RAGGED: bool  # the ragged layout
    SCALED: bool  # block verification: the residual is (rho q - p)+
    PRECISE: bool  # libdevice exp / log (compiled; the interpreter has none)
