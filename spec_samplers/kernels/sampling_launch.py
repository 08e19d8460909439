"""Launchers of the sampling kernels (:mod:`spec_samplers.kernels.sampling_kernels`).

Kernel twins of :mod:`spec_samplers.sampling.reference` on resolved arguments (per-output-row
parameters, seeds and offsets; ``rows`` = the input row of each output). No host
synchronisation; grids depend on shapes only, so a CUDA graph can capture a call.

Each public ``*_triton`` function is a launcher: the one place that calls ``kernel[grid](...)``.
Its *steps* (a generator such as :func:`_sample_steps`) plan the launches in stream order, with
the PyTorch glue between them, and yield each launch; the launcher's loop launches it and resumes
the steps, so the glue after a launch reads what it wrote, and no planning frame is on the stack
at a launch. With ``config.launches`` a list (:class:`~spec_samplers.kernels.backend.LaunchConfig`)
the launches are appended there instead and not run: what the cost model reads on meta tensors.
This module does not import triton: the kernels are imported inside the steps, so importing the
package needs only torch.

Compiled variants: the search kernel has 2 modes x 2 input kinds x mass tracking on/off, the
vocabulary kernels one variant per input kind and flag set; block sizes come from
:func:`spec_samplers.kernels.backend.vocab_split` (BLOCK_V in {256, 512, 1024} on CUDA) and
``sampling_kernels.SEARCH_BLOCK_V``, and the per-step integers (R, chunk, NB) are not specialised on, so a serving
engine whose batch size changes every step compiles a bounded set.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from spec_samplers import rng
from spec_samplers.kernels.backend import LaunchConfig, VocabSplit, plan_vocab_split, vocab_split

if TYPE_CHECKING:
    from spec_samplers.kernels.launch_common import KernelLaunch

#: a launcher's steps: the launches it yields, then what it returns
Steps = Generator["KernelLaunch", None, Any]


class _Planned:
    """The launches of ``steps`` for a launcher's loop, in order; with ``config.launches`` a list
    they are appended there instead (planned, not run). ``value``: what the steps return, set when
    the loop ends."""

    def __init__(self, steps: Steps, config: LaunchConfig | None) -> None:
        self.steps, self.config = steps, config
        self.value: Any = None

    def __iter__(self) -> Iterator[KernelLaunch]:
        sink = None if self.config is None else self.config.launches
        while True:
            try:
                launch = next(self.steps)
            except StopIteration as done:
                self.value = done.value
                return
            if sink is None:
                yield launch
            else:
                sink.append(launch)


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
    from spec_samplers.kernels import sampling_kernels as sk
    from spec_samplers.kernels.launch_common import KernelLaunch

    out = torch.empty((num_rows,), dtype=torch.int64, device=seed.device)
    if num_rows:
        block = 256
        args = dict(seed_ptr=seed, offset_ptr=offset, out_ptr=out, num_rows=num_rows, BLOCK=block)
        launch = KernelLaunch(sk.row_seeds_kernel, (-(-num_rows // block),), args, num_warps=2, name="row_seeds")
        if config is not None and config.launches is not None:
            config.launches.append(launch)
        else:
            sk.row_seeds_kernel[launch.grid](**args, num_warps=launch.num_warps)
    return out


def _stats_launch(
    x: torch.Tensor,  # [R, V], vocab stride 1
    rows: torch.Tensor | None,  # [B] int64 (None: the rows of x)
    logits: bool,
    split: VocabSplit,
    temperature: torch.Tensor | None = None,  # [B] fp32: softmax statistics of x / T
) -> tuple[KernelLaunch, dict[str, torch.Tensor | None]]:
    """``stats_kernel`` and its [B, NB] block partials: max and min of the cleaned values; for
    softmax (``temperature`` given) max of the logits, sum of exp((x - max) / T), argmax instead
    (no min). A missing row has max -inf and min +inf."""
    from spec_samplers.kernels import sampling_kernels as sk
    from spec_samplers.kernels.launch_common import KernelLaunch, precise_math

    B, NB = _outputs(x, rows), split.num_blocks
    softmax = temperature is not None

    def part(dtype: torch.dtype, wanted: bool = True) -> torch.Tensor | None:
        return torch.empty((B, NB), dtype=dtype, device=x.device) if wanted else None

    parts = dict(max_ptr=part(torch.float32), min_ptr=part(torch.float32, not softmax))
    parts.update(sum_ptr=part(torch.float32, softmax), amax_ptr=part(torch.int32, softmax))
    args = dict(_rows(x, rows), **_blocks(split), LOGITS=logits, PRECISE=precise_math(), temp_ptr=temperature)
    return KernelLaunch(sk.stats_kernel, (B, NB), dict(args, SOFTMAX=softmax, **parts), name="stats"), parts


def _search_launch(
    x: torch.Tensor,
    rows: torch.Tensor | None,
    row_max: torch.Tensor,
    lo: torch.Tensor,  # [B] fp32, searched in place (tau when the launch ends)
    hi: torch.Tensor,
    mode: int,
    logits: bool,
    mass: torch.Tensor | None,  # [B] int64 out: mass of the values >= tau (None: not tracked)
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> KernelLaunch:
    """One pivot search (``search_kernel``) on (lo, hi), in place."""
    from spec_samplers.kernels import sampling_kernels as sk
    from spec_samplers.kernels.launch_common import KernelLaunch, precise_math

    B = _outputs(x, rows)
    cap = sk.search_scratch(B, x.shape[1])
    scratch = torch.empty((B, cap), dtype=torch.float32, device=x.device)
    args = dict(
        _rows(x, rows),
        max_ptr=row_max,
        lo_ptr=lo,
        hi_ptr=hi,
        mass_ptr=mass,
        k_ptr=top_k,
        p_ptr=top_p,
        scratch_ptr=scratch,
        cap=cap,
        MODE=mode,
        LOGITS=logits,
        TRACK_MASS=mass is not None,
        BLOCK_V=sk.search_block(x.shape[1]),
        PRECISE=precise_math(),
    )
    return KernelLaunch(sk.search_kernel, (B,), args, num_warps=sk.SEARCH_WARPS, name="search")


def _thresholds_steps(
    x: torch.Tensor,  # [R, V], vocab stride 1
    rows: torch.Tensor | None,  # [B] int64 (None: the rows of x)
    logits: bool,
    top_k: torch.Tensor | None,  # [B] int64, 0 = off
    top_p: torch.Tensor | None,  # [B] fp32
    min_p: torch.Tensor | None,  # [B] fp32
    joint: bool,
    split: VocabSplit,
    need_kept_mass: bool = False,
) -> Steps:
    """Steps of (tau [B] fp32: keep values >= tau, row max [B], kept mass [B] int64 when asked;
    the kept mass is exact when top-p is the last filter or top-k the only one)."""
    from spec_samplers.kernels import sampling_kernels as sk

    stats, parts = _stats_launch(x, rows, logits, split)
    yield stats
    pmax, pmin = parts["max_ptr"], parts["min_ptr"]
    assert pmax is not None and pmin is not None
    row_max, row_min = pmax.amax(dim=1), pmin.amin(dim=1)
    tau = row_min  # (read only: every value is kept)
    kept_mass = None
    B = _outputs(x, rows)
    if top_k is not None:
        tau = row_min.clone()  # searched in place
        track = need_kept_mass and top_p is None
        kept_mass = torch.empty(B, dtype=torch.int64, device=x.device) if track else None
        yield _search_launch(x, rows, row_max, tau, row_max.clone(), sk.MODE_COUNT, logits, kept_mass, top_k=top_k)
    if top_p is not None:
        tau_p = (row_min if joint or top_k is None else tau).clone()
        kept_mass = torch.empty(B, dtype=torch.int64, device=x.device)
        yield _search_launch(x, rows, row_max, tau_p, row_max.clone(), sk.MODE_MASS, logits, kept_mass, top_p=top_p)
        tau = torch.maximum(tau, tau_p)
    if min_p is not None:
        tau = torch.maximum(tau, torch.minimum(min_p * row_max, row_max))
    return tau, row_max, kept_mass


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
    *,
    config: LaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The filters' thresholds alone (tests compare them with the reference's): (tau [B] fp32:
    keep values >= tau, row max [B], kept mass [B] int64 when asked)."""
    plan = _Planned(_thresholds_steps(x, rows, logits, top_k, top_p, min_p, joint, split, need_kept_mass), config)
    for launch in plan:
        launch.kernel[launch.grid](**launch.args, num_warps=launch.num_warps, **launch.options)
    tau, row_max, kept_mass = plan.value
    return tau, row_max, kept_mass


