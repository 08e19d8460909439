"""The compiled CPU path: the samplers' verification as numba kernels on CPU tensors.

On CPU tensors with ``backend="auto"`` a sampler whose reference has a compiled twin here runs the
twin (:func:`compiled_op`, called by the one backend decision, ``base._choose_op``); ``"torch"``
keeps the PyTorch reference. The references stay the specification: the twins compute the same
operations in the same precision, and tests/test_cpu_path.py compares their tokens (docs/cpu.md).

numba is an optional extra (``pip install spec-samplers[cpu]``): without it the references run,
after a one-line warning (once per process).

Why numba (docs/cpu.md): the verification is a loop over a request's vocabulary with Philox in the
loop over the raced group and fp64 group sums; written as explicit loops, every float is the
reference's operation in the reference's precision, compiled once per machine (``cache=True``).
torch.compile re-traces per shape family and its first call costs seconds; a C++ operator needs a
compiler at install time.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
import os
import pathlib
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import torch

from spec_samplers.constants import PLACEHOLDER_TOKEN_ID
from spec_samplers.layout import TreeBatch, VerifyBatch

#: vocabulary entries of target rows per chunk of a logits batch on the compiled path: its only
#: temporaries are the chunk's probabilities (target and draft rows, fp32), so the extra peak
#: memory is about twice a chunk (8 MiB of fp32 each), and at V = 128256, K = 4 a chunk holds 3
#: requests. Probabilities inputs are read in place: no chunks.
COMPILED_CHUNK_ELEMENTS = 2**21


@functools.cache
def _import_kernels() -> ModuleType | None:
    """The numba kernels module, or None (with a one-line warning, once) without numba."""
    try:
        module = importlib.import_module("spec_samplers.cpu._numba_kernels")
    # numba missing or broken (llvmlite's library fails to load under a small address-space cap,
    # an OSError): the references run
    except (ImportError, OSError) as exc:
        warnings.warn(
            f"spec_samplers: the compiled CPU path needs numba ({exc}); running the PyTorch references "
            "(pip install 'spec-samplers[cpu]')",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return module


#: how the compiled code is made when this machine has none cached ("background", the default:
#: the references run until a child process, ``python -m spec_samplers.cpu``, has compiled it;
#: "foreground": each kernel compiles at its first call, which then takes seconds): the
#: environment variable SPEC_SAMPLERS_CPU_COMPILE
COMPILE_ENV = "SPEC_SAMPLERS_CPU_COMPILE"
_READY = threading.Event()
_START = threading.Lock()
_started = False
_compiler: subprocess.Popen[bytes] | None = None  # the compiling child, until its marker appears
_pending: pathlib.Path | None = None  # the marker it writes


def kernels() -> ModuleType | None:
    """The numba kernels module once the CPU path's compiled code is ready, else None (the
    references run; without numba after a one-line warning, once).

    Ready: this machine's numba cache holds the kernels (a marker file beside it, written once they
    were compiled: loading them makes a process's first call ~1 s), or the foreground mode.
    Otherwise the first call starts one child process compiling them (``python -m
    spec_samplers.cpu``, tens of seconds on 2 cores, on its own interpreter: no lock shared with
    this one) and returns None until its marker appears, so no call waits for the compiler (issue
    37: a first call at or under 2 s); ``SPEC_SAMPLERS_CPU_COMPILE=foreground`` compiles at the
    first call instead."""
    if _READY.is_set():
        return _import_kernels()
    if _import_kernels() is None:
        return None
    _start_compiling()
    if not _READY.is_set():
        _poll_compiler()
    return _import_kernels() if _READY.is_set() else None


def _start_compiling() -> None:
    """Once per process: ready now (cached, or foreground), or a child process compiling."""
    global _started, _compiler, _pending
    with _START:
        if _started:
            return
        _started = True
    marker = _marker()
    foreground = os.environ.get(COMPILE_ENV, "background") == "foreground" or not sys.executable
    if foreground or marker is None or marker.exists():
        _READY.set()
        return
    root = str(pathlib.Path(__file__).resolve().parents[2])  # (the child imports this very package)
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=root if not path else root + os.pathsep + path)
    env[COMPILE_ENV] = "foreground"
    try:
        _compiler = subprocess.Popen(
            [sys.executable, "-m", "spec_samplers.cpu"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except (OSError, ValueError) as exc:  # (no interpreter to start: compile here, at the first call)
        logging.getLogger("spec_samplers").warning("spec_samplers: compiling the CPU path here (%r)", exc)
        _READY.set()
        return
    _pending = marker
    logging.getLogger("spec_samplers").info("spec_samplers: compiling the CPU path in pid %d", _compiler.pid)


def _poll_compiler() -> None:
    """Ready once the child's marker exists; a child gone without it leaves the references on."""
    global _compiler
    if _pending is not None and _pending.exists():
        _READY.set()
    elif _compiler is not None and _compiler.poll() is not None:
        logging.getLogger("spec_samplers").warning(
            "spec_samplers: compiling the CPU path failed (exit %s); the PyTorch references run", _compiler.returncode
        )
        _compiler = None


