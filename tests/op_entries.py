"""The sampler ops under their per-layout call signatures, for the kernel-vs-reference tests.

Each sampler has one reference and one kernel launcher over a ``VerifyBatch``; these wrappers
only build the batch (padded or ragged, probabilities or logits) from positional arguments.
"""

from __future__ import annotations

from spec_samplers.kernels.verify_launch import block_triton, rejection_triton, typical_triton
from spec_samplers.layout import VerifyBatch
from spec_samplers.reference import block_reference, rejection_reference, typical_reference


def _rejection(op, batch, split):
    return op(batch) if split is None else op(batch, split=split)


def _typical(op, batch, thr, alpha, split):
    return op(batch, thr, alpha) if split is None else op(batch, thr, alpha, split=split)


def _entries(rej_op, typ_op):
    def padded(target, bonus, draft, ids, seeds, offsets=None, is_greedy=None, *, split=None):
        b = VerifyBatch.padded(target, bonus, draft, ids, seeds=seeds, offsets=offsets, is_greedy=is_greedy)
        return _rejection(rej_op, b, split)

    def ragged(target, bonus, draft, ids, cu, K, seeds, offsets=None, is_greedy=None, *, split=None):
        b = VerifyBatch.ragged(target, bonus, draft, ids, cu, K, seeds=seeds, offsets=offsets, is_greedy=is_greedy)
        return _rejection(rej_op, b, split)

    def from_logits(target, bonus, draft, ids, temperature, seeds, offsets=None, *, split=None):
        b = VerifyBatch.padded(target, bonus, draft, ids, seeds=seeds, offsets=offsets, temperature=temperature)
        return _rejection(rej_op, b, split)

    def ragged_from_logits(target, bonus, draft, ids, cu, K, temperature, seeds, offsets=None, *, split=None):
        b = VerifyBatch.ragged(target, bonus, draft, ids, cu, K, seeds=seeds, offsets=offsets, temperature=temperature)
        return _rejection(rej_op, b, split)

    def typical(target, bonus, ids, thr, alpha, *, split=None):
        return _typical(typ_op, VerifyBatch.padded(target, bonus, None, ids), thr, alpha, split)

    def typical_ragged(target, bonus, ids, cu, K, thr, alpha, *, split=None):
        return _typical(typ_op, VerifyBatch.ragged(target, bonus, None, ids, cu, K), thr, alpha, split)

    def typical_from_logits(target, bonus, ids, temperature, thr, alpha, *, split=None):
        b = VerifyBatch.padded(target, bonus, None, ids, temperature=temperature)
        return _typical(typ_op, b, thr, alpha, split)

    def typical_ragged_from_logits(target, bonus, ids, cu, K, temperature, thr, alpha, *, split=None):
        b = VerifyBatch.ragged(target, bonus, None, ids, cu, K, temperature=temperature)
        return _typical(typ_op, b, thr, alpha, split)

    return (
        padded,
        ragged,
        from_logits,
        ragged_from_logits,
        typical,
        typical_ragged,
        typical_from_logits,
        typical_ragged_from_logits,
    )


(
    rejection_sample_reference,
    rejection_sample_ragged_reference,
    rejection_sample_from_logits_reference,
    rejection_sample_ragged_from_logits_reference,
    typical_accept_reference,
    typical_accept_ragged_reference,
    typical_accept_from_logits_reference,
    typical_accept_ragged_from_logits_reference,
) = _entries(rejection_reference, typical_reference)
(
    rejection_sample_triton,
    rejection_sample_ragged_triton,
    rejection_sample_from_logits_triton,
    rejection_sample_ragged_from_logits_triton,
    typical_accept_triton,
    typical_accept_ragged_triton,
    typical_accept_from_logits_triton,
    typical_accept_ragged_from_logits_triton,
) = _entries(rejection_triton, typical_triton)

# Block verification has rejection sampling's entries (seeds, offsets, greedy rows, logits).
(
    block_verify_reference,
    block_verify_ragged_reference,
    block_verify_from_logits_reference,
    block_verify_ragged_from_logits_reference,
) = _entries(block_reference, typical_reference)[:4]
(
    block_verify_triton,
    block_verify_ragged_triton,
    block_verify_from_logits_triton,
    block_verify_ragged_from_logits_triton,
) = _entries(block_triton, typical_triton)[:4]
