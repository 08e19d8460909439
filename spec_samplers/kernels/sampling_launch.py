"""Launchers of the sampling kernels (:mod:`spec_samplers.kernels.sampling_kernels`).

Kernel twins of :mod:`spec_samplers.sampling.reference` on resolved arguments (per-output-row
parameters, seeds and offsets; ``rows`` = the input row of each output). No host
synchronisation; grids depend on shapes only, so a CUDA graph can capture a call.

Each public ``*_triton`` function is a launcher: it plans its launches and launches each where
it names its kernel (``sk.race_kernel[grid](**args)``), or, with ``config.launches`` a list
(:class:`~spec_samplers.kernels.backend.LaunchConfig`), appends it there instead and runs nothing
(:func:`~spec_samplers.kernels.backend.recorded`): what the cost model and the launch counts
read on meta or CPU tensors.

No eager op runs around the launches: the per-request parameters reach the kernels as the caller
gave them ([B] tensors of any real dtype, or Python scalars already canonical:
``spec_samplers.validation.top_k_arg`` and friends) and the kernels normalise them in their
prologue; one seed for the batch reaches the race's finalize, which derives each row's seed. A
call is at most three launches: the row thresholds (or the logits' row max, or the softmax
statistics), the race's group sums, the race (or the elementwise output).
This module does not import triton: the kernels are imported inside the launchers, so importing
the package needs only torch.

Compiled variants: the thresholds kernel has one variant per filter set x input kind x mass
tracking, the vocabulary kernels one variant per input kind and flag set; block sizes come from
:func:`spec_samplers.kernels.backend.vocab_split` (BLOCK_V in {256, 512, 1024} on CUDA) and
``sampling_kernels.SEARCH_BLOCK_V``, and the per-step integers (R, chunk, NB, the scalar
parameters) are not specialised on, so a serving engine whose batch size changes every step
compiles a bounded set.
"""

from __future__ import annotations

from typing import Any

import torch

from spec_samplers import rng
from spec_samplers.kernels.backend import (
    KernelLaunch,
    LaunchConfig,
    VocabSplit,
    plan_vocab_split,
    recorded,
    triton_next_pow2,
    vocab_split,
)
from spec_samplers.layout import VerifyBatch

#: a per-request parameter as the kernels read it: a [B] tensor (any real dtype) or a Python scalar
Param = torch.Tensor | int | float | None


def _param(name: str, value: Param, default: float | int) -> dict[str, Any]:
    """Kernel arguments ``{name}_ptr`` / ``{name}_val`` of a per-request parameter."""
    if isinstance(value, torch.Tensor):
        return {f"{name}_ptr": value.contiguous(), f"{name}_val": default}
    return {f"{name}_ptr": None, f"{name}_val": default if value is None else value}


def _split(V: int, B: int, device: torch.device, split: VocabSplit | None, config: LaunchConfig | None) -> VocabSplit:
    """The vocabulary split of a launch: ``split`` when given (tests), else the device's, or that
    of a CUDA device with ``config.num_sms`` multiprocessors (as :func:`vocab_split` plans it)."""
    if split is not None:
        return split
    if config is not None and config.num_sms is not None:
        return plan_vocab_split(V, B, 4 * config.num_sms, 1024)
    return vocab_split(V, B, device)


def _rows(x: torch.Tensor, rows: torch.Tensor | None) -> dict[str, object]:
    """Kernel arguments addressing output row b's input row ``rows[b]`` of ``x`` [R, V] (row b
    without ``rows``)."""
    return dict(x_ptr=x, stride_r=x.stride(0), rows_ptr=rows, R=x.shape[0], V=x.shape[1])


def _outputs(x: torch.Tensor, rows: torch.Tensor | None) -> int:
    """B, the number of output rows."""
    return x.shape[0] if rows is None else rows.shape[0]


def _blocks(split: VocabSplit) -> dict[str, object]:
    """Kernel arguments of the (B, NB) vocabulary split."""
    return dict(chunk=split.chunk, NB=split.num_blocks, BLOCK_V=split.block_v)


