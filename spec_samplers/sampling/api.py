"""FlashInfer-compatible sampling operations (``flashinfer.sampling``, versions 0.6-0.7).

Same names, parameter names and order, defaults and return types as FlashInfer; switching is
``import spec_samplers.sampling as sampling`` in place of ``import flashinfer.sampling as sampling``.
Every operation runs the Triton kernels on CUDA tensors (when triton imports) and the PyTorch
reference (:mod:`spec_samplers.sampling.reference`) elsewhere; the keyword-only ``backend``
("auto", "torch", "triton") forces one (CPU tensors run the kernels only under TRITON_INTERPRET=1).
Both give the same tokens on the same inputs, seeds and offsets.

Semantics and randomness: :mod:`spec_samplers.sampling.reference`. Differences from FlashInfer
are listed in the README ("FlashInfer-compatible sampling operations").
"""

from __future__ import annotations

import torch

from spec_samplers.kernels.backend import check_backend, use_triton
from spec_samplers.sampling import checks
from spec_samplers.sampling import reference as ref

SampleResult = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def _triton(backend: str, device: torch.device) -> bool:
    return use_triton(check_backend(backend), device)


def _sample(
    name: str,  # the input argument's name, for errors
    x: torch.Tensor,  # [R, V] probabilities or logits
    logits: bool,
    indices: torch.Tensor | None,  # [B] int32/int64
    generator: torch.Generator | None,
    check_nan: bool,
    seed: int | torch.Tensor | None,
    offset: int | torch.Tensor | None,
    return_valid: bool,
    backend: str,
    top_k: object = None,
    top_p: object = None,
    min_p: object = None,
    joint: bool = False,
) -> SampleResult:
    """Validation, canonical parameters, per-row seeds, backend: shared by every sampling op."""
    checks.check_matrix(name, x)
    device = x.device
    R, V = x.shape
    rows, B, out_dtype = checks.resolve_rows(indices, R, device, check_nan, name)
    if check_nan:
        checks.check_no_nan(name, x)
    k = None if top_k is None else checks.canonical_top_k(top_k, B, V, device)
    p = None if top_p is None else checks.canonical_top_p(top_p, B, device, check_nan)
    m = None if min_p is None else checks.canonical_min_p(min_p, B, device, check_nan)
    seeds, offsets = checks.resolve_seeds(seed, offset, generator, B, device)
    if _triton(backend, device):
        from spec_samplers.kernels.sampling_launch import sample_triton

        tokens, valid = sample_triton(
            x=x, rows=rows, seeds=seeds, offsets=offsets, logits=logits, top_k=k, top_p=p, min_p=m, joint=joint
        )
    else:
        tokens, valid = ref.sample_reference(x, rows, seeds, offsets, logits, k, p, m, joint)
    tokens = tokens.to(out_dtype)
    return (tokens, valid) if return_valid else tokens