def _marker() -> pathlib.Path | None:
    """The marker of this machine's cached kernels: beside numba's cache of ``_numba_kernels``, named
    by numba's and llvmlite's versions, the host CPU and the kernel sources' sizes and times (numba
    recompiles when those change); None where that cache has no directory (then: foreground)."""
    try:
        import llvmlite
        import llvmlite.binding as llvm
        import numba

        module = _import_kernels()
        cache_dir = pathlib.Path(module.rejection_kernel._cache._cache_path)  # type: ignore[union-attr]
        here = pathlib.Path(__file__).parent
        stamps = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(here.glob("_*kernels.py"))]
        host = (llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())
        key = repr((numba.__version__, llvmlite.__version__, host, stamps))
    except Exception:  # (numba's cache internals differ: compile at first use)
        return None
    return cache_dir / f"spec_samplers-compiled-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def compile_here() -> None:
    """This process compiles each kernel at its first call (no child process): the foreground mode,
    for ``python -m spec_samplers.cpu`` and benchmarks that compile before they time."""
    global _started
    with _START:
        _started = True
    _READY.set()


def mark_compiled() -> None:
    """Mark this machine's numba cache as holding every kernel (``python -m spec_samplers.cpu``
    calls it after compiling them all), and this process ready."""
    marker = _marker()
    if marker is not None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:  # (a read-only cache directory: the next process compiles again)
            pass
    _READY.set()


def _np(t: torch.Tensor) -> Any:
    """A numpy view of a CPU tensor (contiguous: one compiled specialisation per dtype)."""
    if t.requires_grad or not t.is_contiguous():
        t = t.detach().contiguous()
    return t.numpy()


def _np64(t: torch.Tensor) -> Any:
    """An int64 numpy array of an integer (or bool) CPU tensor (a view when it is int64)."""
    return _int64(_np(t))


def _int64(a: Any) -> Any:
    """``a`` as int64 (itself when it is: the test costs less than ``astype``'s no-op)."""
    return a if a.dtype == np.int64 else a.astype(np.int64)


class _Rows:
    """What a kernel reads, as numpy arrays, for the calls it does not read in place
    (:func:`_in_place`: ragged, logits, fp16 / bf16 rows): fp32 rows [R, V] and the [B]-indexed
    maps (:class:`spec_samplers.reference.FlatInputs`'s fields), the seeds and offsets as uint64
    and the greedy flags (``has_greedy`` False: ``greedy`` is zeros, never read)."""

    __slots__ = (
        "target", "target_rows", "draft", "draft_rows", "draft_ids", "num_draft", "bonus", "greedy", "has_greedy",
        "has_draft", "seeds", "offsets",
    )  # fmt: skip

    def __init__(self, batch: VerifyBatch, sampler: str | None) -> None:
        from spec_samplers.reference import flat_inputs

        B = batch.layout.batch_size
        f = flat_inputs(batch)
        no_greedy, zero_offsets = _zeros(B)
        self.target = _np(f.target.to(torch.float32))
        self.has_draft = f.draft is not None
        self.draft = self.target[:1] if f.draft is None else _np(f.draft.to(torch.float32))
        self.target_rows, self.draft_rows, self.num_draft = map(_np64, (f.target_rows, f.draft_rows, f.num_draft))
        self.draft_ids = _np64(f.draft_ids)
        self.bonus = _np64(f.bonus).reshape(B)
        greedy = f.is_greedy
        self.has_greedy = greedy is not None
        self.greedy = no_greedy if greedy is None else _np(greedy.to(torch.bool))
        if sampler is None:  # (typical acceptance: no randomness)
            return
        seeds = batch.seeds
        if seeds is None:
            from spec_samplers.reference import _seeds_offsets

            seeds = _seeds_offsets(batch, sampler)[0]
        self.seeds = _np64(seeds).view(np.uint64)
        offsets = batch.offsets
        self.offsets = zero_offsets if offsets is None else _int64(offsets.numpy()).view(np.uint64)