def row_seeds_triton(
    seed: torch.Tensor, offset: torch.Tensor, num_rows: int, *, config: LaunchConfig | None = None
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.rng.derive_row_seeds` (seed, offset: [1]
    int64): one launch where the PyTorch path runs Philox as ~90 small ops."""
    seeds, _ = request_seeds_triton(seed, offset, True, num_rows, seed.device, offsets_out=False, config=config)
    return seeds


def request_seeds_triton(
    seeds: torch.Tensor | int,  # [B] per row, or (derive) one seed for the batch: [1] or an int
    offsets: torch.Tensor | int,  # [B] per row, or [1] / an int for the batch
    derive: bool,  # row b's seed derives from (seeds, the batch's offset or 0, b)
    num_rows: int,
    device: torch.device,
    *,
    offsets_out: bool = True,
    config: LaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A call's randomness in ``validation.kernel_seeds``' forms as [B] int64 (seeds, offsets)
    tensors, for kernels that read per-request tensors (the rejection kernel): one launch, the
    kernel twin of ``validation.resolve_seeds`` with ``rng.derive_row_seeds``."""
    from spec_samplers.kernels import sampling_kernels as sk

    out = torch.empty((num_rows,), dtype=torch.int64, device=device)
    out_offsets = torch.empty((num_rows,), dtype=torch.int64, device=device) if offsets_out else None
    if num_rows:
        block = 256
        grid = (-(-num_rows // block),)
        args = dict(**_seed_args(seeds, offsets, derive), out_ptr=out, offsets_out_ptr=out_offsets)
        args.update(num_rows=num_rows, BLOCK=block)
        if not recorded(config, KernelLaunch(sk.row_seeds_kernel, grid, args, 2, name="row_seeds")):
            sk.row_seeds_kernel[grid](**args, num_warps=2)
    return out, out_offsets


def chain_counts_triton(
    batch: VerifyBatch,  # padded, probabilities, with [B] seeds and offsets: the rejection kernel's
    out: torch.Tensor,  # [B, K+1] int64: the rejection kernel's output
    accepted: torch.Tensor,  # [B]: the independent accepts are added to it or written
    emitted: torch.Tensor,  # [B]: the emitted drafts, likewise
    add: tuple[bool, bool],  # (accepted, emitted): added to (given by the caller) or written
    *,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """FlashInfer's chain speculative sampling counters after the rejection kernel, and its
    output as int32 (one launch, ``chain_counts_kernel``): the kernel twin of
    ``reference.rejection_accepts_reference(batch).sum(1)`` and ``(out != -1).sum(1) - 1``.
    Returns [B, K+1] int32."""
    from spec_samplers.kernels import sampling_kernels as sk
    from spec_samplers.kernels.abi import Seqs
    from spec_samplers.kernels.backend import precise_math, vocab_contiguous
    from spec_samplers.kernels.verify_launch import draft_ids, request, rows

    layout = batch.layout
    B, K, V = layout.batch_size, layout.max_drafts, layout.vocab_size
    tokens = torch.empty((B, K + 1), dtype=torch.int32, device=out.device)
    if B == 0:
        return tokens
    draft = None if batch.draft is None else vocab_contiguous(batch.draft)
    seqs = Seqs(
        target=rows(layout, vocab_contiguous(batch.target)),
        draft=rows(layout, draft),
        ids=draft_ids(layout, batch.draft_token_ids),
    )
    args: dict[str, Any] = dict(seqs=seqs, req=request(batch, batch.seeds, batch.offsets))
    args.update(out_ptr=out, tokens_ptr=tokens)
    args.update(accepted_ptr=accepted, stride_accepted=accepted.stride(0))
    args.update(emitted_ptr=emitted, stride_emitted=emitted.stride(0))
    args.update(K=K, V=V, num_rows=layout.num_rows, BLOCK_K=triton_next_pow2(K + 1), PRECISE=precise_math())
    args.update(ADD_ACCEPTED=add[0], ADD_EMITTED=add[1])
    if not recorded(config, KernelLaunch(sk.chain_counts_kernel, (B,), args, 1, name="chain_counts")):
        sk.chain_counts_kernel[(B,)](**args, num_warps=1)
    return tokens


def _stats_args(
    x: torch.Tensor,  # [B, V] logits, vocab stride 1
    rows: torch.Tensor | None,  # [B] input row of each output (None: the rows of x)
    split: VocabSplit,
    temperature: Param = None,  # softmax statistics of x / T (given: SOFTMAX)
) -> dict[str, Any]:
    """``stats_kernel``'s arguments, grid (B, NB), with its [B, NB] block partials (``max_ptr``;
    for softmax ``sum_ptr`` and ``amax_ptr``): the max of the cleaned logits, and for softmax the
    sum of exp((x - max) / T) and the argmax."""
    from spec_samplers.kernels.backend import precise_math

    B, NB = _outputs(x, rows), split.num_blocks
    softmax = temperature is not None

    def part(dtype: torch.dtype, wanted: bool = True) -> torch.Tensor | None:
        return torch.empty((B, NB), dtype=dtype, device=x.device) if wanted else None

    args = dict(_rows(x, rows), **_blocks(split), **_param("temp", temperature, 1.0), max_ptr=part(torch.float32))
    args.update(sum_ptr=part(torch.float32, softmax), amax_ptr=part(torch.int32, softmax))
    return dict(args, SOFTMAX=softmax, PRECISE=precise_math())


def _thresholds_args(
    x: torch.Tensor,  # [R, V], vocab stride 1
    rows: torch.Tensor | None,  # [B] input row of each output (None: the rows of x)
    logits: bool,
    top_k: Param,  # [B] or int (0 = off); None: no top-k
    top_p: Param,
    min_p: Param,
    joint: bool,
    need_kept_mass: bool,
) -> dict[str, Any]:
    """``thresholds_kernel``'s arguments, grid (B,), with its outputs: ``tau_ptr`` [B] fp32 (keep
    values >= tau), ``max_ptr`` [B] fp32 (the row max), ``mass_ptr`` [B] int64 (the kept mass,
    when asked; exact when top-p is the last filter or top-k the only one)."""
    from spec_samplers.kernels import sampling_kernels as sk
    from spec_samplers.kernels.backend import precise_math

    B, V, device = _outputs(x, rows), x.shape[1], x.device
    cap = sk.search_scratch(B, V) if top_k is not None or top_p is not None else 1
    args = dict(_rows(x, rows), **_param("k", top_k, 0), **_param("p", top_p, 1.0), **_param("m", min_p, 0.0))
    args.update(tau_ptr=torch.empty((B,), dtype=torch.float32, device=device))
    args.update(max_ptr=torch.empty((B,), dtype=torch.float32, device=device))
    args.update(mass_ptr=torch.empty((B,), dtype=torch.int64, device=device) if need_kept_mass else None)
    args.update(scratch_ptr=torch.empty((B, cap), dtype=torch.float32, device=device), cap=cap)
    args.update(TOP_K=top_k is not None, TOP_P=top_p is not None, MIN_P=min_p is not None, JOINT=joint)
    return dict(args, LOGITS=logits, TRACK_MASS=need_kept_mass, BLOCK_V=sk.search_block(V), PRECISE=precise_math())


def thresholds_triton(
    x: torch.Tensor,  # [R, V], vocab stride 1
    rows: torch.Tensor | None,  # [B] int32/int64
    logits: bool,
    top_k: Param,  # [B] (any real dtype) or int, 0 = off
    top_p: Param,  # [B] or float
    min_p: Param,  # [B] or float
    joint: bool,
    need_kept_mass: bool = False,
    *,
    config: LaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The filters' thresholds alone (tests compare them with the reference's): (tau [B] fp32:
    keep values >= tau, row max [B], kept mass [B] int64 when asked)."""
    from spec_samplers.kernels import sampling_kernels as sk
    from spec_samplers.kernels.backend import vocab_contiguous

    x, rows = vocab_contiguous(x), None if rows is None else rows.contiguous()
    args = _thresholds_args(x, rows, logits, top_k, top_p, min_p, joint, need_kept_mass)
    grid, warps = (_outputs(x, rows),), sk.SEARCH_WARPS
    if not recorded(config, KernelLaunch(sk.thresholds_kernel, grid, args, warps, name="thresholds")):
        sk.thresholds_kernel[grid](**args, num_warps=warps)
    return args["tau_ptr"], args["max_ptr"], args["mass_ptr"]


def _seed_args(seeds: torch.Tensor | int, offsets: torch.Tensor | int, derive: bool) -> dict[str, Any]:
    """race_finalize_kernel's randomness arguments (``checks.kernel_seeds``' forms): per-row
    [B] seeds, or one seed for the batch (``derive``); [B] offsets, or one for the batch."""
    args = dict(**_param("seed", seeds, 0), **_param("offset", offsets, 0))
    per_row_offsets = isinstance(offsets, torch.Tensor) and offsets.shape[0] != 1
    return dict(args, SEED_STRIDE=0 if derive else 1, OFFSET_STRIDE=int(per_row_offsets), DERIVE=derive)


def sample_triton(
    *,
    x: torch.Tensor,  # [R, V] probabilities or logits (fp32/fp16/bf16)
    rows: torch.Tensor | None,  # [B] int32/int64 input row of each output (None: row b, B = R)
    seeds: torch.Tensor | int,  # [B] per row, or (derive) one seed for the batch: [1] or an int
    offsets: torch.Tensor | int,  # [B] per row, or [1] / an int for the batch
    derive: bool = False,  # row b's seed derives from (seeds, the batch's offset or 0, b)
    logits: bool = False,
    top_k: Param = None,  # [B] (any real dtype) or int, 0 = off
    top_p: Param = None,  # [B] or float
    min_p: Param = None,  # [B] or float
    joint: bool = False,
    split: VocabSplit | None = None,
    out_dtype: torch.dtype = torch.int64,  # of the tokens: int32 or int64
    config: LaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of :func:`spec_samplers.sampling.reference.sample_reference`: the thresholds
    (with filters; the row max of unfiltered logits), the race's group sums, the race. Returns
    (tokens [B] ``out_dtype``, -1 where invalid; valid [B] bool)."""
    from spec_samplers.kernels import sampling_kernels as sk
    from spec_samplers.kernels.backend import precise_math, vocab_contiguous

    R, B, V, device = x.shape[0], _outputs(x, rows), x.shape[1], x.device
    if R == 0 or B == 0:
        return torch.full((B,), -1, dtype=out_dtype, device=device), torch.zeros(B, dtype=torch.bool, device=device)
    x, rows = vocab_contiguous(x), None if rows is None else rows.contiguous()
    split = _split(V, B, device, split, config)
    tau = row_max = None  # unfiltered probabilities: every token is kept, no row statistics
    max_nb = 1
    if top_k is not None or top_p is not None or min_p is not None:
        args = _thresholds_args(x, rows, logits, top_k, top_p, min_p, joint, False)
        if not recorded(config, KernelLaunch(sk.thresholds_kernel, (B,), args, sk.SEARCH_WARPS, name="thresholds")):
            sk.thresholds_kernel[(B,)](**args, num_warps=sk.SEARCH_WARPS)
        tau, row_max = args["tau_ptr"], args["max_ptr"]
    elif logits:  # every token is kept; the weights exp(x - max) need the row max, in NB partials
        args = _stats_args(x, rows, split)
        if not recorded(config, KernelLaunch(sk.stats_kernel, (B, split.num_blocks), args, name="stats")):
            sk.stats_kernel[(B, split.num_blocks)](**args)
        row_max, max_nb = args["max_ptr"], split.num_blocks
    sums = torch.empty((B, rng.race_num_groups(V)), dtype=torch.float64, device=device)
    common = dict(_rows(x, rows), max_ptr=row_max, max_nb=max_nb, tau_ptr=tau, sums_ptr=sums)
    common.update(LOGITS=logits, PRECISE=precise_math())
    race_args = dict(common, **_blocks(split))
    grid = (B, split.num_blocks)
    if not recorded(config, KernelLaunch(sk.race_kernel, grid, race_args, name="race")):
        sk.race_kernel[grid](**race_args)
    tokens = torch.empty((B,), dtype=out_dtype, device=device)
    valid = torch.empty((B,), dtype=torch.bool, device=device)
    finalize_args = dict(common, **_seed_args(seeds, offsets, derive), out_ptr=tokens, valid_ptr=valid)
    if not recorded(config, KernelLaunch(sk.race_finalize_kernel, (B,), finalize_args, name="race_finalize")):
        sk.race_finalize_kernel[(B,)](**finalize_args)
    return tokens, valid


def _elementwise_args(x: torch.Tensor, out: torch.Tensor, split: VocabSplit) -> dict[str, Any]:
    """Arguments of a (B, NB) elementwise output kernel writing ``out`` [B, V] from ``x``."""
    return dict(x_ptr=x, stride_r=x.stride(0), out_ptr=out, V=x.shape[1], chunk=split.chunk, BLOCK_V=split.block_v)


def renorm_triton(
    *,
    probs: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: Param = None,  # [B] (any real dtype) or int, 0 = off
    top_p: Param = None,  # [B] or float
    out_dtype: torch.dtype = torch.float32,
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.sampling.reference.renorm_reference` (one filter):
    the threshold and kept mass, then the renormalised rows."""
    from spec_samplers.kernels import sampling_kernels as sk
    from spec_samplers.kernels.backend import vocab_contiguous

    B, V = probs.shape
    out = torch.empty((B, V), dtype=out_dtype, device=probs.device)
    if B == 0:
        return out
    probs = vocab_contiguous(probs)
    split = _split(V, B, probs.device, split, config)
    cut = _thresholds_args(probs, None, False, top_k, top_p, None, False, True)
    if not recorded(config, KernelLaunch(sk.thresholds_kernel, (B,), cut, sk.SEARCH_WARPS, name="thresholds")):
        sk.thresholds_kernel[(B,)](**cut, num_warps=sk.SEARCH_WARPS)
    args = dict(_elementwise_args(probs, out, split), stride_o=V, tau_ptr=cut["tau_ptr"], mass_ptr=cut["mass_ptr"])
    grid = (B, split.num_blocks)
    if not recorded(config, KernelLaunch(sk.renorm_kernel, grid, args, name="renorm")):
        sk.renorm_kernel[grid](**args)
    return out


def mask_logits_triton(
    *,
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: Param,  # [B] (any real dtype) or int, 0 = off
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.sampling.reference.mask_logits_reference`."""
    from spec_samplers.kernels import sampling_kernels as sk
    from spec_samplers.kernels.backend import vocab_contiguous

    B, V = logits.shape
    out = torch.empty((B, V), dtype=logits.dtype, device=logits.device)
    if B == 0:
        return out
    logits = vocab_contiguous(logits)
    split = _split(V, B, logits.device, split, config)
    cut = _thresholds_args(logits, None, True, top_k, None, None, False, False)
    if not recorded(config, KernelLaunch(sk.thresholds_kernel, (B,), cut, sk.SEARCH_WARPS, name="thresholds")):
        sk.thresholds_kernel[(B,)](**cut, num_warps=sk.SEARCH_WARPS)
    args = dict(_elementwise_args(logits, out, split), stride_o=V, tau_ptr=cut["tau_ptr"])
    grid = (B, split.num_blocks)
    if not recorded(config, KernelLaunch(sk.mask_kernel, grid, args, name="mask")):
        sk.mask_kernel[grid](**args)
    return out


def softmax_triton(
    *,
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    temperature: Param,  # [B] (any real dtype; 0: one-hot of the argmax) or a float
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.sampling.reference.softmax_reference` (equal up to
    the rounding of the row sums, whose order differs): the statistics' block partials, then
    the softmax kernel, which combines them itself. Returns [B, V] fp32."""
    from spec_samplers.kernels import sampling_kernels as sk
    from spec_samplers.kernels.backend import precise_math, vocab_contiguous

    B, V = logits.shape
    out = torch.empty((B, V), dtype=torch.float32, device=logits.device)
    if B == 0:
        return out
    logits = vocab_contiguous(logits)
    temperature = 1.0 if temperature is None else temperature
    split = _split(V, B, logits.device, split, config)
    grid = (B, split.num_blocks)
    stats = _stats_args(logits, None, split, temperature)
    if not recorded(config, KernelLaunch(sk.stats_kernel, grid, stats, name="stats")):
        sk.stats_kernel[grid](**stats)
    parts = {name: stats[name] for name in ("max_ptr", "sum_ptr", "amax_ptr")}
    args = dict(_elementwise_args(logits, out, split), **_param("temp", temperature, 1.0), **parts)
    args.update(NB=split.num_blocks, PRECISE=precise_math())
    if not recorded(config, KernelLaunch(sk.softmax_kernel, grid, args, name="softmax")):
        sk.softmax_kernel[grid](**args)
    return out
