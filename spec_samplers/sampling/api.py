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

import inspect
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import torch

from spec_samplers.kernels.backend import check_backend, use_triton
from spec_samplers.sampling import checks
from spec_samplers.sampling import reference as ref

SampleResult = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
R = TypeVar("R")
Arguments = dict[str, Any]  # an operation's bound arguments by parameter name, defaults applied
Run = Callable[[Arguments], R]  # the body of an operation


def _param(name: str, annotation: str, default: object = inspect.Parameter.empty) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation)


#: Every parameter of the operations, with FlashInfer's annotation and default: a name means the
#: same in every operation that takes it, so an operation's signature is a tuple of names.
PARAMETERS = {
    p.name: p
    for p in (
        _param("probs", "torch.Tensor"),  # [R, V] fp32/fp16/bf16 (R = B without indices)
        _param("logits", "torch.Tensor"),  # [R, V] fp32/fp16/bf16
        _param("temperature", "torch.Tensor | float | None", None),  # scalar or [B]
        _param("enable_pdl", "bool | None", None),
        _param("top_k", "torch.Tensor | int"),  # scalar or [B] int; <= 0 or >= V keeps every token
        _param("top_p", "torch.Tensor | float"),  # scalar or [B], in (0, 1]
        _param("min_p", "torch.Tensor | float"),  # scalar or [B], in [0, 1]
        _param("indices", "torch.Tensor | None", None),  # [B] int32/int64: output b samples row indices[b]
        _param("filter_apply_order", "str", "top_k_first"),
        _param("deterministic", "bool", True),
        _param("is_deterministic", "bool", False),
        _param("generator", "torch.Generator | None", None),
        _param("check_nan", "bool", False),
        _param("seed", "int | torch.Tensor | None", None),  # scalar, or [B] int64 tensor (per output row)
        _param("offset", "int | torch.Tensor | None", None),  # scalar, or [B] int64 tensor
        _param("return_valid", "bool", False),
    )
}
#: keyword-only in every operation: "auto" (Triton on CUDA), "torch" or "triton"
BACKEND = inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default="auto", annotation="str")


def _operation(params: tuple[str, ...], returns: str = "torch.Tensor") -> Callable[[Run[R]], Callable[..., R]]:
    """Decorator: ``run`` (its name and docstring) becomes the public operation
    ``run.__name__(*params, *, backend)``, which binds its arguments as a function with that
    signature would (``inspect.signature`` shows it) and gives them to ``run``."""
    signature = inspect.Signature([*(PARAMETERS[p] for p in params), BACKEND], return_annotation=returns)
    names = frozenset(signature.parameters)
    defaults = {n: p.default for n, p in signature.parameters.items() if p.default is not p.empty}

    def decorate(run: Run[R]) -> Callable[..., R]:
        name = run.__name__

        def operation(*args: Any, **kwargs: Any) -> R:
            # a dict per call instead of signature.bind (several times slower: these ops sit in
            # decoding loops); any irregular call goes to signature.bind for Python's TypeError
            positional = dict(zip(params, args))
            bound = {**defaults, **positional, **kwargs}
            if len(args) > len(params) or not positional.keys().isdisjoint(kwargs) or bound.keys() != names:
                try:
                    signature.bind(*args, **kwargs)
                except TypeError as exc:
                    raise TypeError(f"{name}(): {exc}") from None
            return run(bound)

        operation.__name__ = operation.__qualname__ = name
        operation.__doc__ = run.__doc__
        operation.__signature__ = signature  # type: ignore[attr-defined]
        return operation

    return decorate


def _dispatch(kind: str, args: Arguments, device: torch.device, **kwargs: Any) -> Any:
    """``{kind}_triton`` (the kernels) or ``{kind}_reference`` (PyTorch) on the canonical
    arguments, by keyword: both take the same names."""
    if use_triton(check_backend(args["backend"]), device):
        from spec_samplers.kernels import sampling_launch  # imports triton: only when the kernels run

        return getattr(sampling_launch, f"{kind}_triton")(**kwargs)
    return getattr(ref, f"{kind}_reference")(**kwargs)


