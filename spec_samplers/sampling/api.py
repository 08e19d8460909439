"""FlashInfer-compatible sampling operations (``flashinfer.sampling``, versions 0.6-0.7).

Same names, parameter names and order, defaults and return types as FlashInfer; switching is
``import spec_samplers.sampling as sampling`` in place of ``import flashinfer.sampling as sampling``.
Every operation runs the Triton kernels on CUDA tensors (when triton imports) and the PyTorch
reference (:mod:`spec_samplers.sampling.reference`) elsewhere; the keyword-only ``backend``
("auto", "torch", "triton") forces one (CPU tensors run the kernels only under TRITON_INTERPRET=1).
Both give the same tokens on the same inputs, seeds and offsets.

Semantics and randomness: :mod:`spec_samplers.sampling.reference`. Differences from FlashInfer
are listed in docs/sampling.md.
"""

from __future__ import annotations

from typing import Any

import torch

from spec_samplers import custom_ops, validation
from spec_samplers.cpu import draw as cpu_draw
from spec_samplers.kernels import sampling_launch
from spec_samplers.kernels.backend import LaunchConfig, check_backend, launch_config, use_triton
from spec_samplers.rng import derive_row_seeds
from spec_samplers.sampling import reference

SampleResult = torch.Tensor | tuple[torch.Tensor, torch.Tensor]

# -- shared work ----------------------------------------------------------------------------------
#
# An operation checks its arguments (helpers that return; canonical tensors for the PyTorch
# paths, the values as given for the kernels, which normalise them), then calls its launcher
# (spec_samplers.kernels.sampling_launch, which launches the kernels in its own body), its
# PyTorch reference, or, while Dynamo traces or on meta tensors, its custom op
# (spec_samplers.custom_ops): three calls from the operation to a kernel launch at most.


def _path(backend: str, x: torch.Tensor, config: LaunchConfig | None) -> bool | None:
    """Which code runs a call on ``x``: True the kernels, False the PyTorch reference, None the
    custom op (Dynamo traces, or meta tensors without a tool planning kernels on them:
    ``config.kernels``, :func:`spec_samplers.kernels.backend.planned_for`)."""
    if torch.compiler.is_compiling():
        return None
    kernels = use_triton(check_backend(backend), x.device, config)
    return None if custom_ops.routed(x) and not kernels else kernels


def _filters(
    B: int, V: int, device: torch.device, check_values: bool, top_k: object, top_p: object, min_p: object, kernels: bool
) -> dict[str, Any]:
    """top_k / top_p / min_p (None stays None: no filter): as given for the kernels, which
    normalise them in their prologue (validation.top_k_arg ...), else as [B] canonical tensors."""
    if kernels:
        return dict(
            top_k=None if top_k is None else validation.top_k_arg(top_k, B, V, device),
            top_p=None if top_p is None else validation.top_p_arg(top_p, B, device, check_values),
            min_p=None if min_p is None else validation.min_p_arg(min_p, B, device, check_values),
        )
    return dict(
        top_k=None if top_k is None else validation.canonical_top_k(top_k, B, V, device),
        top_p=None if top_p is None else validation.canonical_top_p(top_p, B, device, check_values),
        min_p=None if min_p is None else validation.canonical_min_p(min_p, B, device, check_values),
    )


