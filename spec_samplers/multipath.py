"""Greedy multi-path block verification (Thomas & Pal 2026): K independent draft paths, one
target pass, block verification on the greedily picked path against the pick's own law."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from spec_samplers.block import BlockVerificationSampler
from spec_samplers.constants import input_error
from spec_samplers.kernels.multipath_launch import multipath_tree_triton
from spec_samplers.layout import TreeBatch
from spec_samplers.tree.multipath import multipath_tree_reference, paths_of


class MultipathBlockVerificationSampler(BlockVerificationSampler):
    """GBV (greedy multi-path block verification), exact: the tree entries take K disjoint paths
    of equal length L from the root (path i, depth d is node i*L + d; parents
    ``spec_samplers.tree.multipath.path_parents(K, L)``), each path drawn independently from the
    draft (``draft_sampling="independent"``, draft rows required). At every node the verifier
    picks the drafted child with the highest key min(1, q/p) (ties: the lower token id), then runs
    block verification on the picked path with the draft rows replaced by the law of that pick,
    p~ = the law of the maximum of K draws in the order (:mod:`spec_samplers.tree.multipath`).
    The output has the target's law (tested by exact enumeration); K = 1 is block verification
    token for token. fp32 is safe for every K (no cancellation; cost O(K) per vocabulary entry).

    Chains (``forward`` and the other chain entries) are one path: block verification.
    Any other tree shape or sibling policy raises :class:`SpecSamplerInputError` naming the
    shape expected. The shape check reads ``parents`` on the host once per call when they are a
    tensor (a Python list costs nothing). Backends: the PyTorch reference, or on CUDA the Triton
    kernels (:mod:`spec_samplers.kernels.multipath_launch`: the pick, a sort of each of the L
    visited rows for the order's CDF, the verification), token-equal to the reference.

    Example::

        >>> from spec_samplers.tree.multipath import path_parents
        >>> K, L, V = 3, 4, 32
        >>> q = torch.softmax(torch.randn(2, K * L + 1, V), -1)      # [B, N+1, V]
        >>> p = torch.softmax(torch.randn(2, K * L + 1, V), -1)
        >>> ids = torch.randint(0, V, (2, K * L))                    # path i's tokens at i*L .. i*L+L-1
        >>> out = MultipathBlockVerificationSampler().forward_tree(q, p, ids, path_parents(K, L))
        >>> out.token_ids.shape                                      # [B, L+1]
        torch.Size([2, 5])
    """

    tree_reference = staticmethod(multipath_tree_reference)  # type: ignore[assignment]  # takes num_paths=
    tree_kernel = staticmethod(multipath_tree_triton)  # type: ignore[assignment]  # takes a TreeBatch
    tree_kernel_takes_call = False  # (BlockVerificationSampler's is True) its launcher takes a TreeBatch
    #: the decoding loop drafts K paths as the static tree [K, 1, .., 1] (level order) and hands
    #: this sampler the nodes path-major (spec_samplers.decoding.tree_drafting)
    tree_layout: ClassVar[str] = "paths"
    #: the last call's number of paths (set by the shape check, read by :meth:`tree_options`)
    _num_paths: int = 0
    _static_parents: list[list[int]] | None = None

    def tree_options(self) -> dict[str, Any]:
        return {"num_paths": self._num_paths}

    def _check_paths(self, parents: list[list[int]], max_depth: int | None) -> None:
        K, L = paths_of(parents)
        if max_depth is not None and not isinstance(max_depth, bool) and isinstance(max_depth, int) and max_depth < L:
            raise input_error("max_depth", f">= the paths' length L = {L} (or None)", max_depth)
        self._num_paths = K

    def _finish_batch(
        self,
        target: torch.Tensor,
        draft: torch.Tensor | None,
        rows: torch.Tensor,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        known_depth: int | None,
        draft_sampling: str,
        max_depth: int | None,
        is_greedy: torch.Tensor | None,
    ) -> TreeBatch:
        # a tensor's values are read on the host once (a list was kept by _parents)
        rows_of_parents, self._static_parents = self._static_parents or parents.tolist(), None
        if draft_sampling != "independent":
            raise input_error("draft_sampling", "'independent' (K paths drawn independently)", repr(draft_sampling))
        if draft is None:
            raise input_error(
                "draft_probs", "the draft rows (or draft_logits) the K paths were sampled from, not None", None
            )
        self._check_paths(rows_of_parents, max_depth)
        return super()._finish_batch(
            target, draft, rows, tokens, parents, known_depth, draft_sampling, max_depth, is_greedy
        )

    def _parents(self, parents: object, B: int, N: int, device: torch.device) -> tuple[torch.Tensor, int | None]:
        out = super()._parents(parents, B, N, device)
        if isinstance(parents, (list, tuple)):  # checked here, without a device read
            self._static_parents = [list(parents)]
        return out
