"""Launch helpers shared by the launchers: planned launches, vocabulary contiguity, arrival
counters, the math flag.

A launcher first *plans* its launches (:class:`KernelLaunch`: kernel, grid, keyword arguments),
then launches them in its own body (or hands them to a ``LaunchConfig.launches`` list). Planning
is a pure function of the inputs' shapes, dtypes and which optional tensors are present, so
``tests/kernel_compile_check.py`` compiles exactly the variants the launchers can reach, and a
test counts the variants a changing batch size can produce.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from spec_samplers.kernels.backend import interpreting


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
    """The current stream of ``device`` (0 off CUDA), or None while it captures a CUDA graph."""
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
    # fake tensors (a tool tracing shapes, FakeTensorMode) are never kept for real calls
    if stream is None or _tracing_fake():
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
    if stream is None or _tracing_fake():
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
