"""Lossless rejection sampling (Leviathan et al. 2023; Chen et al. 2023)."""

from __future__ import annotations

from typing import ClassVar

from spec_samplers.base import SpecDecodeStochasticBaseSampler
from spec_samplers.kernels.tree_launch import rejection_tree_triton
from spec_samplers.kernels.verify_launch import rejection_triton
from spec_samplers.reference import rejection_reference
from spec_samplers.tree.entries import TreeEntries
from spec_samplers.tree.reference import rejection_tree_reference


class RejectionSampler(TreeEntries, SpecDecodeStochasticBaseSampler):
    """Accept draft x_i with probability min(1, q_i(x_i) / p_i(x_i)); at the first rejection emit
    a sample of (q - p)+; after k accepted drafts emit the bonus token. The emitted tokens have
    exactly the target distribution. ``forward_tree`` and its twins verify draft trees by
    recursive rejection sampling (:mod:`spec_samplers.tree.reference`; docs/trees.md), exact for
    independent, without-replacement and deterministic siblings.

    Args:
        strict_mode: check token-id bounds and the [B] arguments too, as vLLM V0's strict mode
            (synchronises with the host).
        backend: "auto" (Triton kernels for CUDA tensors when triton imports, else PyTorch),
            "torch" (always the PyTorch path) or "triton" (always the kernels; CPU tensors only
            under TRITON_INTERPRET=1). Both give the same tokens on the same inputs and seeds
            (docs/contract.md, "Triton vs PyTorch", states the exact guarantee).
        check_values: also check the probabilities / logits (finite, non-negative, rows summing
            to one; synchronises with the host).
        use_flashinfer: vLLM V0's option, accepted and recorded; ``backend`` picks the kernels.

    Example::

        >>> import torch
        >>> from spec_samplers import RejectionSampler
        >>> B, k, V = 2, 3, 8
        >>> target = torch.softmax(torch.randn(B, k + 1, V), -1)   # [B, k+1, V]
        >>> draft = torch.softmax(torch.randn(B, k, V), -1)        # [B, k, V]
        >>> draft_ids = torch.multinomial(draft.view(-1, V), 1).view(B, k)
        >>> bonus = torch.multinomial(target[:, -1], 1)             # [B, 1]
        >>> out = RejectionSampler()(target, bonus, draft, draft_ids)  # [B, k+1] int64, -1 padded
    """

    lossless: ClassVar[bool] = True
    applies_filters: ClassVar[bool] = True
    takes_draft_rows: ClassVar[bool] = True
    reference_op = staticmethod(rejection_reference)
    requests_independent = True
    bonus_rows_in_place = True
    kernel_op = staticmethod(rejection_triton)
    kernel_counts = True  # the launcher adds batch.counters
    tree_reference = staticmethod(rejection_tree_reference)
    tree_kernel = staticmethod(rejection_tree_triton)
    tree_kernel_takes_call = True
