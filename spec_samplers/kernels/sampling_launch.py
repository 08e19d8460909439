"""Launchers of the sampling kernels (:mod:`spec_samplers.kernels.sampling_kernels`).

Kernel twins of :mod:`spec_samplers.sampling.reference` on resolved arguments (per-output-row
parameters, seeds and offsets; ``rows`` = the input row of each output). No host
synchronisation; grids depend on shapes only, so a CUDA graph can capture a call.

Compiled variants: the search kernel has 2 modes x 2 input kinds x mass tracking on/off, the
vocabulary kernels one variant per input kind and flag set; block sizes come from
:func:`spec_samplers.kernels.backend.vocab_split` (BLOCK_V in {256, 512, 1024} on CUDA) and
``sampling_kernels.SEARCH_BLOCK_V``, and the per-step integers (R, chunk, NB) are not specialised on, so a serving
engine whose batch size changes every step compiles a bounded set.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spec_samplers import rng
from spec_samplers.kernels import sampling_kernels as sk
from spec_samplers.kernels.backend import VocabSplit, vocab_split
from spec_samplers.kernels.launch_common import KernelLaunch, precise_math, vocab_contiguous
from spec_samplers.torch_ops import scaled_exp


def _rows(x: torch.Tensor, rows: torch.Tensor) -> dict[str, object]:
    """Kernel arguments addressing output row b's input row ``rows[b]`` of ``x`` [R, V]."""
    return dict(x_ptr=x, stride_r=x.stride(0), rows_ptr=rows, R=x.shape[0], V=x.shape[1])


def _blocks(split: VocabSplit) -> dict[str, object]:
    """Kernel arguments of the (B, NB) vocabulary split."""
    return dict(chunk=split.chunk, NB=split.num_blocks, BLOCK_V=split.block_v)


def _run_over_rows(
    kernel: object, name: str, x: torch.Tensor, rows: torch.Tensor, split: VocabSplit, logits: bool, **args: object
) -> None:
    """One (B, NB) launch over the vocabulary blocks of each output row's input row."""
    grid = (rows.shape[0], split.num_blocks)
    KernelLaunch(
        kernel, grid, dict(_rows(x, rows), **_blocks(split), LOGITS=logits, PRECISE=precise_math(), **args), name=name
    ).run()


