"""Bytes each Triton launch loads and stores, counted by the interpreter (``TRITON_INTERPRET=1``).

:func:`counting` hooks the interpreter's load and store builders: every masked-in lane of every
``tl.load`` / ``tl.store`` (atomics too) is attributed to the launch argument whose storage holds
its address, and to the source line that issued it (the first frame outside Triton: the
``tl.load`` call in the kernel or in a jit helper it inlines). Counts per launch and argument:
bytes of every lane (``*_lanes``) and of distinct addresses (``*_unique``, what DRAM serves when
repeats hit the cache); per source line: calls (loop iterations over all programs) and lanes.

A launch whose last program per request runs a tail (:mod:`.tails`) is counted as two: the
loads and stores made under its tail function (its frame on the Python stack: the interpreter
runs a kernel's jit helpers as Python functions) go to a second count named for the tail.

The numbers are exact for the shape that ran; :func:`scale` takes two runs at vocabulary sizes
V1 < V2 (same batch) to the full shape.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class TensorTraffic:
    path: str  # argument path, e.g. "seqs[0][0]"
    shape: list[int]
    itemsize: int
    load_lanes: int = 0
    store_lanes: int = 0
    load_unique: int = 0
    store_unique: int = 0
    _loaded: list[np.ndarray] = field(default_factory=list, repr=False)
    _stored: list[np.ndarray] = field(default_factory=list, repr=False)

    def finish(self) -> None:
        for kind, parts in (("load", self._loaded), ("store", self._stored)):
            distinct = np.unique(np.concatenate(parts)).size if parts else 0
            setattr(self, f"{kind}_unique", distinct * self.itemsize)
        self._loaded, self._stored = [], []

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


@dataclass
class Site:
    file: str
    line: int
    kind: str  # "load" or "store"
    itemsize: int
    calls: int = 0
    lanes: int = 0  # every lane of every call, masked-off ones included (the loop's width)
    active: int = 0  # masked-in lanes

    @property
    def key(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"


@dataclass
class LaunchCount:
    name: str
    grid: list[int]
    tensors: list[TensorTraffic]
    sites: dict[tuple[str, int, str], Site] = field(default_factory=dict)
    _ranges: list[tuple[int, int, TensorTraffic]] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "grid": self.grid,
            "tensors": [t.as_dict() for t in self.tensors],
            "sites": [vars(s) | {"key": s.key} for s in self.sites.values()],
        }


@dataclass(frozen=True)
class TailSplit:
    """The loads and stores of a launch made under the tail function (code name ``function`` in
    ``file``) are counted as the launch ``name`` on the first ``axes`` axes of the grid."""

    function: str
    file: str
    name: str
    axes: int


def _flatten(path: str, value: Any, out: list[tuple[str, torch.Tensor]]) -> None:
    if isinstance(value, torch.Tensor):
        out.append((path, value))
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            _flatten(f"{path}[{i}]", v, out)


@functools.cache
def _triton_dir() -> str:
    import triton

    return os.path.dirname(os.path.abspath(triton.__file__ or "")) + os.sep


def _call_site(tail: TailSplit | None) -> tuple[str, int, bool]:
    """(file, line) of the first frame outside Triton and this module: the tl.load call; and
    whether the ``tail`` function is on the stack."""
    frame: Any = sys._getframe(2)
    site = None
    while frame is not None:
        code = frame.f_code
        if site is None and not code.co_filename.startswith(_triton_dir()) and code.co_filename != __file__:
            site = code.co_filename, frame.f_lineno
            if tail is None:
                break
        if tail is not None and code.co_name == tail.function and os.path.abspath(code.co_filename) == tail.file:
            return (*(site or ("?", 0)), True)
        frame = frame.f_back
    return (*(site or ("?", 0)), False)


@contextlib.contextmanager
def counting(tails: dict[str, TailSplit] | None = None) -> Iterator[list[LaunchCount]]:
    """Count the traffic of every interpreted launch inside the block; a launch named in
    ``tails`` (kernel name -> its tail) as two counts, the launch's then its tail's."""
    from triton.runtime import interpreter as ti

    counts: list[LaunchCount] = []
    builder_cls = ti.InterpreterBuilder
    originals = {
        "call": ti.GridExecutor.__call__,
        "load": builder_cls.create_masked_load,
        "store": builder_cls.create_masked_store,
        "rmw": builder_cls.create_atomic_rmw,
        "cas": builder_cls.create_atomic_cas,
    }

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        params = inspect.signature(self.fn).parameters
        bound = inspect.signature(self.fn).bind_partial(*args, **{k: v for k, v in kwargs.items() if k in params})
        found: list[tuple[str, torch.Tensor]] = []
        for name, value in bound.arguments.items():
            _flatten(name, value, found)
        grid = [int(g) for g in (self.grid(bound.arguments) if callable(self.grid) else self.grid)]
        split = (tails or {}).get(self.fn.__name__)
        launch = LaunchCount(self.fn.__name__, grid, [])
        parts = [launch] if split is None else [launch, LaunchCount(split.name, grid[: split.axes], [])]
        for part in parts:
            seen: set[int] = set()
            for path, tensor in found:
                storage = tensor.untyped_storage()
                start = storage.data_ptr()
                if start in seen:  # a second view of the same storage: its traffic goes to the first
                    continue
                seen.add(start)
                traffic = TensorTraffic(path, list(tensor.shape), tensor.element_size())
                part.tensors.append(traffic)
                part._ranges.append((start, start + storage.nbytes(), traffic))
        counts.extend(parts)
        current[:] = [launch, parts[-1], split]
        try:
            return originals["call"](self, *args, **kwargs)
        finally:
            for part in parts:
                for t in part.tensors:
                    t.finish()

    current: list[Any] = []  # the launch being counted, its tail's count (or itself), its TailSplit

    def tally(kind: str, ptrs: Any, mask: Any) -> None:
        if not current:
            return
        body, tail, split = current
        file, line, in_tail = _call_site(split)
        launch = tail if in_tail else body
        addresses = np.asarray(ptrs.data).reshape(-1).astype(np.uint64)
        active = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.asarray(ptrs.data).shape).reshape(-1)
        itemsize = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        site = launch.sites.setdefault((file, line, kind), Site(file, line, kind, itemsize))
        site.calls += 1
        site.lanes += addresses.size
        site.active += int(active.sum())
        used = addresses[active]
        for start, end, traffic in launch._ranges:
            inside = used[(used >= start) & (used < end)]
            if inside.size:
                if kind == "load":
                    traffic.load_lanes += inside.size * itemsize
                    traffic._loaded.append(inside)
                else:
                    traffic.store_lanes += inside.size * itemsize
                    traffic._stored.append(inside)

    def load(self: Any, ptrs: Any, mask: Any, *rest: Any) -> Any:
        tally("load", ptrs, mask)
        return originals["load"](self, ptrs, mask, *rest)

    def store(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        tally("store", ptrs, mask)
        return originals["store"](self, ptrs, value, mask, *rest)

    def rmw(self: Any, op: Any, ptr: Any, val: Any, mask: Any, *rest: Any) -> Any:
        tally("load", ptr, mask)
        tally("store", ptr, mask)
        return originals["rmw"](self, op, ptr, val, mask, *rest)

    ti.GridExecutor.__call__ = call
    builder_cls.create_masked_load = load
    builder_cls.create_masked_store = store
    builder_cls.create_atomic_rmw = rmw
    try:
        yield counts
    finally:
        ti.GridExecutor.__call__ = originals["call"]
        builder_cls.create_masked_load = originals["load"]
        builder_cls.create_masked_store = originals["store"]
        builder_cls.create_atomic_rmw = originals["rmw"]


def _linear(v1: float, y1: float, v2: float, y2: float, v: float) -> float:
    return max(0.0, y1 + (y2 - y1) * (v - v1) / (v2 - v1))


def scale(
    small: tuple[dict[str, Any], dict[str, Any]],  # one launch counted at (B_s, V1) and (B_s, V2)
    sizes: tuple[int, int, int],  # V1, V2, V of the full shape
    batch: tuple[int, int],  # B_s, B of the full shape
    full_tensors: dict[str, list[int]],  # argument path -> shape at full shape
) -> dict[str, Any]:
    """Bytes and per-line lanes of one launch at full shape.

    Arguments with a vocabulary axis (last dim V at the small shape): bytes per request are
    linear in V (a pass over rows plus a fixed re-read), fitted through the two runs and
    multiplied by the batch ratio. Other arguments: the fraction of the tensor touched at V2
    times its full-shape size. Line lanes: linear in V per request, as vocabulary bytes."""
    (a, b), (v1, v2, v), (bs, bf) = small, sizes, batch
    ratio = bf / bs
    loaded = stored = vocab_loaded = vocab_stored = 0.0
    by_path_a = {t["path"]: t for t in a["tensors"]}
    for t in b["tensors"]:
        ta = by_path_a.get(t["path"])
        if t["shape"] and t["shape"][-1] == v2 and ta is not None:
            ld = ratio * _linear(v1, ta["load_unique"], v2, t["load_unique"], v)
            st = ratio * _linear(v1, ta["store_unique"], v2, t["store_unique"], v)
            vocab_loaded += ld
            vocab_stored += st
        else:
            full_shape = full_tensors.get(t["path"])
            size = int(np.prod(t["shape"])) * t["itemsize"] if t["shape"] else t["itemsize"]
            full = int(np.prod(full_shape)) * t["itemsize"] if full_shape else size
            ld, st = t["load_unique"] / max(size, 1) * full, t["store_unique"] / max(size, 1) * full
        loaded += ld
        stored += st
    sites_a = {s["key"] + s["kind"]: s for s in a["sites"]}
    sites = []
    for s in b["sites"]:
        sa = sites_a.get(s["key"] + s["kind"])
        lanes = ratio * _linear(v1, sa["lanes"], v2, s["lanes"], v) if sa else s["lanes"] * ratio
        sites.append(dict(file=s["file"], line=s["line"], kind=s["kind"], itemsize=s["itemsize"], lanes=lanes))
    return dict(
        bytes_loaded=loaded,
        bytes_stored=stored,
        vocab_bytes_loaded=vocab_loaded,
        vocab_bytes_stored=vocab_stored,
        sites=sites,
    )
