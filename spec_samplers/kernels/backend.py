"""Which backend runs a call, how the vocabulary is split across program instances, and what every
launcher shares: planned launches and the recording hook (:func:`recorded`), the plans and
workspaces kept per shape and stream (:func:`plan_cache`), the arrival counters.

A launcher looks its plan up once per call (what shapes decide: splits, grids, constexprs,
persistent workspaces), binds the call's tensors and launches each kernel where it names it
(``residual_partials_kernel[grid](**args)``), or, with ``config.launches`` a list, appends the
planned launch there instead and runs nothing (:func:`recorded`): what the cost model and the
launch counts read on meta or CPU tensors. A plan is a pure function of the inputs' shapes,
strides and which optional tensors are present, so ``tests/kernel_compile_check.py`` compiles
exactly the variants the launchers can reach.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from spec_samplers.rng import chunk_alignment

BACKENDS = ("auto", "torch", "triton")


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:
        return False
    return True


def check_backend(backend: object) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    return str(backend)


def use_triton(backend: str, device: torch.device, config: LaunchConfig | None = None) -> bool:
    """Resolve a sampler's ``backend`` option for tensors on ``device``.

    "auto": the kernels on CUDA when triton imports, else the PyTorch path. "torch": always
    the PyTorch path. "triton": always the kernels; CPU tensors only under TRITON_INTERPRET=1.
    With ``config.kernels`` (a tool planning our launches, :func:`planned_for`) the kernels'
    plan on any device, meta tensors included, unless "torch".
    """
    if config is not None and config.kernels and backend != "torch":
        return True
    if backend == "torch" or device.type == "meta":
        return False  # (meta tensors carry shapes only: the PyTorch path propagates them)
    if backend == "auto":
        return device.type == "cuda" and triton_importable()
    if not triton_importable():
        raise RuntimeError("backend='triton': triton is not importable; use backend='torch' or 'auto'")
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(
            f"backend='triton': tensors are on {device}, and Triton kernels run on CUDA only; set "
            "TRITON_INTERPRET=1 before importing triton to run them on CPU (slow, for tests), or use "
            "backend='torch' or 'auto'"
        )
    return True


@dataclass(frozen=True)
class LaunchConfig:
    """Device facts and choices a call's launches are planned with, passed to the launchers as
    their ``config=`` argument rather than read from patched globals: what a tool that plans
    launches for a GPU it does not have (the cost model, on meta tensors) needs. A tool sets it
    with :func:`planned_for`.

    The default (every field None/False) is what a call on a real device does."""

    #: streaming multiprocessors of the device planned for (None: the tensors' own device)
    num_sms: int | None = None
    #: plan the Triton launches even where the backend would run PyTorch (meta tensors)
    kernels: bool = False
    #: when a list, the planned launches are appended to it and not run (meta tensors carry no data)
    launches: list[Any] | None = None


_CONFIG: contextvars.ContextVar[LaunchConfig | None] = contextvars.ContextVar("launch_config", default=None)


@contextlib.contextmanager
def planned_for(config: LaunchConfig) -> Iterator[LaunchConfig]:
    """Calls inside the block plan their launches with ``config``: a tool's way to hand a
    :class:`LaunchConfig` to calls it does not make itself (a sampler inside a decoding loop). Read
    once per call, at the edge (:func:`launch_config`), then passed down as the launchers'
    ``config=`` argument."""
    token = _CONFIG.set(config)
    try:
        yield config
    finally:
        _CONFIG.reset(token)


def launch_config() -> LaunchConfig | None:
    """The :class:`LaunchConfig` of the enclosing :func:`planned_for` block, or None.

    None while Dynamo traces: a traced call becomes the custom op anyway, and Dynamo (torch 2.13)
    cannot trace ``ContextVar.get``."""
    if torch.compiler.is_compiling():
        return None
    return _CONFIG.get()


def recorded(config: LaunchConfig | None, launch: KernelLaunch) -> bool:
    """The recording hook: True when ``config.launches`` is a list, ``launch`` then appended there
    (planned, not run) and the launcher skips its ``kernel[grid](...)``."""
    if config is None or config.launches is None:
        return False
    config.launches.append(launch)
    return True


@dataclass(frozen=True)
class VocabSplit:
    block_v: int  # elements per vector step (power of two)
    chunk: int  # vocab entries per program instance (a multiple of rng.chunk_alignment(block_v))
    num_blocks: int  # NB = ceil(V / chunk), every block non-empty


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


#: at most this many vocab blocks per request: keeps the combine kernels' [K+1, NB] tiles small
MAX_VOCAB_BLOCKS = 256


def vocab_split(
    vocab_size: int,
    num_requests: int,
    device: torch.device,
    block_v: int | None = None,
    num_blocks: int | None = None,
    wide_steps: bool = False,
    num_sms: int | None = None,
) -> VocabSplit:
    """Split V across NB program instances per request so that B * NB fills the GPU (about
    four programs per SM) even at B = 1. A pure function of shapes: fixed grids for fixed shapes.

    ``block_v`` / ``num_blocks`` override the choice (tests use them to cross block boundaries);
    ``wide_steps``: see :func:`plan_vocab_split`; ``num_sms`` (``LaunchConfig.num_sms``): plan
    for a CUDA device with that many multiprocessors, whatever ``device`` is (meta tensors)."""
    programs, widest = device_programs(device, num_sms)
    return plan_vocab_split(vocab_size, num_requests, programs, widest, block_v, num_blocks, wide_steps)


def vocab_splits(
    vocab_size: int,
    num_requests: int,
    device: torch.device,
    num_sms: int | None = None,
    rows_per_request: int = 1,
) -> tuple[VocabSplit, VocabSplit]:
    """The two splits of a verification call, from one reading of the device: (the split of the
    passes that only store partials, one program row per (request, position): sized by
    ``num_requests * rows_per_request`` rows (B * (K+1)), narrow vector steps at small B; the
    split of a pass whose last program per request finishes the request, ``wide_steps``: see
    :func:`plan_vocab_split`)."""
    programs, widest = device_programs(device, num_sms)
    return (
        plan_vocab_split(vocab_size, num_requests * rows_per_request, programs, widest),
        plan_vocab_split(vocab_size, num_requests, programs, widest, wide_steps=True),
    )


def device_programs(device: torch.device, num_sms: int | None = None) -> tuple[int, int]:
    """(programs the device should run at once, widest vector step) of :func:`plan_vocab_split`:
    four per SM and 1024 on CUDA (``num_sms``: that many SMs, whatever ``device`` is)."""
    if num_sms is None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        num_sms = _num_sms(index)
    if num_sms is not None:
        return 4 * num_sms, 1024
    # The interpreter runs programs one by one: few blocks there, but more than one.
    return 2, 512


#: the vector widths a launch can use: a changing batch size reaches at most these three
BLOCK_V_CHOICES = (256, 512, 1024)


@functools.lru_cache(maxsize=4096)  # pure, and planned at every call: a changing B reaches few keys
def plan_vocab_split(
    vocab_size: int,
    num_requests: int,
    target_programs: int,
    widest: int,
    block_v: int | None = None,
    num_blocks: int | None = None,
    wide_steps: bool = False,
) -> VocabSplit:
    """:func:`vocab_split` for a device that should run ``target_programs`` programs at once and
    vector steps of at most ``widest`` (1024 on CUDA). Pure: tests enumerate it.

    ``wide_steps`` keeps steps of ``widest`` at every B (4 warps on CUDA) instead of narrowing
    them at small B: for a launch whose last program per request finishes the request, a tail
    that runs on the program's warps."""
    if num_blocks is None:
        num_blocks = -(-target_programs // max(num_requests, 1))
    if block_v is None and wide_steps:
        block_v = widest
    if block_v is None:
        # Wide vector steps when each program has a long chunk, narrower ones (down to 256) when
        # the vocabulary must be cut finely to fill the GPU at small B.
        per_block = -(-vocab_size // max(1, min(num_blocks, MAX_VOCAB_BLOCKS)))
        block_v = widest
        while block_v > BLOCK_V_CHOICES[0] and block_v > per_block:
            block_v //= 2
    block_v = max(16, min(block_v, triton_next_pow2(vocab_size)))
    max_blocks = min(-(-vocab_size // block_v), MAX_VOCAB_BLOCKS)
    num_blocks = max(1, min(num_blocks, max_blocks))
    align = chunk_alignment(block_v)
    chunk = _ceil_div(_ceil_div(vocab_size, num_blocks), align) * align
    return VocabSplit(block_v, chunk, _ceil_div(vocab_size, chunk))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def combine_warps(block_k: int, block_nb: int) -> int:
    """Warps of the per-request combine kernels, whose tiles are [BLOCK_K, BLOCK_NB]."""
    return 1 if block_k * block_nb <= 1024 else 4


def combine_blocks(num_positions: int, num_blocks: int) -> tuple[int, int, int]:
    """(BLOCK_K, BLOCK_NB, num_warps) of a per-request combine kernel over ``num_positions``
    positions and ``num_blocks`` vocab-block partials: powers of two, so a batch size that changes
    every step reaches at most log2(MAX_VOCAB_BLOCKS) + 1 = 9 BLOCK_NB values."""
    block_k = triton_next_pow2(num_positions)
    block_nb = triton_next_pow2(num_blocks)
    return block_k, block_nb, combine_warps(block_k, block_nb)


def triton_next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# -- what every launcher shares: planned launches, plans and workspaces per shape and stream ------


@dataclass
class KernelLaunch:
    """One planned kernel launch: ``kernel[grid](**args, num_warps=num_warps, **options)``."""

    kernel: Any  # a triton JITFunction
    grid: tuple[int, ...]
    args: dict[str, Any]
    num_warps: int = 4
    name: str = field(default="")
    #: compile options beyond num_warps (e.g. enable_fp_fusion=False), also used by the compile check
    options: dict[str, Any] = field(default_factory=dict)


def vocab_contiguous(t: torch.Tensor) -> torch.Tensor:
    """Kernels step through the vocabulary with unit stride; other layouts are copied once."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


#: (device, stream) -> int32 arrival counters, all 0 between launches (the last program resets its own)
_ARRIVALS: dict[tuple[str, int | None, int], torch.Tensor] = {}


def _tracing_fake() -> bool:
    """True under a FakeTensorMode (tools/direct_path.py counts launches on fake tensors)."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


def _stream_key(device: torch.device) -> int | None:
    """The current stream of ``device`` (0 off CUDA), or None where nothing may be kept for later
    calls: while the stream captures a CUDA graph, or under a FakeTensorMode (a tool tracing
    shapes)."""
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:  # (_tracing_fake, inline)
        return None
    if device.type != "cuda":
        return 0
    if torch.cuda.is_current_stream_capturing():
        return None
    return torch.cuda.current_stream(device).cuda_stream


#: (plan, shape key, device, stream) -> a plan's persistent workspaces, least recently used first
_WORKSPACES: OrderedDict[tuple[Any, ...], tuple[torch.Tensor | None, ...]] = OrderedDict()
#: planned shapes kept: an engine's batch size changes every step, so the oldest are dropped
MAX_WORKSPACE_SHAPES = 64


def workspaces(
    plan: str,
    key: Hashable,  # everything the workspaces' shapes and dtypes depend on
    device: torch.device,
    make: Callable[[], tuple[torch.Tensor | None, ...]],
) -> tuple[torch.Tensor | None, ...]:
    """A plan's intermediates (partials, row statistics: what one launch writes and a later
    launch of the same call reads), allocated once per (shape, device, stream) instead of at every
    call: ``make()`` on the first call of a shape. Launches on one stream run in order, so the
    next call's writes come after this call's reads; two calls in flight on different streams get
    different buffers. A stream capturing a CUDA graph gets fresh ones (the graph keeps them; an
    eager call must not write them between replays)."""
    stream = _stream_key(device)
    if stream is None:  # capturing, or fake tensors (never kept for real calls)
        return make()
    full = (plan, key, device.type, device.index, stream)
    found = _WORKSPACES.get(full)  # (the hit inline: a warm call's path is one function shorter)
    if found is None:
        return _keep(_WORKSPACES, full, make)
    _WORKSPACES.move_to_end(full)
    return found


def _keep(table: OrderedDict[tuple[Any, ...], Any], full: tuple[Any, ...], make: Callable[[], Any]) -> Any:
    """A miss of ``table[full]``: ``make()``, kept; the least recently used entry goes past
    MAX_WORKSPACE_SHAPES."""
    found = table[full] = make()
    if len(table) > MAX_WORKSPACE_SHAPES:
        table.popitem(last=False)
    return found


#: (plan, key, device, stream) -> what a plan decides from shapes alone, least recently used first
_PLANS: OrderedDict[tuple[Any, ...], Any] = OrderedDict()


def plan_cache(plan: str, key: Hashable, device: torch.device, make: Callable[[], Any]) -> Any:
    """A plan's shape-only part (splits, grids, constexprs, persistent workspaces: what ``make()``
    returns), made once per (``key``, device, stream) so that a warm call only allocates its
    outputs and binds its tensors. ``key`` holds everything ``make()`` reads, the planned-for SM
    count included (a different ``LaunchConfig`` is a different key). Its workspaces follow
    :func:`workspaces`' rules: a stream capturing a CUDA graph, or a tool tracing on fake tensors,
    gets a fresh plan that is never kept."""
    stream = _stream_key(device)
    if stream is None:
        return make()
    full = (plan, key, device.type, device.index, stream)
    found = _PLANS.get(full)
    if found is None:
        return _keep(_PLANS, full, make)
    _PLANS.move_to_end(full)
    return found


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """[>= n] int32 zeros: one arrival counter per request for a launch whose last program per
    request finishes it (:func:`spec_samplers.kernels.common.last_to_arrive`).

    The last program resets its counter, so a buffer is all zero again when its launch ends and
    one buffer serves every launch of its stream in turn: one per (device, stream), no memset
    per call. Two launches that may run at once must be on different streams (they are then
    given different buffers). A buffer too small is replaced by a larger one, except while a
    CUDA graph is being captured: the graph then gets its own zeroed buffer (a memset node)."""
    if _tracing_fake() or device.type == "meta":
        # a tool counting a warm call's ops on fake or meta tensors: a warm call finds its buffer
        # kept (no op); such a buffer holds no data, so it is never kept (nor read as counters)
        return torch.empty(max(n, 1), dtype=torch.int32, device=device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    buf = _ARRIVALS.get(key)
    if buf is not None and buf.numel() >= n:
        return buf
    size = max(1024, 1 << max(n - 1, 0).bit_length())
    fresh = torch.zeros(size, dtype=torch.int32, device=device)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return fresh
    _ARRIVALS[key] = fresh
    return fresh


def precise_math() -> bool:
    """libdevice exp/log when compiled; the interpreter has no libdevice."""
    return not interpreting()
