"""The request tails of fused launches, as kernels of their own, for measurement only.

A verification launch finishes each request in its last program to arrive
(:func:`spec_samplers.kernels.common.last_to_arrive`): that tail runs once per request, after
the request's other programs, so counting its SASS once per program would overstate it and
counting its loads in the same launch would mix them with the vocabulary pass's. The cost model
therefore measures such a launch as two (:func:`spec_samplers.bench.cost.trace.recording`):
the kernel without its tail (``arrivals`` None), then the tail function alone on a grid of one
program per request, with the same arguments and warps; the tail pays no launch latency
(:mod:`.totals`). The kernels below only wrap the production tail functions.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from spec_samplers.kernels import block_kernels as bk
from spec_samplers.kernels import rejection_kernels as rk

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


#: fused kernel name -> its tail as a kernel
TAILS: dict[str, Any] = {"residual_partials_kernel": rejection_tail, "block_partials_kernel": block_tail}