def _sample(
    input_name: str,  # "probs" or "logits"
    x: object,  # [R, V]
    indices: object,
    generator: object,
    check_nan: bool,
    seed: object,
    offset: object,
    backend: str,
    *,
    top_k: object = None,
    top_p: object = None,
    min_p: object = None,
    filter_apply_order: str | None = None,  # given by the operations with two filters
    return_valid: bool = False,
) -> Any:
    """Every sampling operation: validation, the parameters in the path's form, the draw (the
    kernels derive the rows' seeds of a scalar seed themselves)."""
    joint = False if filter_apply_order is None else validation.check_filter_order(filter_apply_order)
    x = validation.check_matrix(input_name, x)
    check_nan = bool(check_nan)
    rows, B, out_dtype = validation.resolve_rows(indices, x.shape[0], x.device, check_nan, input_name)
    if check_nan:
        validation.check_no_nan(input_name, x)
    config = launch_config()
    kernels = _path(backend, x, config)
    filters = _filters(B, x.shape[1], x.device, check_nan, top_k, top_p, min_p, bool(kernels))
    logits = input_name == "logits"
    if kernels:
        randomness = validation.kernel_seeds(seed, offset, generator, B, x.device)
        draw = dict(x=x, rows=rows, logits=logits, joint=joint, **filters, **randomness)
        tokens, valid = sampling_launch.sample_triton(**draw, out_dtype=out_dtype, config=config)
        return (tokens, valid) if return_valid else tokens
    seeds, offsets, shared_offset = validation.resolve_seeds(seed, offset, generator, B, x.device)
    if shared_offset is not None:  # one seed for the batch: the rows' own seeds derive from it
        seeds = derive_row_seeds(seeds, shared_offset, B)
    # (the reference and the custom op take the rows as an int64 tensor)
    rows = torch.arange(B, device=x.device, dtype=torch.int64) if rows is None else rows.to(torch.int64)
    draw = dict(x=x, rows=rows, seeds=seeds, offsets=offsets, logits=logits, joint=joint, **filters)
    if kernels is None:
        tokens, valid = custom_ops.sample(**draw, backend=backend)
    elif backend == "auto" and all(f is None for f in filters.values()) and x.shape[0] and cpu_draw.available(x):
        # the compiled CPU path (numba), as the samplers' twins: the reference's tokens
        tokens, valid = cpu_draw.sample_rows(x, rows, seeds, offsets, logits)
    elif backend == "auto" and x.shape[0] and cpu_draw.available(x) and _finite(filters["min_p"]):
        # with filters: thresholds by a radix select (cpu._filter_kernels), the reference's tokens
        tokens, valid = cpu_draw.sample_filtered_rows(x, rows, seeds, offsets, logits, joint=joint, **filters)
    else:
        tokens, valid = reference.sample_reference(**draw)
    tokens = tokens.to(out_dtype)
    return (tokens, valid) if return_valid else tokens


def _finite(min_p: torch.Tensor | None) -> bool:
    """Whether min-p's values are all finite (an infinite one can make the reference's threshold
    NaN, which the compiled path leaves to it)."""
    return min_p is None or bool(torch.isfinite(min_p).all())


def _renorm(probs: object, top_k: object, top_p: object, out_dtype: torch.dtype | None, backend: str) -> torch.Tensor:
    probs = validation.check_matrix("probs", probs)
    config = launch_config()
    kernels = _path(backend, probs, config)
    filters = _filters(probs.shape[0], probs.shape[1], probs.device, False, top_k, top_p, None, bool(kernels))
    del filters["min_p"]
    out_dtype = out_dtype or probs.dtype
    if kernels is None:
        return custom_ops.renorm(probs, **filters, out_dtype=out_dtype, backend=backend)
    if kernels:
        return sampling_launch.renorm_triton(probs=probs, **filters, out_dtype=out_dtype, config=config)
    if backend == "auto" and out_dtype == torch.float32 and cpu_draw.available(probs):
        return cpu_draw.renorm_rows(probs, **filters)  # compiled (numba): the reference's floats
    return reference.renorm_reference(probs, **filters, out_dtype=out_dtype)


# -- the operations -------------------------------------------------------------------------------
#
# Signatures are FlashInfer's, parameter for parameter; they are laid out by hand, one group of
# parameters a line (the shared sampling parameters on two lines), hence the formatter is off.

# fmt: off


