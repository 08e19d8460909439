"""The calls that compile every CPU kernel (:func:`compile_ahead`, ``python -m spec_samplers.cpu``,
the child process ``spec_samplers.cpu.kernels`` starts on a machine without cached kernels): small
inputs of each kind of call the package makes, through the public entries, so that numba compiles
(or loads from its cache) the same specialisations a real call needs. A top layer
(docs/architecture.md): it calls samplers, sampling operations and the tree entries."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def compile_ahead() -> dict[str, float]:
    """Compile (or load) every CPU kernel in this process and mark this machine's cache; returns
    the seconds of each group of calls (:func:`run`)."""
    from spec_samplers import cpu

    cpu.compile_here()
    times = run()
    cpu.mark_compiled()
    return times


def run() -> dict[str, float]:
    """Seconds per group of calls (compilation, or loading numba's cache)."""
    from spec_samplers import rng
    from spec_samplers.cpu import _logits_kernels, draw, head_rows
    from spec_samplers.registry import get_sampler
    from spec_samplers.sampling import sampling_from_logits, sampling_from_probs, softmax

    g = torch.Generator().manual_seed(0)
    B, K, V = 2, 2, 300
    logits = torch.randn(B, K + 1, V, generator=g)
    q, p = torch.softmax(logits, -1), torch.softmax(torch.randn(B, K, V, generator=g), -1)
    ids = torch.randint(0, V, (B, K), generator=g)
    bonus = torch.zeros(B, 1, dtype=torch.int64)
    seeds = torch.arange(B)
    times: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        fn()
        times[name] = time.perf_counter() - t0

    for name in ("rejection_sampler", "block_verification", "typical_acceptance_sampler"):
        sampler = get_sampler(name, backend="auto")
        extra: dict[str, object] = {} if name.startswith("typical") else {"seeds": seeds}

        def calls(sampler: Callable[..., object] = sampler, extra: dict[str, object] = extra) -> None:
            sampler(q, bonus, p, ids, **extra)  # fp32 rows read in place (the *_padded kernels)
            sampler(q, bonus, None, ids, **extra)  # point-mass drafts
            sampler(q.half(), bonus, p.half(), ids, **extra)  # fp32 rows made first (the row kernels)

        timed(name, calls)
    rows = q[:, 0]
    timed("sampling_from_probs", lambda: sampling_from_probs(rows, seed=seeds, offset=seeds))
    timed("sampling_from_logits", lambda: sampling_from_logits(logits[:, 0], seed=seeds, offset=seeds))
    timed("softmax", lambda: softmax(logits[:, 0], 0.8))
    head = torch.randn(V, 16, generator=g)
    timed("head_rows", lambda: [head_rows(head, torch.randn(r, 16, generator=g)) for r in (1, 2, 3, 4)])
    timed("filtered sampling", lambda: _filtered(rows, logits[:, 0], seeds))
    timed("decode_rows", lambda: draw.decode_rows(rows, seeds, seeds, 0, rng.STREAM_DECODE_DRAFT))
    timed("draw_from_logits", lambda: draw.draw_from_logits(logits[:, 0], torch.ones(B), seeds, None, 0))

    flat = logits[:, :2].reshape(2 * B, V).contiguous()  # (one draft and the bonus row a request)
    step = (
        flat.numpy(),
        np.arange(2, 2 * B + 1, 2, dtype=np.int64),
        ids[:, 0].contiguous().numpy(),
        np.ones(B, dtype=np.float32),
        seeds.numpy().view(np.uint64),
        np.zeros(B, dtype=np.uint64),
        np.empty((B, K + 2), dtype=np.int64),
    )
    timed("step_rejection_kernel", lambda: _logits_kernels.step_rejection_kernel(*step))
    timed("step_block_kernel", lambda: _logits_kernels.step_block_kernel(*step))

    # the tree twins (_tree_kernels), through the samplers' tree entries
    from spec_samplers.block import BlockVerificationSampler
    from spec_samplers.rejection import RejectionSampler
    from spec_samplers.typical import TypicalAcceptanceSampler

    tq = torch.softmax(torch.randn(B, 4, V, generator=g), -1)
    tids = torch.randint(0, V, (B, 3), generator=g)
    parents = [0, 0, 1]
    timed("rejection tree", lambda: RejectionSampler().forward_tree(tq, tq, tids, parents, seeds=seeds))
    timed("traversal tree", lambda: BlockVerificationSampler().forward_tree(tq, tq, tids, parents, seeds=seeds))
    typical = TypicalAcceptanceSampler(posterior_threshold=0.09, posterior_alpha=0.3)
    timed("typical tree", lambda: typical.forward_tree(tq, None, tids, parents))
    return times


def _filtered(probs: torch.Tensor, logits: torch.Tensor, seeds: torch.Tensor) -> None:
    """The filtered sampling operations (_filter_kernels), each kind of call."""
    from spec_samplers import sampling as ops

    rows: dict[str, Any] = dict(seed=seeds, offset=seeds)
    ops.top_k_sampling_from_probs(probs, 5, **rows)
    ops.top_p_sampling_from_probs(probs, 0.9, **rows)
    ops.min_p_sampling_from_probs(probs, 0.1, **rows)
    for order in ("top_k_first", "joint"):
        ops.top_k_top_p_sampling_from_probs(probs, 5, 0.9, filter_apply_order=order, **rows)
        ops.top_k_top_p_sampling_from_logits(logits, 5, 0.9, filter_apply_order=order, **rows)
    ops.top_k_renorm_probs(probs, 5)
    ops.top_p_renorm_probs(probs, 0.9)
    ops.top_k_mask_logits(logits, 5)
