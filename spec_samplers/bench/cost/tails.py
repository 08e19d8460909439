"""The tails of fused launches, as kernels of their own, for measurement only.

A verification launch finishes each request in its last program to arrive
(:func:`spec_samplers.kernels.common.last_to_arrive`), and the statistics launch combines each
(request, position) in its last program: such a tail runs once, after the other programs, so
counting its SASS once per program would overstate it and counting its loads in the same launch
would mix them with the vocabulary pass's. The cost model measures the launch as shipped (tail
included: no variant of our kernel is built) and the tail apart from it:

* bytes: the interpreter counts the shipped launch and files every load and store made under
  the tail function (its frames on the stack) as the tail's (:func:`counted`,
  :func:`spec_samplers.bench.cost.counting.counting`);
* instructions: the shipped kernel's SASS is read up to the exit of every program but the last
  (the first ``EXIT`` after the arrival atomic, :func:`arrival`;
  :func:`spec_samplers.bench.cost.sass.read_cubin`), and the tail function alone, wrapped in a
  kernel below on a grid of one program per tail (per request, or per (request, position)),
  with the launch's arguments and warps, is compiled and read for the tail's row. Registers and
  occupancy are the shipped kernel's (the tail's included).

The tail pays no launch latency of its own (:mod:`.totals`). The kernels below only wrap the
production tail functions.
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from spec_samplers.bench.cost.counting import TailSplit
from spec_samplers.bench.cost.trace import Launch
from spec_samplers.kernels import block_kernels as bk
from spec_samplers.kernels import common
from spec_samplers.kernels import rejection_kernels as rk
from spec_samplers.kernels import softmax_kernels as sk


@triton.jit(do_not_specialize=["num_rows", "NB", "NB_AMAX"])
def rejection_tail(
    seqs,
    req,
    parts,
    out_ptr,
    counts,
    K,
    V,
    num_rows,
    NB,
    NB_AMAX,
    TAIL_K: tl.constexpr,
    TAIL_NB: tl.constexpr,
    PRECISE: tl.constexpr,
):
    rk.finish(seqs, req, parts, out_ptr, counts, K, V, num_rows, NB, NB_AMAX, TAIL_K, TAIL_NB, PRECISE)


@triton.jit(do_not_specialize=["num_rows", "NB", "NB_AMAX"])
def block_tail(
    seqs,
    req,
    parts,
    out_ptr,
    counts,
    K,
    V,
    num_rows,
    NB,
    NB_AMAX,
    TAIL_K: tl.constexpr,
    TAIL_NB: tl.constexpr,
    PRECISE: tl.constexpr,
):
    bk.block_finish(seqs, req, parts, out_ptr, counts, K, V, num_rows, NB, NB_AMAX, TAIL_K, TAIL_NB, PRECISE)


@triton.jit(do_not_specialize=["num_rows", "NB"])
def softmax_tail(req, parts, stats, K, num_rows, NB, TAIL_NB: tl.constexpr, PRECISE: tl.constexpr):
    sk.combine_position(req, parts, stats, K, num_rows, NB, TAIL_NB, PRECISE)


@dataclass(frozen=True)
class Tail:
    kernel: Any  # the tail as a kernel of its own (above)
    function: Any  # the production tail function the shipped kernel calls in its last program
    #: how many leading grid axes the tails span: one tail per request, or per (request,
    #: position) for the statistics
    axes: int


#: shipped kernel name -> its tail
TAILS: dict[str, Tail] = {
    "softmax_partials_kernel": Tail(softmax_tail, sk.combine_position, 2),
    "residual_partials_kernel": Tail(rejection_tail, rk.finish, 1),
    "block_partials_kernel": Tail(block_tail, bk.block_finish, 1),
}


def measured(launch: Launch) -> list[Launch]:
    """The launches that measure ``launch``: itself (as shipped), then for a launch whose last
    program per request (or (request, position)) finishes it, its tail alone, one program per
    tail, with the launch's arguments and warps."""
    tail = TAILS.get(launch.name)
    if tail is None:
        return [launch]
    params = inspect.signature(tail.kernel.fn).parameters
    args = {name: value for name, value in launch.args.items() if name in params}
    grid = launch.grid[: tail.axes]
    return [launch, Launch(tail.kernel, grid, args, launch.num_warps, dict(launch.options), launch.after_op, True)]


@functools.cache
def arrival() -> tuple[str, int]:
    """(file name, line) of the arrival atomic of :func:`spec_samplers.kernels.common.last_to_arrive`:
    where the SASS of a kernel with a tail leaves the code every program runs."""
    lines, first = inspect.getsourcelines(common.last_to_arrive.fn)
    line = next(first + n for n, text in enumerate(lines) if "tl.atomic_add(" in text)
    return os.path.basename(inspect.getsourcefile(common.last_to_arrive.fn) or ""), line


def counted() -> dict[str, TailSplit]:
    """What the interpreter's byte counter files as a tail: per shipped kernel, the tail
    function (its code's name and file) and the tail's launch name and grid axes."""
    return {
        name: TailSplit(
            tail.function.fn.__name__,
            os.path.abspath(inspect.getsourcefile(tail.function.fn) or ""),
            tail.kernel.fn.__name__,
            tail.axes,
        )
        for name, tail in TAILS.items()
    }
