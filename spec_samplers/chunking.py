"""Bounded memory on the PyTorch path: a batch verified a chunk of requests at a time.

The references build vocabulary-sized temporaries for every row they handle (probabilities from
logits, cleaned rows, filters' sorted copies...), several times the inputs' size at once. Run on
a whole engine batch (vLLM's CPU build: 40,960 requests x V = 4096) that was 13x the inputs' size.
:func:`run_chunked` hands them :data:`CHUNK_ELEMENTS` vocabulary entries of target rows at a
time instead, so the extra memory is a small multiple of one chunk, whatever the batch size.

Chunks change no token: every random number is a pure function of (seed, offset, position,
index) of its request (docs/design.md), and a request reads the same rows in its chunk as in the
whole batch (tests/test_chunking.py compares them token for token at one request per chunk).

Host synchronisation: a padded batch splits by its shape alone. A ragged batch splits at row
bounds read from ``cu_num_draft_tokens``, so it is chunked only on the CPU (where reading it costs
nothing); on other devices the Triton kernels run, which need no temporaries, and a forced
PyTorch backend there runs the batch whole rather than wait on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from spec_samplers.layout import VerifyBatch, request_slice

if TYPE_CHECKING:  # spec_samplers.tree imports the base classes, which import this module
    from spec_samplers.layout import TreeBatch
    from spec_samplers.output import TreeOutput

#: vocabulary entries of target rows per chunk: 2**18, 1 MB of fp32 rows (at V = 4096 and K = 1,
#: 32 requests). The references' temporaries peak near 14x a chunk; measured at B = 4096, V = 4096,
#: K = 1 (benchmarks/results/2026-11-28-cpu-memory-peak.txt): 2**22 added 150-300 MB, 2**20 60-90
#: MB, 2**18 20-35 MB, and 2**18 ran in 3.6 s where the whole batch took 9-11 s (cache-sized rows)
#: and 2**16 6 s (per-chunk overhead). Tests lower it to one request per chunk. A chunk holds under
#: twice this (:func:`requests_per_chunk`), so the extra peak memory stays within ~28x of it.
CHUNK_ELEMENTS = 2**18


def requests_per_chunk(rows_per_request: int, vocab_size: int, budget: int | None = None) -> int:
    """Requests whose target rows hold about ``budget`` (default :data:`CHUNK_ELEMENTS`) entries.

    A request alone only when its rows alone are over the budget: one within it shares its chunk
    with another even where two exceed the budget (a chunk then holds under twice the budget), so
    no vocabulary between budget / 2 and the budget turns the chunks into a loop over requests."""
    budget = CHUNK_ELEMENTS if budget is None else budget
    per_request = max(rows_per_request * vocab_size, 1)
    if per_request > budget:
        return 1
    return max(2, budget // per_request)


def chunk_bounds(
    batch: VerifyBatch, budget: int | None = None
) -> Iterator[tuple[int, int, tuple[int, int] | None]] | None:
    """(start, stop, flat rows or None) of each chunk of requests, or None when the batch runs
    whole: it fits one chunk, or it is ragged on a device other than the CPU, or its ragged
    metadata is not non-decreasing from 0 up to T (malformed metadata keeps its one rule,
    spec_samplers.layout, by running unsplit)."""
    layout = batch.layout
    B, K, V = layout.batch_size, layout.max_drafts, layout.vocab_size
    step = requests_per_chunk(K + 1, V, budget)
    if B <= step:
        return None
    if not layout.ragged:
        return ((b, min(b + step, B), None) for b in range(0, B, step))
    cu_tensor = layout.cu_num_draft_tokens
    assert cu_tensor is not None
    if cu_tensor.device.type != "cpu":
        return None
    cu = [0, *cu_tensor.tolist()]
    if cu[1] < 0 or cu[-1] > layout.num_rows or any(a > b for a, b in zip(cu, cu[1:])):
        return None
    return ((b, min(b + step, B), (cu[b], cu[min(b + step, B)])) for b in range(0, B, step))


def run_chunked(
    op: Callable[..., torch.Tensor], batch: VerifyBatch, budget: int | None = None, **options: object
) -> torch.Tensor:
    """``op(batch, **options)`` ([B, K+1] tokens) one chunk of requests (``budget`` entries of
    target rows, default :data:`CHUNK_ELEMENTS`) at a time."""
    bounds = chunk_bounds(batch, budget)
    if bounds is None:
        return op(batch, **options)
    return torch.cat([op(request_slice(batch, start, stop, rows), **options) for start, stop, rows in bounds])


def _tree_slice(tb: TreeBatch, start: int, stop: int, lo: int, hi: int) -> TreeBatch:
    """Requests [start, stop) of a tree batch, their flat rows [lo, hi) (views)."""

    def rows(m: torch.Tensor) -> torch.Tensor:
        return torch.where(m >= 0, m - lo, m)

    def part(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[start:stop]

    return replace(
        tb,
        target=tb.target[lo:hi],
        draft=None if tb.draft is None else tb.draft[lo:hi],
        target_rows=rows(tb.target_rows[start:stop]),
        draft_rows=rows(tb.draft_rows[start:stop]),
        tokens=tb.tokens[start:stop],
        parents=tb.parents[start:stop],
        depth=tb.depth[start:stop],
        seeds=part(tb.seeds),
        offsets=part(tb.offsets),
        is_greedy=part(tb.is_greedy),
        temperature=None if tb.temperature is None else tb.temperature[lo:hi],
    )


def run_tree_chunked(op: Callable[..., TreeOutput], tb: TreeBatch, **options: object) -> TreeOutput:
    """``op(tb, **options)`` one chunk of requests at a time, on the CPU (each chunk's flat rows
    are the range its row maps span, read from them: free on the CPU, a synchronisation
    elsewhere). Target and draft rows are sliced alike, as flat indices they may share (the
    temperature of a logits row)."""
    from spec_samplers.output import TreeOutput

    B = tb.batch_size
    step = requests_per_chunk(tb.num_nodes + 1, tb.vocab_size)
    if B <= step or tb.target.device.type != "cpu":
        return op(tb, **options)
    maps = torch.cat([tb.target_rows, tb.draft_rows], dim=1)  # [B, 2(N+1)]
    present = maps >= 0
    lows = torch.where(present, maps, torch.iinfo(torch.int64).max).amin(dim=1).tolist()
    highs = torch.where(present, maps, -1).amax(dim=1).tolist()
    outs = []
    for start in range(0, B, step):
        stop = min(start + step, B)
        lo, hi = min(lows[start:stop]), max(highs[start:stop]) + 1
        lo = min(lo, hi)  # a chunk without rows reads none
        outs.append(op(_tree_slice(tb, start, stop, lo, hi), **options))
    return TreeOutput(torch.cat([o.token_ids for o in outs]), torch.cat([o.node_ids for o in outs]))