def _sample_steps(
    x: torch.Tensor,
    rows: torch.Tensor | None,
    seeds: torch.Tensor,
    offsets: torch.Tensor,
    logits: bool,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    joint: bool,
    split: VocabSplit | None,
    out_dtype: torch.dtype,
    config: LaunchConfig | None,
) -> Steps:
    """Steps of :func:`sample_triton`: the thresholds, the race's group sums, the race."""
    from spec_samplers.kernels import sampling_kernels as sk
    from spec_samplers.kernels.launch_common import KernelLaunch, precise_math, vocab_contiguous

    V = x.shape[1]
    B = _outputs(x, rows)
    device = x.device
    x = vocab_contiguous(x)
    rows = None if rows is None else rows.to(torch.int64).contiguous()
    split = _split(V, B, device, split, config)
    tau = row_max = None  # unfiltered probabilities: every token is kept, no row statistics
    if logits or top_k is not None or top_p is not None or min_p is not None:
        tau, row_max, _ = yield from _thresholds_steps(x, rows, logits, top_k, top_p, min_p, joint, split)
    sums = torch.empty((B, rng.race_num_groups(V)), dtype=torch.float64, device=device)
    seeds, offsets = seeds.to(torch.int64).contiguous(), offsets.to(torch.int64).contiguous()
    flags = dict(LOGITS=logits, PRECISE=precise_math())
    race_args = dict(_rows(x, rows), **_blocks(split), **flags, max_ptr=row_max, tau_ptr=tau, sums_ptr=sums)
    yield KernelLaunch(sk.race_kernel, (B, split.num_blocks), race_args, name="race")
    tokens = torch.empty((B,), dtype=out_dtype, device=device)
    valid = torch.empty((B,), dtype=torch.bool, device=device)
    finalize_args = dict(
        _rows(x, rows), **flags, max_ptr=row_max, tau_ptr=tau, seed_ptr=seeds, offset_ptr=offsets, sums_ptr=sums
    )
    finalize_args.update(out_ptr=tokens, valid_ptr=valid)
    yield KernelLaunch(sk.race_finalize_kernel, (B,), finalize_args, name="race_finalize")
    return tokens, valid