def softmax(
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    temperature: torch.Tensor | float | None = None,  # None (1), a scalar or [B]
    enable_pdl: bool | None = None,
    *, backend: str = "auto",
) -> torch.Tensor:
    """Softmax of ``logits / temperature`` per row.

    Parameters
    ----------
    logits : torch.Tensor
        [B, V] fp32/fp16/bf16. NaN logits count as -inf; a row that is all -inf gives zeros.
    temperature : torch.Tensor or float, optional
        None (1), a scalar or a [B] tensor; 0 gives the one-hot of the row's argmax.
    enable_pdl : bool, optional
        Accepted for compatibility and ignored.
    backend : str
        "auto" (Triton on CUDA), "torch" or "triton".

    Returns
    -------
    torch.Tensor
        [B, V] fp32.

    Examples
    --------
    >>> import torch, spec_samplers.sampling as sampling
    >>> probs = sampling.softmax(torch.randn(4, 50), temperature=torch.tensor([0.8, 1.0, 1.2, 0.9]))
    """
    logits = validation.check_matrix("logits", logits)
    config = launch_config()
    kernels = _path(backend, logits, config)
    if kernels:  # (the kernels read the temperature as given)
        temp = validation.temperature_arg(temperature, logits.shape[0], logits.device, check_values=False)
        return sampling_launch.softmax_triton(logits=logits, temperature=temp, config=config)
    temp = validation.canonical_temperature(temperature, logits.shape[0], logits.device, check_values=False)
    if kernels is None:
        return custom_ops.softmax(logits, temp, backend)
    if backend == "auto" and cpu_draw.available(logits):
        # compiled (numba): the rule's floats (torch.softmax's cost ~15 eager ops a call, most of it
        # cache misses where a model's forward pass ran just before)
        return cpu_draw.softmax_rows(logits, temp)
    return reference.softmax_reference(logits, temp)


def sampling_from_probs(
    probs: torch.Tensor,  # [R, V] fp32/fp16/bf16, unnormalised
    indices: torch.Tensor | None = None,  # [B] int32/int64: output b samples row indices[b]
    deterministic: bool = True, generator: torch.Generator | None = None, check_nan: bool = False,
    seed: int | torch.Tensor | None = None, offset: int | torch.Tensor | None = None,
    return_valid: bool = False, *, backend: str = "auto",
) -> SampleResult:
    """One sample per output row from its (unnormalised) probabilities.

    Parameters
    ----------
    probs : torch.Tensor
        [R, V] fp32/fp16/bf16; rows need not sum to one.
    indices : torch.Tensor, optional
        [B] int32/int64: output b samples input row ``indices[b]`` (default: B = R, row b).
    deterministic : bool
        Accepted and ignored: every path is deterministic.
    generator : torch.Generator, optional
        Draws the per-row seeds when ``seed`` is None (default: torch's, of the device).
    check_nan : bool
        Raise ValueError on NaN in ``probs``; also checks parameter tensors and ``indices``
        (synchronises with the host). Without it NaN entries count as probability 0, and a row
        left without mass (all NaN) gives token -1 with valid False, in every sampling op:
        FlashInfer gives token 0 there (valid False too); -1 is never a real token.
    seed, offset : int or torch.Tensor, optional
        Scalars (one stream for the batch, rows decorrelated) or [B] int64 tensors (row b uses
        ``(seed[b], offset[b])``, so its token depends on nothing else); offset defaults to 0.
    return_valid : bool
        Also return [B] bool: the row has mass (invalid rows give -1).
    backend : str
        "auto" (Triton on CUDA), "torch" or "triton".

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        [B] tokens, int32 (or the dtype of ``indices``), and with ``return_valid`` [B] bool.

    Examples
    --------
    >>> import torch, spec_samplers.sampling as sampling
    >>> probs = torch.softmax(torch.randn(4, 50), -1)
    >>> tokens = sampling.sampling_from_probs(probs, seed=torch.arange(4), offset=torch.zeros(4, dtype=torch.int64))
    """
    return _sample("probs", probs, indices, generator, check_nan, seed, offset, backend, return_valid=return_valid)


