"""What a call launches, and the eager PyTorch ops it runs.

**Our launches** are planned, not caught: :func:`tracing` runs the call inside
``backend.planned_for(LaunchConfig(num_sms=N, kernels=True, launches=sink))``, so the samplers
and the sampling operations take their kernel path on meta tensors too, their launchers plan the
vocabulary split of a GPU with N multiprocessors and append what they would launch
(``backend.KernelLaunch``: kernel, grid, arguments by name, warps, options) to the sink
instead of running it. Nothing of the package is patched or rebound.

**Peers' launches** (vLLM's Triton kernels, code we do not own) take no such argument: they are
caught where Triton launches, by :func:`recording`, which replaces ``run`` of Triton's
``JITFunction`` (compiled mode) and ``InterpretedFunction`` (``TRITON_INTERPRET=1``) for the
block. Triton has no official hook that fits (``JITFunction.add_pre_run_hook`` and
``knobs.runtime.launch_enter_hook`` run only on a device with an active driver, after or on the
way to the launch, and cannot skip it; meta tensors cannot be launched). A spec_samplers kernel
that reaches it while :func:`tracing` is an error: its launcher ignored ``config.launches``.

:class:`EagerOps` is a dispatch mode that records every PyTorch op with its bytes read and
written; ops whose tensors hold at least a vocabulary row are flagged. :class:`OpCounter` counts
the ops of a call that launch a kernel on a GPU (:func:`launches_kernel`) and its host
synchronisations (tests/test_host_syncs.py, benchmarks/host_overhead.py); the cost model counts
the same ops as launches.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from spec_samplers.kernels import backend


@dataclass
class Launch:
    """One kernel launch: ``kernel[grid](**args, num_warps=num_warps, **options)``."""

    kernel: Any  # triton JITFunction or InterpretedFunction
    grid: tuple[int, ...]
    #: the kernel's parameters by name (launch options such as num_warps left out)
    args: dict[str, Any]
    num_warps: int = 4
    #: compile options beyond num_warps (e.g. enable_fp_fusion=False)
    options: dict[str, Any] = field(default_factory=dict)
    #: index of the eager op recorded just before this launch (the launch order among eager ops)
    after_op: int = -1
    #: the tail of the launch before it, measured on its own (:mod:`.tails`)
    tail: bool = False

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    @property
    def module(self) -> str:
        return _module_of(self.kernel)

    @property
    def programs(self) -> int:
        n = 1
        for g in self.grid:
            n *= int(g)
        return n

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """(argument path, tensor) of every tensor argument, tuples flattened."""
        found: list[tuple[str, torch.Tensor]] = []

        def walk(path: str, value: Any) -> None:
            if isinstance(value, torch.Tensor):
                found.append((path, value))
            elif isinstance(value, tuple):
                for i, v in enumerate(value):
                    walk(f"{path}[{i}]", v)

        for name, value in self.args.items():
            walk(name, value)
        return found


def _module_of(kernel: Any) -> str:
    """The module of a kernel's Python function; "" where Triton 3.9 or an ``exec``-built kernel
    (an older vLLM's, :func:`.workloads._old_vllm_kernel`) leaves ``__module__`` None."""
    return getattr(kernel.fn, "__module__", None) or ""


def planned(launch: Any, after_op: int = -1) -> Launch:
    """The :class:`Launch` of one of our launchers' planned launches (``backend.KernelLaunch``)."""
    grid = tuple(int(g) for g in launch.grid)
    return Launch(launch.kernel, grid, dict(launch.args), launch.num_warps, dict(launch.options), after_op)


class _Sink(list[Any]):
    """``LaunchConfig.launches`` of :func:`tracing`: what our launchers append becomes a
    :class:`Launch`, stamped with its place among the eager ops."""

    def __init__(self, ops: EagerOps | None) -> None:
        super().__init__()
        self.ops = ops

    def _after(self) -> int:
        return len(self.ops.records) - 1 if self.ops is not None else -1

    def append(self, launch: Any) -> None:
        super().append(launch if isinstance(launch, Launch) else planned(launch, self._after()))

    def extend(self, launches: Iterable[Any]) -> None:
        for launch in launches:
            self.append(launch)

    def __iadd__(self, launches: Iterable[Any]) -> _Sink:  # type: ignore[misc]
        self.extend(launches)
        return self


@contextlib.contextmanager
def tracing(num_sms: int, ops: EagerOps | None = None, peers: bool = False) -> Iterator[list[Launch]]:
    """Every launch the block makes, in order, none run: ours planned for a CUDA device with
    ``num_sms`` multiprocessors (their launchers' ``config=``: :class:`LaunchConfig`), and with
    ``peers`` the peers' kernels caught by :func:`recording` (a workload that runs vLLM's)."""
    sink = _Sink(ops)
    config = backend.LaunchConfig(num_sms=num_sms, kernels=True, launches=sink)
    peer_launches = recording(execute=False, ops=ops, into=sink) if peers else contextlib.nullcontext()
    with backend.planned_for(config), peer_launches:
        yield sink


@functools.cache
def _signature(fn: Any) -> inspect.Signature:
    return inspect.signature(fn)


def _bound(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the kernel's parameters by name, defaults filled; the launch options) of ``kernel[grid](*args, **kwargs)``."""
    signature = _signature(kernel.fn)  # (cached: host_overhead.py times calls with peers' launches recorded)
    named = dict(zip(signature.parameters, args))
    named.update({k: v for k, v in kwargs.items() if k in signature.parameters})
    for name, param in signature.parameters.items():
        if name not in named and param.default is not param.empty:
            named[name] = param.default
    return named, {k: v for k, v in kwargs.items() if k not in signature.parameters}


def _grid(grid: Any, named: dict[str, Any]) -> tuple[int, ...]:
    if callable(grid):
        grid = grid(named)
    return tuple(int(g) for g in grid)


@contextlib.contextmanager
def recording(execute: bool, ops: EagerOps | None = None, into: list[Launch] | None = None) -> Iterator[list[Launch]]:
    """Record every peer's Triton launch made inside the block (and run it when ``execute``), at
    Triton's launch path: for kernels that are not ours (vLLM's), which take no ``config=``.
    Appends to ``into`` when given (:func:`tracing`: one list in call order)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = [] if into is None else into
    originals = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}

    def patched(cls: type) -> Callable[..., Any]:
        original = originals[cls]

        def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            if warmup:
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
            planning = backend.launch_config()
            module = _module_of(self)
            if module.split(".")[0] == "spec_samplers" and planning and planning.launches is not None:
                raise RuntimeError(
                    f"{module}.{self.fn.__name__} was launched while its launches were "
                    "being planned: its launcher ignored LaunchConfig.launches"
                )
            named, options = _bound(self, args, kwargs)
            after = len(ops.records) - 1 if ops is not None else -1
            num_warps = int(options.pop("num_warps", 4))
            launches.append(Launch(self, _grid(grid, named), named, num_warps, options, after))
            if execute:
                with ops.paused() if ops is not None else contextlib.nullcontext():
                    original(self, *args, grid=grid, warmup=False, **kwargs)
            return None

        return run

    for cls in originals:
        cls.run = patched(cls)
    try:
        yield launches
    finally:
        for cls, original in originals.items():
            cls.run = original


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class EagerOp:
    name: str
    bytes_read: int
    bytes_written: int
    #: the largest tensor it touches, in elements
    largest: int
    #: a new tensor at least half a vocabulary row long (not a view, not in place)
    creates_vocab_tensor: bool
    vocab_sized: bool
    #: CUDA blocks of the kernel PyTorch launches for it when that is fewer than a full grid
    #: (a row softmax: one per row); None: enough blocks to fill the GPU
    blocks: int | None = None
    #: it launches a kernel on a GPU (:func:`launches_kernel`: what :class:`OpCounter` counts)
    launches: bool = True


#: ops that move no data (views, metadata, allocation without initialisation)
_NO_TRAFFIC = ("aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::set_")
#: in-place ops that overwrite their first argument without reading it: a copy's destination, a
#: fill, the in-place random draws (their CUDA kernels write every element from the generator)
_WRITE_ONLY_SELF = (
    "aten::copy_",
    "aten::fill_",
    "aten::zero_",
    "aten::exponential_",
    "aten::uniform_",
    "aten::normal_",
    "aten::random_",
    "aten::geometric_",
    "aten::cauchy_",
    "aten::log_normal_",
)
#: gathers: they read the gathered elements of their first argument (as many as they write) and
#: their indices, not the whole source
_GATHERS = ("aten::index", "aten::index_select", "aten::gather", "aten::take")
#: row softmaxes; PyTorch's CUDA kernel (aten/src/ATen/native/cuda/SoftMax.cu, host_softmax, the
#: last-dimension case) launches one block per row: ``dim3 grid(outer_size)``
_ROW_SOFTMAX = ("aten::_softmax", "aten::_log_softmax")


@dataclass
class EagerOps(TorchDispatchMode):
    """Records every PyTorch op (outside Triton launches) with the bytes it reads and writes.

    Bytes: the non-aliasing outputs are written and every tensor input is read (an in-place op
    writes its first argument), except: an overwriting in-place op (``copy_``, ``fill_``, the
    in-place random draws) does not read its first argument; a gather reads the elements it
    gathers and its indices, not its whole source; and a cast of fp16 to fp32 feeding a row
    softmax is folded into it, as PyTorch's CUDA ``softmax(x, dtype=float32)`` reads fp16 in
    place (``half_to_float``; bf16 has no such path: its cast stays a pass of its own,
    aten/src/ATen/native/SoftMax.cpp). Views and allocations move nothing. Ops on tensors of at
    least half a vocabulary row of elements are flagged vocabulary-sized (the counter RNG works on
    [rows, V/2] word tensors: with a full row as the bar, one request's RNG ops would slip under)."""

    vocab_size: int
    records: list[EagerOp] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()
        self._paused = 0
        self.vocab_bar = max(1, self.vocab_size // 2)
        #: (output, record index) of the last fp16 -> fp32 cast, for a softmax that consumes it
        self._half_cast: tuple[torch.Tensor, int] | None = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self._paused:
            return out
        schema = func._schema
        name = schema.name
        # an out= argument is written, not read: out of the inputs, into the outputs written
        out_names = {a.name for a in schema.arguments if a.kwarg_only and a.alias_info and a.alias_info.is_write}
        given = {k: v for k, v in (kwargs or {}).items() if k not in out_names}
        written_out = [v for k, v in (kwargs or {}).items() if k in out_names and isinstance(v, torch.Tensor)]
        ins = [a for a in torch.utils._pytree.tree_leaves((args, given)) if isinstance(a, torch.Tensor)]
        outs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        aliasing = [r.alias_info is not None for r in schema.returns]
        is_view = (
            bool(aliasing)
            and all(aliasing)
            and not any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns)
        )
        if is_view or name in _NO_TRAFFIC or name.startswith("aten::_local_scalar"):
            traffic_in, traffic_out, created = [], [], []
        else:
            written = any(
                a.alias_info is not None and a.alias_info.is_write and a.name not in out_names for a in schema.arguments
            )
            created = [o for o, alias in zip(outs, aliasing + [False] * len(outs)) if not alias]
            traffic_out = list(created) + written_out + ([ins[0]] if written and ins else [])
            traffic_in = ins[1:] if name in _WRITE_ONLY_SELF or name in _GATHERS else ins
        bytes_read = sum(map(_nbytes, traffic_in))
        if name in _GATHERS and ins:
            bytes_read += sum(o.numel() for o in created) * ins[0].element_size()
        largest = max([t.numel() for t in ins + outs] or [0])
        blocks = None
        if name in _ROW_SOFTMAX and ins and ins[0].dim() > 0 and args[1] in (-1, ins[0].dim() - 1):
            blocks = ins[0].numel() // max(1, ins[0].shape[-1])
            cast = self._half_cast
            if cast is not None and cast[0] is ins[0] and cast[1] == len(self.records) - 1:
                folded = self.records.pop()  # the fp16 read happens here, the fp32 copy never
                bytes_read = folded.bytes_read
        self.records.append(
            EagerOp(
                name=name,
                bytes_read=bytes_read,
                bytes_written=sum(map(_nbytes, traffic_out)),
                largest=largest,
                creates_vocab_tensor=any(t.numel() >= self.vocab_bar for t in created),
                vocab_sized=bool(traffic_in or traffic_out) and largest >= self.vocab_bar,
                blocks=blocks,
                launches=launches_kernel(func),
            )
        )
        is_half_cast = name == "aten::_to_copy" and ins and ins[0].dtype == torch.float16
        self._half_cast = (outs[0], len(self.records) - 1) if is_half_cast and outs else None
        if is_half_cast and outs and outs[0].dtype != torch.float32:
            self._half_cast = None
        return out


#: aten ops that launch no kernel on a GPU: views, metadata, allocation without initialisation
NOT_LAUNCHES = frozenset(
    {
        "view", "_unsafe_view", "expand", "select", "slice", "reshape", "unsqueeze", "squeeze", "permute", "t",
        "transpose", "unbind", "alias", "as_strided", "detach", "lift_fresh", "split", "diagonal", "empty",
        "empty_strided", "empty_like", "new_empty", "new_empty_strided", "set_",
    }
)  # fmt: skip


def launches_kernel(func: Any) -> bool:
    """Whether an aten op (an ``OpOverload``) launches a kernel on a GPU: any but :data:`NOT_LAUNCHES`."""
    return func.namespace == "aten" and func.overloadpacket.__name__ not in NOT_LAUNCHES


class OpCounter(TorchDispatchMode):
    """Counts the eager ops of a call that launch a kernel on a GPU (:func:`launches_kernel`), its
    host synchronisations (``aten._local_scalar_dense``: ``.item()``, ``bool(t)``) and its
    host-to-device copies (whether each is non-blocking)."""

    def __init__(self) -> None:
        super().__init__()
        self.eager: collections.Counter[str] = collections.Counter()
        self.syncs: list[str] = []
        self.copies: list[bool] = []  # host-to-device copies: non_blocking?

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name == "_local_scalar_dense":
            self.syncs.append(name)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if name in ("copy_", "_to_copy") and any(t.device.type == "cpu" for t in tensors):
            target = args[0].device if name == "copy_" else torch.device(kwargs.get("device") or "cpu")
            if target.type == "cuda":
                blocking = not (kwargs.get("non_blocking") or (name == "copy_" and len(args) > 2 and args[2]))
                self.copies.append(not blocking)
        if launches_kernel(func):
            self.eager[name] += 1
        return func(*args, **kwargs)

    @property
    def launches(self) -> int:
        return sum(self.eager.values())