def softmax(
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    temperature: torch.Tensor | float | None = None,  # scalar or [B]
    enable_pdl: bool | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Softmax of ``logits / temperature`` per row. Returns [B, V] fp32.

    ``temperature``: None (1), a scalar or a [B] tensor; 0 gives the one-hot of the row's argmax.
    ``enable_pdl`` is accepted for compatibility and ignored. NaN logits count as -inf; a row
    that is all -inf gives zeros.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> probs = sampling.softmax(torch.randn(4, 50), temperature=torch.tensor([0.8, 1.0, 1.2, 0.9]))
    """
    checks.check_matrix("logits", logits)
    B = logits.shape[0]
    temp = checks.canonical_temperature(temperature, B, logits.device, check_values=False)
    if _triton(backend, logits.device):
        from spec_samplers.kernels.sampling_launch import softmax_triton

        return softmax_triton(logits=logits, temperature=temp)
    return ref.softmax_reference(logits, temp)


def sampling_from_probs(
    probs: torch.Tensor,  # [R, V] fp32/fp16/bf16
    indices: torch.Tensor | None = None,  # [B] int32/int64: output b samples probs[indices[b]]
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,  # scalar, or [B] int64 tensor (per output row)
    offset: int | torch.Tensor | None = None,  # scalar, or [B] int64 tensor
    return_valid: bool = False,
    *,
    backend: str = "auto",
) -> SampleResult:
    """One sample per output row from its (unnormalised) probabilities.

    Returns [B] tokens (int32, or the dtype of ``indices``), and with ``return_valid`` also [B]
    bool (the row has mass; invalid rows give -1). ``deterministic`` is accepted and ignored
    (every path is deterministic). ``check_nan`` raises ValueError on NaN in ``probs`` (and checks
    parameter tensors and ``indices``; it synchronises with the host).

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> probs = torch.softmax(torch.randn(4, 50), -1)
        >>> tokens = sampling.sampling_from_probs(probs, seed=torch.arange(4), offset=torch.zeros(4, dtype=torch.int64))
    """
    return _sample("probs", probs, False, indices, generator, check_nan, seed, offset, return_valid, backend)


def sampling_from_logits(
    logits: torch.Tensor,  # [R, V] fp32/fp16/bf16
    indices: torch.Tensor | None = None,  # [B]
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """One sample per output row from softmax(logits), without writing the probabilities.
    Returns [B] int32 (or the dtype of ``indices``); rows that are all -inf give -1.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> tokens = sampling.sampling_from_logits(torch.randn(4, 50), seed=7, offset=0)
    """
    out = _sample("logits", logits, True, indices, generator, check_nan, seed, offset, False, backend)
    assert isinstance(out, torch.Tensor)
    return out


def top_p_sampling_from_probs(
    probs: torch.Tensor,  # [R, V]
    top_p: torch.Tensor | float,  # scalar or [B], in (0, 1]
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
    *,
    backend: str = "auto",
) -> SampleResult:
    """Nucleus sampling: keeps token x iff the mass of the tokens strictly more probable than x is
    < top_p (of the row's mass); top_p = 1 keeps every token. Returns as :func:`sampling_from_probs`.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> tokens = sampling.top_p_sampling_from_probs(torch.softmax(torch.randn(4, 50), -1), 0.9)
    """
    return _sample(
        "probs", probs, False, indices, generator, check_nan, seed, offset, return_valid, backend, top_p=top_p
    )


def top_k_sampling_from_probs(
    probs: torch.Tensor,  # [R, V]
    top_k: torch.Tensor | int,  # scalar or [B] int; <= 0 or >= V keeps every token
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
    *,
    backend: str = "auto",
) -> SampleResult:
    """Top-k sampling: keeps the tokens whose probability is >= the k-th largest (all tokens tied
    with it). Returns as :func:`sampling_from_probs`.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> probs = torch.softmax(torch.randn(4, 50), -1)
        >>> tokens = sampling.top_k_sampling_from_probs(probs, torch.tensor([1, 5, 10, 0]))
    """
    return _sample(
        "probs", probs, False, indices, generator, check_nan, seed, offset, return_valid, backend, top_k=top_k
    )


def min_p_sampling_from_probs(
    probs: torch.Tensor,  # [R, V]
    min_p: torch.Tensor | float,  # scalar or [B], in [0, 1]
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
    *,
    backend: str = "auto",
) -> SampleResult:
    """Min-p sampling: keeps the tokens with probability >= min_p * (the row's largest).
    Returns as :func:`sampling_from_probs`.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> tokens = sampling.min_p_sampling_from_probs(torch.softmax(torch.randn(4, 50), -1), 0.05)
    """
    return _sample(
        "probs", probs, False, indices, generator, check_nan, seed, offset, return_valid, backend, min_p=min_p
    )


def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,  # [R, V]
    top_k: torch.Tensor | int,  # scalar or [B]
    top_p: torch.Tensor | float,  # scalar or [B]
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Top-k then top-p ("top_k_first": top-p on the top-k survivors, renormalised) or both on the
    full row ("joint"), sampled from softmax(logits) without writing it. Top-k compares logits,
    top-p the softmax masses. Returns [B] int32 (or the dtype of ``indices``).

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> tokens = sampling.top_k_top_p_sampling_from_logits(torch.randn(4, 50), 10, 0.9)
    """
    joint = checks.check_filter_order(filter_apply_order)
    out = _sample(
        "logits",
        logits,
        True,
        indices,
        generator,
        check_nan,
        seed,
        offset,
        False,
        backend,
        top_k=top_k,
        top_p=top_p,
        joint=joint,
    )
    assert isinstance(out, torch.Tensor)
    return out


def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,  # [R, V]
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
    *,
    backend: str = "auto",
) -> SampleResult:
    """Top-k and top-p sampling from probabilities ("top_k_first" or "joint", as
    :func:`top_k_top_p_sampling_from_logits`). Returns as :func:`sampling_from_probs`.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> probs = torch.softmax(torch.randn(4, 50), -1)
        >>> tokens = sampling.top_k_top_p_sampling_from_probs(probs, 10, 0.9, filter_apply_order="joint")
    """
    joint = checks.check_filter_order(filter_apply_order)
    return _sample(
        "probs",
        probs,
        False,
        indices,
        generator,
        check_nan,
        seed,
        offset,
        return_valid,
        backend,
        top_k=top_k,
        top_p=top_p,
        joint=joint,
    )


def _renorm(
    probs: torch.Tensor, top_k: object, top_p: object, out_dtype: torch.dtype | None, backend: str
) -> torch.Tensor:
    checks.check_matrix("probs", probs)
    B, V = probs.shape
    k = None if top_k is None else checks.canonical_top_k(top_k, B, V, probs.device)
    p = None if top_p is None else checks.canonical_top_p(top_p, B, probs.device, check_values=False)
    dtype = out_dtype or probs.dtype
    if _triton(backend, probs.device):
        from spec_samplers.kernels.sampling_launch import renorm_triton

        return renorm_triton(probs=probs, top_k=k, top_p=p, out_dtype=dtype)
    return ref.renorm_reference(probs, k, p, dtype)


def top_p_renorm_probs(
    probs: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_p: torch.Tensor | float,  # scalar or [B], in (0, 1]
    is_deterministic: bool = False,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """[B, V] fp32: the top-p survivors (as :func:`top_p_sampling_from_probs`) renormalised, 0
    elsewhere. ``is_deterministic`` is accepted and ignored (always deterministic).

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> renorm = sampling.top_p_renorm_probs(torch.softmax(torch.randn(4, 50), -1), 0.9)
    """
    return _renorm(probs, None, top_p, torch.float32, backend)


def top_k_renorm_probs(
    probs: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor | int,  # scalar or [B]
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """[B, V] (dtype of ``probs``): the top-k survivors (ties kept) renormalised, 0 elsewhere.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> renorm = sampling.top_k_renorm_probs(torch.softmax(torch.randn(4, 50), -1), 10)
    """
    return _renorm(probs, top_k, None, None, backend)


def top_k_mask_logits(
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor | int,  # scalar or [B]
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """[B, V] (dtype of ``logits``): logits below the k-th largest set to -inf (ties kept).

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> masked = sampling.top_k_mask_logits(torch.randn(4, 50), 10)
    """
    checks.check_matrix("logits", logits)
    B, V = logits.shape
    k = checks.canonical_top_k(top_k, B, V, logits.device)
    if _triton(backend, logits.device):
        from spec_samplers.kernels.sampling_launch import mask_logits_triton

        return mask_logits_triton(logits=logits, top_k=k)
    return ref.mask_logits_reference(logits, k)