def sampling_from_logits(
    logits: torch.Tensor,  # [R, V] fp32/fp16/bf16
    indices: torch.Tensor | None = None,  # [B] int32/int64: output b samples logits row indices[b]
    deterministic: bool = True, generator: torch.Generator | None = None, check_nan: bool = False,
    seed: int | torch.Tensor | None = None, offset: int | torch.Tensor | None = None,
    *, backend: str = "auto",
) -> torch.Tensor:
    """One sample per output row from softmax(logits), without writing the probabilities.

    Parameters
    ----------
    logits : torch.Tensor
        [R, V] fp32/fp16/bf16; rows that are all -inf give -1.
    indices, deterministic, generator, check_nan, seed, offset, backend
        As :func:`sampling_from_probs`.

    Returns
    -------
    torch.Tensor
        [B] int32 (or the dtype of ``indices``).

    Examples
    --------
    >>> import torch, spec_samplers.sampling as sampling
    >>> tokens = sampling.sampling_from_logits(torch.randn(4, 50), seed=7, offset=0)
    """
    out: torch.Tensor = _sample("logits", logits, indices, generator, check_nan, seed, offset, backend)
    return out


def top_p_sampling_from_probs(
    probs: torch.Tensor,  # [R, V] fp32/fp16/bf16
    top_p: torch.Tensor | float,  # scalar or [B]: the nucleus mass, in (0, 1]
    indices: torch.Tensor | None = None,  # [B] int32/int64
    deterministic: bool = True, generator: torch.Generator | None = None, check_nan: bool = False,
    seed: int | torch.Tensor | None = None, offset: int | torch.Tensor | None = None,
    return_valid: bool = False, *, backend: str = "auto",
) -> SampleResult:
    """Nucleus sampling: keeps token x iff the mass of the tokens strictly more probable than x
    is < top_p (of the row's mass); top_p = 1 keeps every token.

    Parameters
    ----------
    probs : torch.Tensor
        [R, V] fp32/fp16/bf16, unnormalised rows allowed.
    top_p : torch.Tensor or float
        A scalar or [B] (one per output row), in (0, 1].
    indices, deterministic, generator, check_nan, seed, offset, return_valid, backend
        As :func:`sampling_from_probs`.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        [B] tokens from the nucleus (and [B] valid with ``return_valid``), as
        :func:`sampling_from_probs`.

    Examples
    --------
    >>> import torch, spec_samplers.sampling as sampling
    >>> probs = torch.softmax(torch.randn(4, 50), -1)
    >>> tokens, valid = sampling.top_p_sampling_from_probs(probs, 0.9, return_valid=True)
    """
    rest = (indices, generator, check_nan, seed, offset, backend)
    return _sample("probs", probs, *rest, top_p=top_p, return_valid=return_valid)


def top_k_sampling_from_probs(
    probs: torch.Tensor,  # [R, V] fp32/fp16/bf16
    top_k: torch.Tensor | int,  # scalar or [B] int; <= 0 or >= V keeps every token
    indices: torch.Tensor | None = None,  # [B] int32/int64
    deterministic: bool = True, generator: torch.Generator | None = None, check_nan: bool = False,
    seed: int | torch.Tensor | None = None, offset: int | torch.Tensor | None = None,
    return_valid: bool = False, *, backend: str = "auto",
) -> SampleResult:
    """Top-k sampling: keeps the tokens whose probability is >= the k-th largest (all tokens
    tied with it).

    Parameters
    ----------
    probs : torch.Tensor
        [R, V] fp32/fp16/bf16, ranked per row.
    top_k : torch.Tensor or int
        A scalar or [B] int; <= 0 or >= V keeps every token.
    indices, deterministic, generator, check_nan, seed, offset, return_valid, backend
        As :func:`sampling_from_probs`.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        [B] tokens (and [B] valid), as :func:`sampling_from_probs`.

    Examples
    --------
    >>> import torch, spec_samplers.sampling as sampling
    >>> probs = torch.softmax(torch.randn(4, 50), -1)
    >>> tokens = sampling.top_k_sampling_from_probs(probs, torch.tensor([1, 5, 10, 0]))
    """
    rest = (indices, generator, check_nan, seed, offset, backend)
    return _sample("probs", probs, *rest, top_k=top_k, return_valid=return_valid)


