"""The tails of fused launches, as kernels of their own, for measurement only.

A verification launch finishes each request in its last program to arrive
(:func:`spec_samplers.kernels.common.last_to_arrive`), and the statistics launch combines each
(request, position) in its last program: such a tail runs once, after the other programs, so
counting its SASS once per program would overstate it and counting its loads in the same launch
would mix them with the vocabulary pass's. The cost model therefore measures such a launch as
two (:func:`spec_samplers.bench.cost.trace.recording`): the kernel without its tail
(``arrivals`` None), then the tail function alone on a grid of one program per tail (per
request, or per (request, position)), with the same arguments and warps; the tail pays no
launch latency (:mod:`.totals`). The kernels below only wrap the production tail functions.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from spec_samplers.kernels import block_kernels as bk
from spec_samplers.kernels import rejection_kernels as rk
from spec_samplers.kernels import softmax_kernels as sk

#: the launch argument whose presence means "the last program per request finishes it"
ARRIVALS = "arrivals"


@triton.jit(do_not_specialize=["num_rows", "NB", "NB_AMAX"])
def rejection_tail(
    seqs,
    req,
    parts,
    out_ptr,
    K,
    V,
    num_rows,
    NB,
    NB_AMAX,
    TAIL_K: tl.constexpr,
    TAIL_NB: tl.constexpr,
    PRECISE: tl.constexpr,
):
    rk.finish(seqs, req, parts, out_ptr, K, V, num_rows, NB, NB_AMAX, TAIL_K, TAIL_NB, PRECISE)


@triton.jit(do_not_specialize=["num_rows", "NB", "NB_AMAX"])
def block_tail(
    seqs,
    req,
    parts,
    out_ptr,
    K,
    V,
    num_rows,
    NB,
    NB_AMAX,
    TAIL_K: tl.constexpr,
    TAIL_NB: tl.constexpr,
    PRECISE: tl.constexpr,
):
    bk.block_finish(seqs, req, parts, out_ptr, K, V, num_rows, NB, NB_AMAX, TAIL_K, TAIL_NB, PRECISE)


@triton.jit(do_not_specialize=["num_rows", "NB"])
def softmax_tail(req, parts, stats, K, num_rows, NB, TAIL_NB: tl.constexpr, PRECISE: tl.constexpr):
    sk.combine_position(req, parts, stats, K, num_rows, NB, TAIL_NB, PRECISE)


#: fused kernel name -> (its tail as a kernel, how many leading grid axes the tails span: one
#: tail per request, or per (request, position) for the statistics)
TAILS: dict[str, tuple[Any, int]] = {
    "softmax_partials_kernel": (softmax_tail, 2),
    "residual_partials_kernel": (rejection_tail, 1),
    "block_partials_kernel": (block_tail, 1),
}