def row_seeds_triton(seed: torch.Tensor, offset: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.rng_sampling.derive_row_seeds` (seed, offset: [1]
    int64): one launch where the PyTorch path runs Philox as ~90 small ops."""
    out = torch.empty((num_rows,), dtype=torch.int64, device=seed.device)
    if num_rows:
        block = 256
        args = dict(seed_ptr=seed, offset_ptr=offset, out_ptr=out, num_rows=num_rows, BLOCK=block)
        KernelLaunch(sk.row_seeds_kernel, (-(-num_rows // block),), args, num_warps=2, name="row_seeds").run()
    return out


def _row_stats(
    x: torch.Tensor,  # [R, V], vocab stride 1
    rows: torch.Tensor,  # [B] int64
    logits: bool,
    split: VocabSplit,
    temperature: torch.Tensor | None = None,  # [B] fp32: softmax statistics of x / T
) -> tuple[torch.Tensor, ...]:
    """(row max [B], row min [B]) of the cleaned values; for softmax (``temperature`` given)
    (row max [B] of the logits, sum of exp((x - max) / T) [B], argmax [B] int64) instead. A missing
    row has max -inf and min +inf."""
    B, NB = rows.shape[0], split.num_blocks
    softmax = temperature is not None

    def part(dtype: torch.dtype, wanted: bool = True) -> torch.Tensor | None:
        return torch.empty((B, NB), dtype=dtype, device=x.device) if wanted else None

    pmax, pmin = part(torch.float32), part(torch.float32, not softmax)
    psum, pidx = part(torch.float32, softmax), part(torch.int32, softmax)
    parts = dict(max_ptr=pmax, min_ptr=pmin, sum_ptr=psum, amax_ptr=pidx)
    _run_over_rows(sk.stats_kernel, "stats", x, rows, split, logits, temp_ptr=temperature, SOFTMAX=softmax, **parts)
    assert pmax is not None
    row_max = pmax.amax(dim=1)
    if temperature is None:
        assert pmin is not None
        return row_max, pmin.amin(dim=1)
    assert psum is not None and pidx is not None
    t = torch.where(temperature > 0, temperature, 1.0)[:, None]
    row_sum = (psum * scaled_exp(pmax, row_max[:, None], t)).sum(dim=1)  # block sums rescaled to the row max
    first_max = torch.argmax(pmax, dim=1, keepdim=True)  # lowest block holding the max
    argmax = pidx.gather(1, first_max)[:, 0].to(torch.int64)
    return row_max, row_sum, argmax


def _search(
    x: torch.Tensor,
    rows: torch.Tensor,
    row_max: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    mode: int,
    logits: bool,
    track_mass: bool,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Runs one pivot search in place on (lo, hi). Returns (tau [B], mass of values >= tau [B]
    int64 or None)."""
    B = rows.shape[0]
    mass = torch.empty(B, dtype=torch.int64, device=x.device) if track_mass else None
    interval = dict(lo_ptr=lo, hi_ptr=hi, mass_ptr=mass)
    flags = dict(MODE=mode, LOGITS=logits, TRACK_MASS=track_mass, PRECISE=precise_math())
    block = sk.search_block(x.shape[1])
    cap = sk.search_scratch(B, x.shape[1])
    scratch = torch.empty((B, cap), dtype=torch.float32, device=x.device)
    args = dict(_rows(x, rows), max_ptr=row_max, k_ptr=top_k, p_ptr=top_p, BLOCK_V=block, **interval, **flags)
    args.update(scratch_ptr=scratch, cap=cap)
    KernelLaunch(sk.search_kernel, (B,), args, num_warps=sk.SEARCH_WARPS, name="search").run()
    return lo, mass


def thresholds_triton(
    x: torch.Tensor,  # [R, V], vocab stride 1
    rows: torch.Tensor,  # [B] int64
    logits: bool,
    top_k: torch.Tensor | None,  # [B] int64, 0 = off
    top_p: torch.Tensor | None,  # [B] fp32
    min_p: torch.Tensor | None,  # [B] fp32
    joint: bool,
    split: VocabSplit,
    need_kept_mass: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(tau [B] fp32: keep values >= tau, row max [B], kept mass [B] int64 when asked; the kept
    mass is exact when top-p is the last filter or top-k the only one)."""
    row_max, row_min = _row_stats(x, rows, logits, split)
    tau = row_min.clone()
    kept_mass = None
    if top_k is not None:
        hi = torch.where(top_k > 0, row_max, row_min)
        tau, kept_mass = _search(
            x,
            rows,
            row_max,
            row_min.clone(),
            hi,
            sk.MODE_COUNT,
            logits,
            need_kept_mass and top_p is None,
            top_k=top_k,
        )
    if top_p is not None:
        lo = (row_min if joint or top_k is None else tau).clone()
        tau_p, kept_mass = _search(x, rows, row_max, lo, row_max.clone(), sk.MODE_MASS, logits, True, top_p=top_p)
        tau = torch.maximum(tau, tau_p)
    if min_p is not None:
        tau = torch.maximum(tau, torch.minimum(min_p * row_max, row_max))
    return tau, row_max, kept_mass


def sample_triton(
    *,
    x: torch.Tensor,  # [R, V] probabilities or logits (fp32/fp16/bf16)
    rows: torch.Tensor,  # [B] int64 input row of each output
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
    logits: bool = False,
    top_k: torch.Tensor | None = None,  # [B] int64, 0 = off
    top_p: torch.Tensor | None = None,  # [B] fp32
    min_p: torch.Tensor | None = None,  # [B] fp32
    joint: bool = False,
    split: VocabSplit | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of :func:`spec_samplers.sampling.reference.sample_reference`. Returns (tokens
    [B] int64, -1 where invalid; valid [B] bool)."""
    R, V = x.shape
    B = rows.shape[0]
    device = x.device
    if R == 0 or B == 0:
        return torch.full((B,), -1, dtype=torch.int64, device=device), torch.zeros(B, dtype=torch.bool, device=device)
    x = vocab_contiguous(x)
    rows = rows.to(torch.int64).contiguous()
    if split is None:
        split = vocab_split(V, B, device)
    tau, row_max, _ = thresholds_triton(x, rows, logits, top_k, top_p, min_p, joint, split)
    sums = torch.empty((B, rng.race_num_groups(V)), dtype=torch.float64, device=device)
    seeds, offsets = seeds.to(torch.int64).contiguous(), offsets.to(torch.int64).contiguous()
    _run_over_rows(sk.race_kernel, "race", x, rows, split, logits, max_ptr=row_max, tau_ptr=tau, sums_ptr=sums)
    tokens = torch.empty((B,), dtype=torch.int64, device=device)
    race_args = dict(max_ptr=row_max, tau_ptr=tau, seed_ptr=seeds, offset_ptr=offsets, sums_ptr=sums, out_ptr=tokens)
    finalize_args = dict(_rows(x, rows), LOGITS=logits, PRECISE=precise_math(), **race_args)
    KernelLaunch(sk.race_finalize_kernel, (B,), finalize_args, name="race_finalize").run()
    valid = (rows >= 0) & (rows < R) & (row_max > (float("-inf") if logits else 0.0))
    return torch.where(valid, tokens, -1), valid


def _rowwise(
    kernel: object,
    name: str,
    x: torch.Tensor,  # [B, V] fp32/fp16/bf16
    out_dtype: torch.dtype,
    split: VocabSplit | None,
    thresholds: Mapping[str, object] | None,
    **args: object,
) -> torch.Tensor:
    """[B, V] ``out_dtype``: one elementwise kernel over every row of ``x``, grid (B, NB), after
    the row thresholds when ``thresholds`` (:func:`thresholds_triton`'s filter arguments) is given
    (``tau_ptr``, and ``mass_ptr`` when the kept mass is asked for)."""
    B, V = x.shape
    out = torch.empty((B, V), dtype=out_dtype, device=x.device)
    if B == 0:
        return out
    x = vocab_contiguous(x)
    if split is None:
        split = vocab_split(V, B, x.device)
    if thresholds is not None:
        rows = torch.arange(B, dtype=torch.int64, device=x.device)
        tau, _, kept_mass = thresholds_triton(x, rows, split=split, **thresholds)  # type: ignore[arg-type]
        args = dict(args, tau_ptr=tau, **({"mass_ptr": kept_mass} if kept_mass is not None else {}))
    KernelLaunch(
        kernel,
        (B, split.num_blocks),
        dict(x_ptr=x, stride_r=x.stride(0), out_ptr=out, V=V, chunk=split.chunk, BLOCK_V=split.block_v, **args),
        name=name,
    ).run()
    return out


def renorm_triton(
    *,
    probs: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor | None = None,  # [B] int64, 0 = off
    top_p: torch.Tensor | None = None,  # [B] fp32
    out_dtype: torch.dtype = torch.float32,
    split: VocabSplit | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.sampling.reference.renorm_reference` (one filter)."""
    filters = dict(logits=False, top_k=top_k, top_p=top_p, min_p=None, joint=False, need_kept_mass=True)
    return _rowwise(sk.renorm_kernel, "renorm", probs, out_dtype, split, filters, stride_o=probs.shape[1])


def mask_logits_triton(
    *,
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor,  # [B] int64, 0 = off
    split: VocabSplit | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.sampling.reference.mask_logits_reference`."""
    filters = dict(logits=True, top_k=top_k, top_p=None, min_p=None, joint=False)
    return _rowwise(sk.mask_kernel, "mask", logits, logits.dtype, split, filters, stride_o=logits.shape[1])


def softmax_triton(
    *,
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    temperature: torch.Tensor,  # [B] fp32 (0: one-hot of the argmax)
    split: VocabSplit | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.sampling.reference.softmax_reference` (equal up to
    the rounding of the row sums, whose order differs). Returns [B, V] fp32."""
    B, V = logits.shape
    if B == 0:
        return torch.empty((B, V), dtype=torch.float32, device=logits.device)
    logits = vocab_contiguous(logits)
    rows = torch.arange(B, dtype=torch.int64, device=logits.device)
    if split is None:
        split = vocab_split(V, B, logits.device)
    temperature = temperature.to(torch.float32).contiguous()
    row_max, row_sum, argmax = _row_stats(logits, rows, True, split, temperature)
    return _rowwise(
        sk.softmax_kernel,
        "softmax",
        logits,
        torch.float32,
        split,
        None,
        temp_ptr=temperature,
        max_ptr=row_max,
        sum_ptr=row_sum,
        argmax_ptr=argmax,
        PRECISE=precise_math(),
    )