def min_p_sampling_from_probs(
    probs: torch.Tensor,  # [R, V] fp32/fp16/bf16
    min_p: torch.Tensor | float,  # scalar or [B], in [0, 1]: a fraction of the row's top probability
    indices: torch.Tensor | None = None,  # [B] int32/int64
    deterministic: bool = True, generator: torch.Generator | None = None, check_nan: bool = False,
    seed: int | torch.Tensor | None = None, offset: int | torch.Tensor | None = None,
    return_valid: bool = False, *, backend: str = "auto",
) -> SampleResult:
    """Min-p sampling: keeps the tokens with probability >= min_p * (the row's largest
    probability), then draws among them.

    Parameters
    ----------
    probs : torch.Tensor
        [R, V] fp32/fp16/bf16: the row's largest entry sets the threshold.
    min_p : torch.Tensor or float
        A scalar or [B], in [0, 1].
    indices, deterministic, generator, check_nan, seed, offset, return_valid, backend
        As :func:`sampling_from_probs`.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        As :func:`sampling_from_probs`: tokens, and the valid mask on request.

    Examples
    --------
    >>> import torch, spec_samplers.sampling as sampling
    >>> tokens = sampling.min_p_sampling_from_probs(torch.softmax(torch.randn(4, 50), -1), 0.05)
    """
    rest = (indices, generator, check_nan, seed, offset, backend)
    return _sample("probs", probs, *rest, min_p=min_p, return_valid=return_valid)


def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,  # [R, V] fp32/fp16/bf16
    top_k: torch.Tensor | int, top_p: torch.Tensor | float,  # scalars or [B]; top-k on the logits
    indices: torch.Tensor | None = None, filter_apply_order: str = "top_k_first",
    deterministic: bool = True, generator: torch.Generator | None = None, check_nan: bool = False,
    seed: int | torch.Tensor | None = None, offset: int | torch.Tensor | None = None,
    *, backend: str = "auto",
) -> torch.Tensor:
    """Top-k then top-p, sampled from softmax(logits) without writing it.

    Top-k compares logits, top-p the softmax masses.

    Parameters
    ----------
    logits : torch.Tensor
        [R, V] fp32/fp16/bf16.
    top_k, top_p
        As :func:`top_k_sampling_from_probs` and :func:`top_p_sampling_from_probs`.
    filter_apply_order : str
        "top_k_first" (top-p on the top-k survivors, renormalised) or "joint" (both on the
        full row).
    indices, deterministic, generator, check_nan, seed, offset, backend
        As :func:`sampling_from_probs`.

    Returns
    -------
    torch.Tensor
        [B] int32 (or the dtype of ``indices``); -1 for a row that is all -inf.

    Examples
    --------
    >>> import torch, spec_samplers.sampling as sampling
    >>> tokens = sampling.top_k_top_p_sampling_from_logits(torch.randn(4, 50), 10, 0.9)
    """
    rest = (indices, generator, check_nan, seed, offset, backend)
    out: torch.Tensor = _sample(
        "logits", logits, *rest, top_k=top_k, top_p=top_p, filter_apply_order=filter_apply_order
    )
    return out


def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,  # [R, V] fp32/fp16/bf16
    top_k: torch.Tensor | int, top_p: torch.Tensor | float,  # scalars or [B]
    indices: torch.Tensor | None = None, filter_apply_order: str = "top_k_first",
    deterministic: bool = True, generator: torch.Generator | None = None, check_nan: bool = False,
    seed: int | torch.Tensor | None = None, offset: int | torch.Tensor | None = None,
    return_valid: bool = False, *, backend: str = "auto",
) -> SampleResult:
    """Top-k and top-p sampling from probabilities, in ``filter_apply_order`` (as
    :func:`top_k_top_p_sampling_from_logits`).

    Parameters
    ----------
    probs : torch.Tensor
        [R, V] fp32/fp16/bf16; top-p reads masses relative to the row's sum.
    top_k, top_p, filter_apply_order
        As :func:`top_k_top_p_sampling_from_logits`.
    indices, deterministic, generator, check_nan, seed, offset, return_valid, backend
        As :func:`sampling_from_probs`.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        [B] tokens from the survivors of both filters; see :func:`sampling_from_probs`.

    Examples
    --------
    >>> import torch, spec_samplers.sampling as sampling
    >>> probs = torch.softmax(torch.randn(4, 50), -1)
    >>> tokens = sampling.top_k_top_p_sampling_from_probs(probs, 10, 0.9, filter_apply_order="joint")
    """
    rest = (indices, generator, check_nan, seed, offset, backend)
    order = filter_apply_order
    return _sample("probs", probs, *rest, top_k=top_k, top_p=top_p, filter_apply_order=order, return_valid=return_valid)


