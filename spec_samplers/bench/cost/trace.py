"""What a call launches, caught at Triton's launch path, and the eager PyTorch ops it runs.

:func:`recording` patches ``run`` of Triton's ``JITFunction`` (compiled mode) and
``InterpretedFunction`` (``TRITON_INTERPRET=1``): every ``kernel[grid](...)`` of any package
goes through it, so the kernels are discovered from the call, not listed. With ``execute=False``
a launch is recorded and not run (tracing at full shape on meta tensors).

:class:`EagerOps` is a dispatch mode that records every PyTorch op with its bytes read and
written; ops whose tensors hold at least a vocabulary row are flagged.

:func:`kernels_forced` makes our samplers plan their Triton launches for meta tensors (whose
default is the PyTorch path) with the vocabulary split of a modeled GPU.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass
class Launch:
    """One ``kernel[grid](*args, **kwargs)`` call."""

    kernel: Any  # triton JITFunction or InterpretedFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grid: tuple[int, ...]
    #: index of the eager op recorded just before this launch (the launch order among eager ops)
    after_op: int = -1
    #: the tail of the launch before it, measured on its own (:mod:`.tails`)
    tail: bool = False
    #: for the kernel measured without its tail: the launch as the call makes it (tail included)
    fused: Any = None

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    @property
    def module(self) -> str:
        return self.kernel.fn.__module__

    def bound(self) -> dict[str, Any]:
        """The kernel's parameters by name (launch options such as num_warps left out)."""
        signature = inspect.signature(self.kernel.fn)
        params = list(signature.parameters)
        named = dict(zip(params, self.args))
        named.update({k: v for k, v in self.kwargs.items() if k in params})
        for name, param in signature.parameters.items():
            if name not in named and param.default is not param.empty:
                named[name] = param.default
        return named

    @property
    def num_warps(self) -> int:
        return int(self.kwargs.get("num_warps", 4))

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

        for name, value in self.bound().items():
            walk(name, value)
        return found


def without(launch: Launch, argument: str) -> Launch:
    """The same launch with ``argument`` None (a variant of the kernel without what it enables)."""
    params = list(inspect.signature(launch.kernel.fn).parameters)
    args = tuple(None if i < len(params) and params[i] == argument else a for i, a in enumerate(launch.args))
    kwargs = {k: (None if k == argument else v) for k, v in launch.kwargs.items()}
    return Launch(launch.kernel, args, kwargs, launch.grid, launch.after_op)


def _measured(launch: Launch) -> list[Launch]:
    """The launches that measure ``launch``: itself, or for a launch whose last program per
    request (or (request, position)) finishes it, the kernel without that tail and then the tail
    alone, one program per tail (:mod:`.tails`; both run, so the call's output is still written)."""
    from spec_samplers.bench.cost.tails import ARRIVALS, TAILS

    named = launch.bound()
    if launch.name not in TAILS or named.get(ARRIVALS) is None:
        return [launch]
    tail_kernel, tail_axes = TAILS[launch.name]
    params = list(inspect.signature(launch.kernel.fn).parameters)
    args = {p: (None if p == ARRIVALS else v) for p, v in named.items()}
    options = {k: v for k, v in launch.kwargs.items() if k not in params}
    tail_params = inspect.signature(tail_kernel.fn).parameters
    tail_args = {p: v for p, v in named.items() if p in tail_params}
    body = Launch(launch.kernel, (), {**args, **options}, launch.grid, launch.after_op, fused=launch)
    tail = Launch(tail_kernel, (), {**tail_args, **options}, launch.grid[:tail_axes], launch.after_op, True)
    return [body, tail]


def _grid(grid: Any, launch_args: dict[str, Any]) -> tuple[int, ...]:
    if callable(grid):
        grid = grid(launch_args)
    return tuple(int(g) for g in grid)


@contextlib.contextmanager
def recording(execute: bool, ops: EagerOps | None = None) -> Iterator[list[Launch]]:
    """Record every Triton launch made inside the block (and run it when ``execute``)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []
    originals = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}

    def patched(cls: type) -> Callable[..., Any]:
        original = originals[cls]

        def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            if warmup:
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
            launch = Launch(self, args, kwargs, (), len(ops.records) - 1 if ops is not None else -1)
            launch.grid = _grid(grid, {**launch.bound(), **kwargs})
            for part in _measured(launch):
                launches.append(part)
                if execute:
                    with ops.paused() if ops is not None else contextlib.nullcontext():
                        originals[cls](part.kernel, *part.args, grid=part.grid, warmup=False, **part.kwargs)
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
            )
        )
        is_half_cast = name == "aten::_to_copy" and ins and ins[0].dtype == torch.float16
        self._half_cast = (outs[0], len(self.records) - 1) if is_half_cast and outs else None
        if is_half_cast and outs and outs[0].dtype != torch.float32:
            self._half_cast = None
        return out


def _rebind(original: Callable[..., Any], replacement: Callable[..., Any]) -> list[tuple[Any, str]]:
    """Point every ``spec_samplers`` module attribute bound to ``original`` at ``replacement``."""
    patched = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "spec_samplers" or name.startswith("spec_samplers.")):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                setattr(module, attr, replacement)
                patched.append((module, attr))
    return patched


def _import_all(package: str) -> None:
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        importlib.import_module(f"{package}.{info.name}")


@contextlib.contextmanager
def kernels_forced(num_sms: int) -> Iterator[None]:
    """Our samplers take their Triton path on meta tensors, with the vocabulary split that a CUDA
    device with ``num_sms`` multiprocessors gets (:func:`spec_samplers.kernels.backend.vocab_split`)."""
    from spec_samplers import custom_ops
    from spec_samplers.kernels import backend

    original_use, original_split = backend.use_triton, backend.vocab_split

    def use_triton(choice: str, device: torch.device) -> bool:
        return choice != "torch"

    # the meta device's split would be the CPU one: use the CUDA rule of vocab_split
    def cuda_split(vocab_size: int, num_requests: int, device: torch.device, **kw: Any) -> Any:
        return backend.plan_vocab_split(vocab_size, num_requests, 4 * num_sms, 1024, **kw)

    _import_all("spec_samplers.kernels")  # launchers are imported lazily: bind them first
    patched = _rebind(original_use, use_triton) + _rebind(original_split, cuda_split)
    try:
        with custom_ops.meta_runs_code():  # the launch plan, not the custom op's fake
            yield
    finally:
        for module, attr in patched:
            setattr(module, attr, original_use if attr == "use_triton" else original_split)