class _InPlace(NamedTuple):
    """The tensors of a padded fp32 probabilities call as the ``*_padded`` kernels read them at
    their addresses (``data_ptr()``, spec_samplers.cpu._numba_kernels): each contiguous, without a
    negative bit, of the dtype read there (a copy only of one that is not). Holding them keeps
    every address alive until the kernel returns."""

    target: torch.Tensor  # [B, K+1, V] fp32
    draft: torch.Tensor | None  # [B, K, V] fp32, None: point-mass drafts
    draft_ids: torch.Tensor  # [B, K] int64
    bonus: torch.Tensor  # [B] int64
    is_greedy: torch.Tensor | None  # [B] bool
    seeds: torch.Tensor | None  # [B] int64 (None: typical acceptance, no randomness)
    offsets: torch.Tensor | None  # [B] int64, None: 0


def _plain(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a kernel reads it at its address: of ``dtype``, contiguous, without a negative
    bit (a view that ``.numpy()`` would refuse; ``resolve_neg`` copies it)."""
    if t.dtype != dtype:
        t = t.to(dtype)
    if not t.is_contiguous() or t.is_neg():
        t = t.resolve_neg().contiguous()
    return t


def _in_place(batch: VerifyBatch, sampler: str | None) -> _InPlace | None:
    """The call's tensors for the ``*_padded`` kernels when it is padded fp32 probabilities (the
    common call: the rows read in place and the layout's maps made in the kernel; FlatInputs' torch
    ops cost more than the kernel at B = 1), else None (the kernels read :class:`_Rows`). B >= 1."""
    layout, target, draft = batch.layout, batch.target, batch.draft
    if (
        layout.ragged
        or batch.temperature is not None
        or batch.draft_rows is not None  # (flat_inputs refuses draft_rows without a temperature)
        or target.dtype != torch.float32
        or (draft is not None and draft.dtype != torch.float32)
    ):
        return None
    greedy, seeds, offsets = batch.is_greedy, None, None
    if sampler is not None:  # (typical acceptance: no randomness)
        seeds = batch.seeds
        if seeds is None:
            from spec_samplers.reference import _seeds_offsets

            seeds = _seeds_offsets(batch, sampler)[0]
        seeds = _plain(seeds, torch.int64)
        offsets = None if batch.offsets is None else _plain(batch.offsets, torch.int64)
    return _InPlace(
        _plain(target, torch.float32),
        None if draft is None else _plain(draft, torch.float32),
        _plain(batch.draft_token_ids, torch.int64),
        _plain(batch.bonus_token_ids, torch.int64),
        None if greedy is None else _plain(greedy, torch.bool),
        seeds,
        offsets,
    )


def _address(t: torch.Tensor | None) -> int:
    """The address a ``*_padded`` kernel reads ``t`` at; 0 for an absent tensor."""
    return 0 if t is None else t.data_ptr()


@functools.lru_cache(maxsize=64)
def _zeros(B: int) -> tuple[Any, Any]:
    """([B] bool zeros: no greedy rows, [B] uint64 zeros: no offsets), made once per B and only
    read by the kernels."""
    return np.zeros(B, dtype=np.bool_), np.zeros(B, dtype=np.uint64)


#: the counters argument of a kernel call that does not count (never written)
_NO_COUNTS = np.zeros(1, dtype=np.int64)

#: (counters tensor, its data pointer, its numpy view) of the last counting call, in a one-slot
#: list (a tuple read and replaced whole: threads never mix two buffers' entries). A sampler passes
#: the same buffer every call, and ``.numpy()`` costs more than the identity and pointer test.
_last_counts: list[tuple[Any, int, Any]] = [(None, 0, _NO_COUNTS)]


def _counts(batch: VerifyBatch) -> tuple[Any, bool]:
    """(counters as an int64 numpy view, whether the kernel adds to them): the sampler's counters
    (``VerifyBatch.counters``, given when the sampler's pipeline lets the kernels count)."""
    counters = batch.counters
    if counters is None:
        return _NO_COUNTS, False
    last, ptr, view = _last_counts[0]
    if counters is not last or counters.data_ptr() != ptr:  # another buffer, or its storage replaced
        view = counters.numpy()
        _last_counts[0] = (counters, counters.data_ptr(), view)
    return view, True


def _degenerate(batch: VerifyBatch, out: torch.Tensor) -> torch.Tensor:
    """The reference's output of a batch without rows to read, counted as a kernel would."""
    if batch.counters is not None:
        count_on_host(batch.counters.numpy(), out.numpy())
    return out


def _reference(name: str) -> Callable[..., torch.Tensor]:
    """The reference ``name`` of spec_samplers.reference (imported when a twin falls back to it:
    this module imports no sampler)."""
    from spec_samplers import reference

    return getattr(reference, name)


def _verify_cpu(batch: VerifyBatch, kernel_name: str, padded_name: str, reference: str, sampler: str) -> torch.Tensor:
    """Run the kernel ``kernel_name`` (rejection_kernel, block_kernel: one signature) on the
    batch's fp32 rows, or its twin ``padded_name`` on the tensors a padded fp32 call reads in place
    (:func:`_in_place`); the reference ``reference`` where numba is missing or there are no rows to
    read."""
    k = _import_kernels()
    if k is None:
        return _reference(reference)(batch)
    layout = batch.layout
    B, K = layout.batch_size, layout.max_drafts
    t = _in_place(batch, sampler)
    r = _Rows(batch, sampler) if t is None else None
    if r is None:  # (padded: B (K+1) target rows, B K draft rows)
        empty = B == 0 or (K == 0 and batch.draft is not None)
    else:
        empty = r.target.shape[0] == 0 or r.draft.shape[0] == 0
    if empty:
        # (no rows to read: the reference's degenerate cases)
        return _degenerate(batch, _reference(reference)(batch))
    out = np.empty((B, K + 1), dtype=np.int64)
    counts, count = _counts(batch)
    if t is not None:
        assert t.seeds is not None  # (resolved by _in_place for a stochastic sampler)
        getattr(k, padded_name)(
            t.target.data_ptr(), _address(t.draft), t.draft_ids.data_ptr(), t.bonus.data_ptr(),
            _address(t.is_greedy), t.seeds.data_ptr(), _address(t.offsets), B, K, layout.vocab_size, out, counts,
            count,
        )  # fmt: skip
        return torch.from_numpy(out)
    assert r is not None
    getattr(k, kernel_name)(
        r.target,
        r.target_rows,
        r.draft,
        r.draft_rows,
        r.has_draft,
        r.draft_ids,
        r.num_draft,
        r.bonus,
        r.greedy,
        r.has_greedy,
        r.seeds,
        r.offsets,
        out,
        counts,
        count,
    )
    return torch.from_numpy(out)


def rejection_cpu(batch: VerifyBatch) -> torch.Tensor:
    """:func:`spec_samplers.reference.rejection_reference`, compiled. Returns [B, K+1] int64."""
    return _verify_cpu(batch, "rejection_kernel", "rejection_padded", "rejection_reference", "rejection sampling")


def block_cpu(batch: VerifyBatch) -> torch.Tensor:
    """:func:`spec_samplers.reference.block_reference`, compiled. Returns [B, K+1] int64."""
    return _verify_cpu(batch, "block_kernel", "block_padded", "block_reference", "block verification")


def run_compiled(op: Callable[..., torch.Tensor], batch: VerifyBatch, **options: object) -> torch.Tensor:
    """``op(batch, **options)``: whole when it reads its rows in place (fp32 probabilities), else
    (logits, or fp16 / bf16 rows: fp32 rows made first) :data:`COMPILED_CHUNK_ELEMENTS` entries of
    target rows at a time, which bounds those temporaries. A tree twin takes every
    :class:`~spec_samplers.layout.TreeBatch` whole (it runs its reference, chunked, on the calls
    its kernel does not read)."""
    if isinstance(batch, TreeBatch):
        return op(batch, **options)
    if batch.temperature is None and batch.target.dtype == torch.float32:
        if batch.draft is None or batch.draft.dtype == torch.float32:
            return op(batch, **options)
    from spec_samplers.chunking import run_chunked

    return run_chunked(op, batch, budget=COMPILED_CHUNK_ELEMENTS, **options)


def typical_cpu(batch: VerifyBatch, posterior_threshold: float, posterior_alpha: float) -> torch.Tensor:
    """:func:`spec_samplers.reference.typical_reference`, compiled. Returns [B, K+1] int64."""
    k = _import_kernels()
    if k is None:
        return _reference("typical_reference")(batch, posterior_threshold, posterior_alpha)
    layout = batch.layout
    B, K = layout.batch_size, layout.max_drafts
    t = _in_place(batch, None)
    r = _Rows(batch, None) if t is None else None
    empty = B == 0 if r is None else r.target.shape[0] == 0  # (no rows to read)
    if empty:
        return _degenerate(batch, _reference("typical_reference")(batch, posterior_threshold, posterior_alpha))
    out = np.empty((B, K + 1), dtype=np.int64)
    floats = _typical_floats(posterior_threshold, posterior_alpha)
    if t is not None:
        k.typical_padded(
            t.target.data_ptr(), t.draft_ids.data_ptr(), t.bonus.data_ptr(), B, K, layout.vocab_size, *floats, out,
            *_counts(batch),
        )  # fmt: skip
        return torch.from_numpy(out)
    assert r is not None
    k.typical_kernel(r.target, r.target_rows, r.draft_ids, r.num_draft, r.bonus, *floats, out, *_counts(batch))
    return torch.from_numpy(out)


@functools.lru_cache(maxsize=16)
def _typical_floats(posterior_threshold: float, posterior_alpha: float) -> tuple[float, float, float]:
    """(eps, threshold, alpha) as the kernel reads them: the reference's fp32 values."""
    from spec_samplers.constants import ENTROPY_EPS_FP32, fp32_value

    return float(ENTROPY_EPS_FP32), fp32_value(posterior_threshold), fp32_value(posterior_alpha)


#: reference -> compiled twin (by name, so that importing this module imports no sampler)
_TWINS: dict[str, Callable[..., torch.Tensor]] = {
    "rejection_reference": rejection_cpu,
    "block_reference": block_cpu,
    "typical_reference": typical_cpu,
}


# --- Trees (docs/cpu.md, "Tree verification") ------------------------------------------------


@functools.cache
def tree_kernels() -> ModuleType | None:
    """The tree kernels module (spec_samplers.cpu._tree_kernels), or None without numba (the
    one-time warning is :func:`_import_kernels`'; the twins are reached through :func:`compiled_op`,
    which asks :func:`kernels` whether the compiled code is ready)."""
    if _import_kernels() is None:
        return None
    return importlib.import_module("spec_samplers.cpu._tree_kernels")


def _tree_reference(name: str) -> Callable[..., Any]:
    """The tree reference ``name`` (spec_samplers.tree.reference, or tree.traversal's)."""
    from spec_samplers.tree import reference, traversal

    return getattr(traversal if name == "traversal_tree_reference" else reference, name)


def _tree_fallback(tb: TreeBatch, name: str, **options: object) -> Any:
    """The tree reference ``name`` as the backend decision runs it without a twin (a chunk of
    requests at a time: the tree samplers' references are request-independent)."""
    from spec_samplers.chunking import run_tree_chunked

    return run_tree_chunked(_tree_reference(name), tb, **options)


def _tree_reads(tb: TreeBatch) -> bool:
    """Whether a tree kernel reads this call: fp32 probabilities (no logits rows), rows to read."""
    draft = tb.draft
    return (
        tb.temperature is None
        and tb.target.dtype == torch.float32
        and (draft is None or draft.dtype == torch.float32)
        and tb.batch_size > 0
        and tb.target.shape[0] > 0
        and tb.vocab_size > 0
        and (draft is None or draft.shape[0] > 0)
    )


def _tree_common(tb: TreeBatch) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(target rows, target row map, tokens, parents, depth, [B, D+1] and [B, D] outputs) as the
    tree kernels read them."""
    B, D = tb.batch_size, tb.max_depth
    return (
        _np(tb.target),
        _np64(tb.target_rows),
        _np64(tb.tokens),
        _np64(tb.parents),
        _np64(tb.depth),
        (np.empty((B, D + 1), dtype=np.int64), np.empty((B, D), dtype=np.int64)),
    )


def _walk_cpu(tb: TreeBatch, kernel_name: str, reference: str) -> Any:
    """The walk kernel ``kernel_name`` (rejection_tree_kernel, traversal_tree_kernel: one
    signature) on the call, or the reference ``reference`` on the calls it does not read."""
    from spec_samplers.output import TreeOutput, seeds_of

    k = tree_kernels()
    if k is None or not _tree_reads(tb):
        return _tree_fallback(tb, reference)
    target, target_rows, tokens, parents, depth, (token_ids, node_ids) = _tree_common(tb)
    has_draft = tb.draft is not None and tb.policy != "deterministic"
    draft = _np(tb.draft) if has_draft and tb.draft is not None else target[:1]
    seeds, offsets = seeds_of(tb)
    greedy = tb.is_greedy
    getattr(k, kernel_name)(
        target, target_rows, draft, _np64(tb.draft_rows), has_draft, tb.policy == "without_replacement", tokens,
        parents, depth, tb.max_depth, _zeros(tb.batch_size)[0] if greedy is None else _np(greedy.to(torch.bool)),
        greedy is not None, _np64(seeds).view(np.uint64), _np64(offsets).view(np.uint64), token_ids, node_ids,
    )  # fmt: skip
    return TreeOutput(torch.from_numpy(token_ids), torch.from_numpy(node_ids))


def rejection_tree_cpu(tb: TreeBatch) -> Any:
    """:func:`spec_samplers.tree.reference.rejection_tree_reference`, compiled (fp32 probabilities;
    the reference on other calls). Returns ``TreeOutput``."""
    return _walk_cpu(tb, "rejection_tree_kernel", "rejection_tree_reference")


def traversal_tree_cpu(tb: TreeBatch) -> Any:
    """:func:`spec_samplers.tree.traversal.traversal_tree_reference` (Traversal Verification, block
    verification's tree rule), compiled (fp32 probabilities; the reference on other calls).
    Returns ``TreeOutput``."""
    return _walk_cpu(tb, "traversal_tree_kernel", "traversal_tree_reference")


def typical_tree_cpu(tb: TreeBatch, posterior_threshold: float, posterior_alpha: float) -> Any:
    """:func:`spec_samplers.tree.reference.typical_tree_reference`, compiled (fp32 probabilities;
    the reference on other calls). Returns ``TreeOutput``."""
    from spec_samplers.output import TreeOutput

    k = tree_kernels()
    if k is None or not _tree_reads(tb):
        return _tree_fallback(
            tb, "typical_tree_reference", posterior_threshold=posterior_threshold, posterior_alpha=posterior_alpha
        )
    target, target_rows, tokens, parents, depth, (token_ids, node_ids) = _tree_common(tb)
    floats = _typical_floats(posterior_threshold, posterior_alpha)
    k.typical_tree_kernel(target, target_rows, tokens, parents, depth, tb.max_depth, *floats, token_ids, node_ids)
    return TreeOutput(torch.from_numpy(token_ids), torch.from_numpy(node_ids))


#: tree reference -> compiled twin (by name, as _TWINS; the references' modules: _TREE_MODULES)
_TREE_TWINS: dict[str, Callable[..., Any]] = {
    "rejection_tree_reference": rejection_tree_cpu,
    "typical_tree_reference": typical_tree_cpu,
    "traversal_tree_reference": traversal_tree_cpu,
}
_TREE_MODULES = frozenset({"spec_samplers.tree.reference", "spec_samplers.tree.traversal"})


def compiled_op(reference: Callable[..., torch.Tensor], device: torch.device) -> Callable[..., torch.Tensor] | None:
    """The compiled twin of ``reference`` for tensors on ``device``, or None (not CPU, no twin, or
    numba missing: the caller runs the reference)."""
    if device.type != "cpu":
        return None
    name, module = getattr(reference, "__name__", ""), getattr(reference, "__module__", "")
    if module == "spec_samplers.reference":
        twin = _TWINS.get(name)
    elif module in _TREE_MODULES:
        twin = _TREE_TWINS.get(name)
    else:
        return None
    if twin is None or kernels() is None:
        return None
    return twin


def head_rows(weight: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
    """[R, V] fp32 ``rows @ weight.T`` for R >= 1 fp32 CPU rows [R, H] and a contiguous fp32 head
    [V, H] (``cpu._head_kernels``: the head read once per block of 8 rows), or None while the
    compiled code is not ready (:func:`kernels`) or numba is missing."""
    if kernels() is None:
        return None
    from spec_samplers.cpu import _head_kernels

    out = torch.empty((rows.shape[0], weight.shape[0]), dtype=torch.float32)
    _head_kernels.head_rows_kernel(weight.detach().numpy(), _np(rows), out.numpy())
    return out


def count_on_host(counts: Any, out: Any) -> None:
    """SpecDecodeBaseSampler._update_counters's sums on numpy views of CPU tensors: ``counts``
    [2 + >= k] int64 (accepted, emitted, per position), ``out`` [B, k+1] int64."""
    k = out.shape[1] - 1
    per_position = (out[:, 1:] != PLACEHOLDER_TOKEN_ID).sum(axis=0)
    counts[2 : 2 + k] += per_position
    counts[0] += per_position.sum()
    counts[1] += (out != PLACEHOLDER_TOKEN_ID).sum()