def _filters(args: Arguments, B: int, V: int, device: torch.device, check_values: bool) -> dict[str, Any]:
    """[B] canonical top_k / top_p / min_p for those the operation takes (None stays None: no filter)."""
    canonical = {
        "top_k": lambda v: checks.canonical_top_k(v, B, V, device),
        "top_p": lambda v: checks.canonical_top_p(v, B, device, check_values),
        "min_p": lambda v: checks.canonical_min_p(v, B, device, check_values),
    }
    return {k: None if args[k] is None else f(args[k]) for k, f in canonical.items() if k in args}


def _sample(input_name: str, args: Arguments) -> SampleResult:
    """Validation, canonical parameters, per-row seeds, backend: shared by every sampling op."""
    joint = checks.check_filter_order(args["filter_apply_order"]) if "filter_apply_order" in args else False
    x = checks.check_matrix(input_name, args[input_name])
    check_nan = bool(args["check_nan"])
    rows, B, out_dtype = checks.resolve_rows(args["indices"], x.shape[0], x.device, check_nan, input_name)
    if check_nan:
        checks.check_no_nan(input_name, x)
    filters = _filters(args, B, x.shape[1], x.device, check_nan)
    seeds, offsets = checks.resolve_seeds(args["seed"], args["offset"], args["generator"], B, x.device)
    logits = input_name == "logits"
    tokens, valid = _dispatch(
        "sample", args, x.device, x=x, rows=rows, seeds=seeds, offsets=offsets, logits=logits, joint=joint, **filters
    )
    tokens = tokens.to(out_dtype)
    return (tokens, valid) if args.get("return_valid") else tokens


@overload
def _sampling(input_name: Literal["probs"], filters: tuple[str, ...], doc: str) -> Callable[..., SampleResult]: ...
@overload
def _sampling(input_name: Literal["logits"], filters: tuple[str, ...], doc: str) -> Callable[..., torch.Tensor]: ...
def _sampling(input_name: str, filters: tuple[str, ...], doc: str) -> Callable[..., Any]:
    """A sampling operation, named and ordered as FlashInfer's: ``{filters}_sampling_from_{input}``
    takes the input, its filter parameters, then the sampling parameters; filter_apply_order
    where there are two filters, return_valid from probabilities only."""
    order = ("filter_apply_order",) if len(filters) == 2 else ()
    valid = ("return_valid",) if input_name == "probs" else ()
    params = (input_name, *filters, "indices", *order, "deterministic", "generator", "check_nan", "seed", "offset")

    def run(args: Arguments) -> SampleResult:
        return _sample(input_name, args)

    run.__name__, run.__doc__ = "_".join((*filters, "sampling_from", input_name)), doc
    return _operation((*params, *valid), "SampleResult" if valid else "torch.Tensor")(run)


@_operation(("logits", "temperature", "enable_pdl"))
def softmax(args: Arguments) -> torch.Tensor:
    """Softmax of ``logits / temperature`` per row. Returns [B, V] fp32.

    ``temperature``: None (1), a scalar or a [B] tensor; 0 gives the one-hot of the row's argmax.
    ``enable_pdl`` is accepted for compatibility and ignored. NaN logits count as -inf; a row
    that is all -inf gives zeros.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> probs = sampling.softmax(torch.randn(4, 50), temperature=torch.tensor([0.8, 1.0, 1.2, 0.9]))
    """
    logits = checks.check_matrix("logits", args["logits"])
    temp = checks.canonical_temperature(args["temperature"], logits.shape[0], logits.device, check_values=False)
    return _dispatch("softmax", args, logits.device, logits=logits, temperature=temp)


