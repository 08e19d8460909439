"""Lossless block verification (Sun et al. 2024, "Block Verification Accelerates Speculative
Decoding"): the draft block is verified jointly, not token by token."""

from __future__ import annotations

from typing import ClassVar

from spec_samplers.base import SpecDecodeStochasticBaseSampler
from spec_samplers.kernels.tree_launch import block_tree_triton
from spec_samplers.kernels.verify_launch import block_triton
from spec_samplers.reference import block_reference
from spec_samplers.tree.entries import TreeEntries
from spec_samplers.tree.traversal import traversal_tree_reference


class BlockVerificationSampler(TreeEntries, SpecDecodeStochasticBaseSampler):
    """Block verification: with the running ratio rho_m = min(rho_{m-1} q(x)/p(x), 1) of each
    draft prefix and the residual mass Z_m = sum (rho_m q_m - p_m)+, the accepted length is the
    last m with u_m < h_m = Z_m / (Z_m + 1 - rho_m) (h = rho at the block's end), so a later
    position can rescue an earlier failure; the next token is a sample of (rho_tau q - p)+, or
    the bonus token when all k drafts pass. Lossless for the whole block, and its expected
    accepted length is never below token-wise rejection's (:class:`RejectionSampler`) on the
    same distributions. Greedy rows follow the argmax rule. Formulas and conventions: the block
    verification section of :mod:`spec_samplers.reference`.

    Same interface, options, seeds and output layout as :class:`RejectionSampler`. Cost: with
    draft distributions, a vocabulary pass at every draft position (token-wise rejection: one,
    only on rejection), because every threshold needs its position's residual mass; with
    point-mass drafts the masses have a closed form and the cost is rejection's.

    Trees (``forward_tree`` and its ragged and logits twins): Traversal Verification (Weng et al.
    2025, :mod:`spec_samplers.tree.traversal`), which is this rule on a chain; exact for every tree
    and sibling policy; one Triton launch per call (``block_tree_kernel``, the reference's tokens)
    when the Triton backend runs, the PyTorch reference otherwise.

    Args:
        strict_mode: check token-id bounds and probability values too (synchronises with the host).
        backend: "auto", "torch" or "triton", as for :class:`RejectionSampler`.

    Example, on the inputs of :class:`RejectionSampler`'s example, next to it on the same seeds::

        >>> from spec_samplers import BlockVerificationSampler
        >>> seeds = torch.tensor([1, 2])                            # [B] int64
        >>> block = BlockVerificationSampler()(target, bonus, draft, draft_ids, seeds=seeds)  # [B, k+1]
        >>> tokenwise = RejectionSampler()(target, bonus, draft, draft_ids, seeds=seeds)
        >>> (block != -1).sum(1), (tokenwise != -1).sum(1)         # emitted per row: block's mean is no lower
    """

    lossless: ClassVar[bool] = True
    applies_filters: ClassVar[bool] = True
    takes_draft_rows: ClassVar[bool] = True
    #: the bench's lossless theory for this sampler (spec_samplers.bench.quality.block_theory)
    acceptance_law: ClassVar[str] = "block"
    reference_op = staticmethod(block_reference)
    requests_independent = True
    bonus_rows_in_place = True
    kernel_op = staticmethod(block_triton)
    kernel_counts = True  # the launcher adds batch.counters
    #: Traversal Verification (Weng et al. 2025), the tree form of block verification
    tree_reference = staticmethod(traversal_tree_reference)
    tree_kernel = staticmethod(block_tree_triton)
    tree_kernel_takes_call = True