def sample_triton(
    *,
    x: torch.Tensor,  # [R, V] probabilities or logits (fp32/fp16/bf16)
    rows: torch.Tensor | None,  # [B] int64 input row of each output (None: row b, B = R)
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
    logits: bool = False,
    top_k: torch.Tensor | None = None,  # [B] int64, 0 = off
    top_p: torch.Tensor | None = None,  # [B] fp32
    min_p: torch.Tensor | None = None,  # [B] fp32
    joint: bool = False,
    split: VocabSplit | None = None,
    out_dtype: torch.dtype = torch.int64,  # of the tokens: int32 or int64
    config: LaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of :func:`spec_samplers.sampling.reference.sample_reference`. Returns (tokens
    [B] ``out_dtype``, -1 where invalid; valid [B] bool)."""
    R, B, device = x.shape[0], _outputs(x, rows), x.device
    if R == 0 or B == 0:
        return torch.full((B,), -1, dtype=out_dtype, device=device), torch.zeros(B, dtype=torch.bool, device=device)
    filters = (top_k, top_p, min_p, joint)
    plan = _Planned(_sample_steps(x, rows, seeds, offsets, logits, *filters, split, out_dtype, config), config)
    for launch in plan:
        launch.kernel[launch.grid](**launch.args, num_warps=launch.num_warps, **launch.options)
    tokens, valid = plan.value
    return tokens, valid


def _rowwise_steps(
    kernel: Any,  # a (B, NB) elementwise kernel of sampling_kernels
    name: str,
    x: torch.Tensor,  # [B, V] fp32/fp16/bf16
    out_dtype: torch.dtype,
    split: VocabSplit | None,
    config: LaunchConfig | None,
    thresholds: Mapping[str, Any] | None,
    temperature: torch.Tensor | None = None,  # [B] fp32: softmax of x / T (no thresholds)
) -> Steps:
    """Steps of an elementwise output [B, V] ``out_dtype`` (``kernel``, grid (B, NB)): after the
    row thresholds when ``thresholds`` (:func:`_thresholds_steps`'s filter arguments) is given
    (``tau_ptr``, and ``mass_ptr`` when the kept mass is asked for), else after the softmax
    statistics of ``x / temperature``."""
    from spec_samplers.kernels.launch_common import KernelLaunch, precise_math, vocab_contiguous

    B, V = x.shape
    out = torch.empty((B, V), dtype=out_dtype, device=x.device)
    if B == 0:
        return out
    x = vocab_contiguous(x)
    rows = None  # output row b is input row b
    split = _split(V, B, x.device, split, config)
    args: dict[str, Any] = dict(x_ptr=x, stride_r=x.stride(0), out_ptr=out, V=V, chunk=split.chunk)
    args.update(BLOCK_V=split.block_v)
    if temperature is not None:
        # the statistics' block partials, combined by the softmax kernel itself
        temperature = temperature.to(torch.float32).contiguous()
        stats, parts = _stats_launch(x, rows, True, split, temperature)
        yield stats
        args.update(temp_ptr=temperature, NB=split.num_blocks, PRECISE=precise_math())
        args.update(max_ptr=parts["max_ptr"], sum_ptr=parts["sum_ptr"], amax_ptr=parts["amax_ptr"])
    else:
        assert thresholds is not None
        tau, _, kept_mass = yield from _thresholds_steps(x, rows, split=split, **thresholds)
        args.update(stride_o=V, tau_ptr=tau, **({"mass_ptr": kept_mass} if kept_mass is not None else {}))
    yield KernelLaunch(kernel, (B, split.num_blocks), args, name=name)
    return out


def renorm_triton(
    *,
    probs: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor | None = None,  # [B] int64, 0 = off
    top_p: torch.Tensor | None = None,  # [B] fp32
    out_dtype: torch.dtype = torch.float32,
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.sampling.reference.renorm_reference` (one filter)."""
    from spec_samplers.kernels import sampling_kernels as sk

    filters = dict(logits=False, top_k=top_k, top_p=top_p, min_p=None, joint=False, need_kept_mass=True)
    plan = _Planned(_rowwise_steps(sk.renorm_kernel, "renorm", probs, out_dtype, split, config, filters), config)
    for launch in plan:
        launch.kernel[launch.grid](**launch.args, num_warps=launch.num_warps, **launch.options)
    out: torch.Tensor = plan.value
    return out


def mask_logits_triton(
    *,
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor,  # [B] int64, 0 = off
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.sampling.reference.mask_logits_reference`."""
    from spec_samplers.kernels import sampling_kernels as sk

    filters = dict(logits=True, top_k=top_k, top_p=None, min_p=None, joint=False)
    plan = _Planned(_rowwise_steps(sk.mask_kernel, "mask", logits, logits.dtype, split, config, filters), config)
    for launch in plan:
        launch.kernel[launch.grid](**launch.args, num_warps=launch.num_warps, **launch.options)
    out: torch.Tensor = plan.value
    return out


def softmax_triton(
    *,
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    temperature: torch.Tensor,  # [B] fp32 (0: one-hot of the argmax)
    split: VocabSplit | None = None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Kernel twin of :func:`spec_samplers.sampling.reference.softmax_reference` (equal up to
    the rounding of the row sums, whose order differs). Returns [B, V] fp32."""
    from spec_samplers.kernels import sampling_kernels as sk

    steps = _rowwise_steps(sk.softmax_kernel, "softmax", logits, torch.float32, split, config, None, temperature)
    plan = _Planned(steps, config)
    for launch in plan:
        launch.kernel[launch.grid](**launch.args, num_warps=launch.num_warps, **launch.options)
    out: torch.Tensor = plan.value
    return out