sampling_from_probs = _sampling(
    "probs",
    (),
    """One sample per output row from its (unnormalised) probabilities.

    Returns [B] tokens (int32, or the dtype of ``indices``), and with ``return_valid`` also [B]
    bool (the row has mass; invalid rows give -1). ``deterministic`` is accepted and ignored
    (every path is deterministic). ``check_nan`` raises ValueError on NaN in ``probs`` (and checks
    parameter tensors and ``indices``; it synchronises with the host). Without it NaN entries count
    as probability 0, and a row left without mass (all NaN) gives token -1 with valid False, in
    every sampling op: FlashInfer gives token 0 there (valid False too); -1 is never a real token.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> probs = torch.softmax(torch.randn(4, 50), -1)
        >>> tokens = sampling.sampling_from_probs(probs, seed=torch.arange(4), offset=torch.zeros(4, dtype=torch.int64))
    """,
)
sampling_from_logits = _sampling(
    "logits",
    (),
    """One sample per output row from softmax(logits), without writing the probabilities.
    Returns [B] int32 (or the dtype of ``indices``); rows that are all -inf give -1.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> tokens = sampling.sampling_from_logits(torch.randn(4, 50), seed=7, offset=0)
    """,
)
top_p_sampling_from_probs = _sampling(
    "probs",
    ("top_p",),
    """Nucleus sampling: keeps token x iff the mass of the tokens strictly more probable than x is
    < top_p (of the row's mass); top_p = 1 keeps every token. Returns as :func:`sampling_from_probs`.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> tokens = sampling.top_p_sampling_from_probs(torch.softmax(torch.randn(4, 50), -1), 0.9)
    """,
)
top_k_sampling_from_probs = _sampling(
    "probs",
    ("top_k",),
    """Top-k sampling: keeps the tokens whose probability is >= the k-th largest (all tokens tied
    with it). Returns as :func:`sampling_from_probs`.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> probs = torch.softmax(torch.randn(4, 50), -1)
        >>> tokens = sampling.top_k_sampling_from_probs(probs, torch.tensor([1, 5, 10, 0]))
    """,
)
min_p_sampling_from_probs = _sampling(
    "probs",
    ("min_p",),
    """Min-p sampling: keeps the tokens with probability >= min_p * (the row's largest).
    Returns as :func:`sampling_from_probs`.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> tokens = sampling.min_p_sampling_from_probs(torch.softmax(torch.randn(4, 50), -1), 0.05)
    """,
)
top_k_top_p_sampling_from_logits = _sampling(
    "logits",
    ("top_k", "top_p"),
    """Top-k then top-p ("top_k_first": top-p on the top-k survivors, renormalised) or both on the
    full row ("joint"), sampled from softmax(logits) without writing it. Top-k compares logits,
    top-p the softmax masses. Returns [B] int32 (or the dtype of ``indices``).

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> tokens = sampling.top_k_top_p_sampling_from_logits(torch.randn(4, 50), 10, 0.9)
    """,
)
top_k_top_p_sampling_from_probs = _sampling(
    "probs",
    ("top_k", "top_p"),
    """Top-k and top-p sampling from probabilities ("top_k_first" or "joint", as
    :func:`top_k_top_p_sampling_from_logits`). Returns as :func:`sampling_from_probs`.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> probs = torch.softmax(torch.randn(4, 50), -1)
        >>> tokens = sampling.top_k_top_p_sampling_from_probs(probs, 10, 0.9, filter_apply_order="joint")
    """,
)


def _renorm(args: Arguments, out_dtype: torch.dtype | None) -> torch.Tensor:
    probs = checks.check_matrix("probs", args["probs"])
    filters = _filters(args, probs.shape[0], probs.shape[1], probs.device, check_values=False)
    return _dispatch("renorm", args, probs.device, probs=probs, out_dtype=out_dtype or probs.dtype, **filters)


@_operation(("probs", "top_p", "is_deterministic"))
def top_p_renorm_probs(args: Arguments) -> torch.Tensor:
    """[B, V] fp32: the top-p survivors (as :func:`top_p_sampling_from_probs`) renormalised, 0
    elsewhere. ``is_deterministic`` is accepted and ignored (always deterministic).

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> renorm = sampling.top_p_renorm_probs(torch.softmax(torch.randn(4, 50), -1), 0.9)
    """
    return _renorm(args, torch.float32)


@_operation(("probs", "top_k"))
def top_k_renorm_probs(args: Arguments) -> torch.Tensor:
    """[B, V] (dtype of ``probs``): the top-k survivors (ties kept) renormalised, 0 elsewhere.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> renorm = sampling.top_k_renorm_probs(torch.softmax(torch.randn(4, 50), -1), 10)
    """
    return _renorm(args, None)  # the dtype of probs


@_operation(("logits", "top_k"))
def top_k_mask_logits(args: Arguments) -> torch.Tensor:
    """[B, V] (dtype of ``logits``): logits below the k-th largest set to -inf (ties kept).

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> masked = sampling.top_k_mask_logits(torch.randn(4, 50), 10)
    """
    logits = checks.check_matrix("logits", args["logits"])
    k = checks.canonical_top_k(args["top_k"], logits.shape[0], logits.shape[1], logits.device)
    return _dispatch("mask_logits", args, logits.device, logits=logits, top_k=k)