def top_p_renorm_probs(
    probs: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_p: torch.Tensor | float,  # scalar or [B], in (0, 1]
    is_deterministic: bool = False,
    *, backend: str = "auto",
) -> torch.Tensor:
    """The top-p survivors (as :func:`top_p_sampling_from_probs`) renormalised, 0 elsewhere.

    Parameters
    ----------
    probs : torch.Tensor
        [B, V] fp32/fp16/bf16.
    top_p : torch.Tensor or float
        A scalar or [B], in (0, 1].
    is_deterministic : bool
        Accepted and ignored (always deterministic).
    backend : str
        As :func:`softmax`.

    Returns
    -------
    torch.Tensor
        [B, V] fp32 (whatever the dtype of ``probs``).

    Examples
    --------
    >>> import torch, spec_samplers.sampling as sampling
    >>> renorm = sampling.top_p_renorm_probs(torch.softmax(torch.randn(4, 50), -1), 0.9)
    """
    return _renorm(probs, None, top_p, torch.float32, backend)


def top_k_renorm_probs(
    probs: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor | int,  # scalar or [B] int
    *, backend: str = "auto",
) -> torch.Tensor:
    """The top-k survivors (ties kept) renormalised, 0 elsewhere.

    Parameters
    ----------
    probs : torch.Tensor
        [B, V] fp32/fp16/bf16; the output keeps its dtype.
    top_k : torch.Tensor or int
        A scalar or [B] int; <= 0 or >= V keeps every token.
    backend : str
        As :func:`softmax`.

    Returns
    -------
    torch.Tensor
        [B, V], the dtype of ``probs``.

    Examples
    --------
    >>> import torch, spec_samplers.sampling as sampling
    >>> renorm = sampling.top_k_renorm_probs(torch.softmax(torch.randn(4, 50), -1), 10)
    """
    return _renorm(probs, top_k, None, None, backend)  # None: the dtype of probs


def top_k_mask_logits(
    logits: torch.Tensor,  # [B, V] fp32/fp16/bf16
    top_k: torch.Tensor | int,  # scalar or [B] int: how many logits each row keeps
    *, backend: str = "auto",
) -> torch.Tensor:
    """Logits below the k-th largest set to -inf (ties kept).

    Parameters
    ----------
    logits : torch.Tensor
        [B, V] fp32/fp16/bf16.
    top_k, backend
        As :func:`top_k_renorm_probs` (``top_k`` <= 0 or >= V keeps every logit).

    Returns
    -------
    torch.Tensor
        [B, V], the dtype of ``logits``: the kept logits unchanged.

    Examples
    --------
    >>> import torch, spec_samplers.sampling as sampling
    >>> masked = sampling.top_k_mask_logits(torch.randn(4, 50), 10)
    """
    logits = validation.check_matrix("logits", logits)
    config = launch_config()
    kernels = _path(backend, logits, config)
    k = _filters(logits.shape[0], logits.shape[1], logits.device, False, top_k, None, None, bool(kernels))["top_k"]
    if kernels is None:
        return custom_ops.mask_logits(logits, k, backend)
    if kernels:
        return sampling_launch.mask_logits_triton(logits=logits, top_k=k, config=config)
    if backend == "auto" and cpu_draw.available(logits):
        return cpu_draw.mask_logits_rows(logits, k)  # compiled (numba): the reference's floats
    return reference.mask_logits_reference(logits, k)


# fmt: on
