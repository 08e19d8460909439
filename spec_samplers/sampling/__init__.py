"""FlashInfer-compatible sampling operations: ``import spec_samplers.sampling`` in place of
``import flashinfer.sampling``.

Same names, parameters, defaults and return types as FlashInfer 0.6-0.7; beyond FlashInfer,
``seed`` / ``offset`` as [B] tensors are honoured per output row on the package's counter RNG (a
row's token never depends on its batch neighbours), and the PyTorch path (CPU) and the Triton
kernels (CUDA) give the same tokens. Semantics: :mod:`spec_samplers.sampling.reference`;
differences from FlashInfer: docs/sampling.md.

Example::

    >>> import torch
    >>> import spec_samplers.sampling as sampling
    >>> logits = torch.randn(4, 1000)
    >>> probs = sampling.softmax(logits, temperature=0.8)                       # [4, 1000] fp32
    >>> tokens = sampling.top_k_top_p_sampling_from_probs(probs, 50, 0.9)       # [4] int32
    >>> seeds, offsets = torch.arange(4), torch.zeros(4, dtype=torch.int64)
    >>> again = sampling.top_p_sampling_from_probs(probs, 0.9, seed=seeds, offset=offsets)
"""

from spec_samplers.sampling.api import (
    min_p_sampling_from_probs,
    sampling_from_logits,
    sampling_from_probs,
    softmax,
    top_k_mask_logits,
    top_k_renorm_probs,
    top_k_sampling_from_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_probs,
    top_p_sampling_from_probs,
)
from spec_samplers.sampling.speculative import chain_speculative_sampling

#: FlashInfer's aliases
top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs

__all__ = [
    "chain_speculative_sampling",
    "min_p_sampling_from_probs",
    "sampling_from_logits",
    "sampling_from_probs",
    "softmax",
    "top_k_mask_logits",
    "top_k_renorm_prob",
    "top_k_renorm_probs",
    "top_k_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_prob",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
]
