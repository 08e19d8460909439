"""``LogitsPipe``: a compiled list of ops run on logits or probabilities, and, ended by a
verification sampler, "process then verify" in one call (:meth:`LogitsPipe.verify`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from spec_samplers import validation
from spec_samplers.constants import input_error
from spec_samplers.engine_seam import BoundSampler, bind
from spec_samplers.layout import RowLayout
from spec_samplers.logits_processor.compiler import (
    FusionRule,
    ValidityCheck,
    compile_pipeline,
    infer_initial_type,
    legalize_processors,
)
from spec_samplers.logits_processor.op import Op
from spec_samplers.logits_processor.processors import LogitsProcessor
from spec_samplers.logits_processor.types import TaggedTensor, TensorType

#: runtime parameters that :meth:`LogitsPipe.verify` takes per request ([B]) and spreads over rows
PER_REQUEST_PARAMS = ("temperature", "top_k", "top_p", "min_p")


class LogitsPipe:
    """A declarative logits-processing pipeline (FlashInfer's ``LogitsPipe``).

    Args:
        processors: the :class:`LogitsProcessor` steps, in order.
        compile: type-check, validate and fuse now (default); else :attr:`ops` are the legalized
            ops, run one by one, until :meth:`compile` is called.
        input_type: :attr:`TensorType.LOGITS` or :attr:`TensorType.PROBS`; needed only when the
            first processor takes both (TopK, Sample), otherwise inferred.
        custom_fusion_rules: extra :class:`FusionRule` (patterns name processors or ops).
        custom_validity_checks: extra checks ``fn(ops: list[Op]) -> None`` that raise when invalid.

    Attributes: :attr:`ops` the compiled ops (FlashInfer calls them ``compiled_ops`` and keeps the
    legalized ones in ``ops``; here those are :attr:`legalized_ops`).

    Invalid pipelines raise ValueError at construction: an empty list, a processor given a type
    it cannot take (Temperature after Softmax), anything after Sample, two Softmax.

    Example::

        >>> import torch
        >>> from spec_samplers.logits_processor import LogitsPipe, Temperature, Softmax, TopP, Sample
        >>> pipe = LogitsPipe([Temperature(), Softmax(), TopP(), Sample()])
        >>> pipe.ops
        [FusedTemperatureSoftmaxOp, FusedProbsTopPSampleOp]
        >>> output_ids = pipe(torch.randn(4, 5), temperature=0.7, top_p=0.9)   # [4] int32
    """

    def __init__(
        self,
        processors: Sequence[LogitsProcessor],
        compile: bool = True,
        input_type: TensorType | None = None,
        custom_fusion_rules: Sequence[FusionRule] | None = None,
        custom_validity_checks: Sequence[ValidityCheck] | None = None,
    ):
        if isinstance(processors, LogitsProcessor) or not isinstance(processors, Sequence):
            raise TypeError(
                f"LogitsPipe: processors must be a list of LogitsProcessor, got {type(processors).__name__}"
            )
        if not processors:
            raise ValueError("LogitsPipe: the pipeline is empty; give at least one processor")
        if input_type is not None and input_type not in (TensorType.LOGITS, TensorType.PROBS):
            raise ValueError(
                f"LogitsPipe: input_type must be TensorType.LOGITS or TensorType.PROBS, got {input_type!r}"
            )
        self.processors: list[LogitsProcessor] = list(processors)
        self._initial_type = input_type or infer_initial_type(self.processors)
        self.legalized_ops: list[Op] = legalize_processors(self.processors, self._initial_type)
        self.ops: list[Op] = list(self.legalized_ops)
        self.compiled = False
        self._custom_fusion_rules = list(custom_fusion_rules or ())
        self._custom_validity_checks = list(custom_validity_checks or ())
        self._bound: BoundSampler | None = None  # the last sampler verify() ran, as the seam read it
        if compile:
            self.compile()

    def compile(
        self,
        custom_fusion_rules: Sequence[FusionRule] | None = None,
        custom_validity_checks: Sequence[ValidityCheck] | None = None,
    ) -> None:
        """Type-check, validate and fuse the legalized ops into :attr:`ops` (rules and checks
        given here add to those given at construction)."""
        rules = self._custom_fusion_rules + list(custom_fusion_rules or ())
        checks = self._custom_validity_checks + list(custom_validity_checks or ())
        self.ops = compile_pipeline(list(self.legalized_ops), rules, checks)
        self.compiled = True

    @property
    def compiled_ops(self) -> list[Op] | None:
        """FlashInfer's name for the compiled ops (None before compilation)."""
        return self.ops if self.compiled else None

    @property
    def initial_type(self) -> TensorType:
        """The input type: LOGITS or PROBS."""
        return self._initial_type

    @property
    def output_type(self) -> TensorType:
        out = self.ops[-1].OUT
        assert out is not None
        return out

    def __repr__(self) -> str:
        names = " -> ".join(type(p).__name__ for p in self.processors)
        legal = " -> ".join(map(repr, self.legalized_ops))
        compiled = " -> ".join(map(repr, self.ops)) if self.compiled else ""
        return f"LogitsPipe([{names}], ops=[{legal}], compiled_ops=[{compiled}])"

    def __call__(self, x: torch.Tensor | TaggedTensor, **kwargs: Any) -> torch.Tensor:
        """Run the ops on ``x`` ([B, V] logits or probabilities, per :attr:`initial_type`) with
        the runtime parameters ``kwargs`` (scalars or [B] tensors). Returns a plain tensor:
        [B, V] fp32 for LOGITS / PROBS outputs, [B] token ids for INDICES."""
        return self.run(x, **kwargs).data

    def run(self, x: torch.Tensor | TaggedTensor, **kwargs: Any) -> TaggedTensor:
        """As :meth:`__call__`, keeping the output's type tag."""
        if isinstance(x, TaggedTensor):
            tensor = x
        elif isinstance(x, torch.Tensor):
            tensor = TaggedTensor(x, self._initial_type)
        else:
            raise input_error("x", "a torch.Tensor or TaggedTensor", validation.type_name(x))
        for op in self.ops:
            tensor = op(tensor, **kwargs)
        return tensor

    # -- process then verify -----------------------------------------------------------------------

    def verify(
        self,
        sampler: Any,  # a verification sampler instance (SpecDecodeBaseSampler)
        target_logits: torch.Tensor,  # [B, k+1, V] padded or [T, V] ragged (probabilities for a PROBS pipe)
        bonus_token_ids: torch.Tensor,  # [B, 1] padded, [B] or [B, 1] ragged, int32/int64
        draft_logits: torch.Tensor | None,  # [B, k, V] / [T, V], or None (point-mass drafts)
        draft_token_ids: torch.Tensor,  # [B, k] / [T] int32/int64
        *,
        cu_num_draft_tokens: torch.Tensor | None = None,  # [B]: ragged layout
        max_spec_len: int | None = None,  # ragged only
        seeded_seqs: dict[int, torch.Generator] | None = None,
        seeds: torch.Tensor | None = None,  # [B] int64
        offsets: torch.Tensor | None = None,  # [B] int64
        **params: Any,
    ) -> torch.Tensor:
        """Process target and draft logits through this pipe, then verify with ``sampler``.

        ``sampler``: any verification sampler instance (``spec_samplers.get_sampler(name)`` for a
        registered one). The pipe must end before sampling (output LOGITS, turned into
        probabilities by a softmax, or PROBS). ``params`` are the pipe's runtime parameters; the
        per-request ones (temperature, top_k, top_p, min_p) may be [B] tensors, spread over each
        request's target and draft rows. Requests with temperature 0 are greedy
        (``is_greedy`` of stochastic samplers). The output is lossless for the processed target
        when the drafts were sampled from the draft processed by the same pipe and parameters.

        Returns [B, k+1] int64 (padded) or [B, K+1] (ragged), -1 padded, as ``sampler.forward``.

        Example::

            >>> from spec_samplers import RejectionSampler
            >>> pipe = LogitsPipe([Temperature(), Softmax(), TopK(), TopP()])
            >>> B, k, V = 2, 3, 16
            >>> out = pipe.verify(RejectionSampler(), torch.randn(B, k + 1, V), torch.zeros(B, 1, dtype=torch.long),
            ...                   torch.randn(B, k, V), torch.randint(0, V, (B, k)),
            ...                   temperature=torch.tensor([0.8, 0.0]), top_k=50, top_p=0.95)
        """
        if self.output_type == TensorType.INDICES:
            raise ValueError(
                "LogitsPipe.verify: the pipe ends in Sample (INDICES); verification needs the processed "
                "distribution: drop the Sample processor"
            )
        if not callable(getattr(sampler, "forward", None)):
            raise input_error(
                "sampler",
                "a verification sampler instance (e.g. spec_samplers.get_sampler(name))",
                type(sampler).__name__,
            )
        logits_in = self._initial_type == TensorType.LOGITS
        names = ("target_logits", "draft_logits") if logits_in else ("target_probs", "draft_probs")
        ragged = cu_num_draft_tokens is not None
        if cu_num_draft_tokens is not None:
            if max_spec_len is None:
                raise input_error("max_spec_len", "an int >= 0 with cu_num_draft_tokens (ragged layout)", None)
            shapes = validation.check_ragged_metadata(
                target_logits, bonus_token_ids, draft_logits, draft_token_ids, cu_num_draft_tokens, max_spec_len, *names
            )
            layout = RowLayout.ragged_from(cu_num_draft_tokens, target_logits.shape[0], max_spec_len, shapes.vocab_size)
        else:
            shapes = validation.check_metadata(target_logits, bonus_token_ids, draft_logits, draft_token_ids, *names)
            layout = RowLayout.padded(shapes.batch_size, shapes.num_draft_tokens, shapes.vocab_size)
        B, K, V = shapes.batch_size, shapes.num_draft_tokens, shapes.vocab_size
        device = target_logits.device
        temperature = params.get("temperature")
        is_greedy = _greedy_rows(temperature, B, device)

        def process(x: torch.Tensor, per_request: int) -> torch.Tensor:
            flat = x.reshape(-1, V)
            if flat.shape[0] == 0 or B == 0:
                return torch.zeros(x.shape, dtype=torch.float32, device=device)
            req = layout.request_of_rows(flat.shape[0], per_request, device)
            kwargs = {name: _spread(name, value, B, req) for name, value in params.items()}
            out = self.run(flat, **kwargs)
            probs = out.data
            if out.type == TensorType.LOGITS:
                from spec_samplers.sampling import api as sampling

                probs = sampling.softmax(probs, backend=str(kwargs.get("backend", "auto")))
            return probs.to(torch.float32).reshape(x.shape)

        target_probs = process(target_logits, K + 1)
        draft_probs = None if draft_logits is None else process(draft_logits, K)
        bound = self._bind(sampler)
        entry = "forward_ragged" if ragged else "forward"
        if bound.entry(entry) is None:
            name = type(sampler).__name__
            raise input_error(
                "cu_num_draft_tokens", f"None: {name} has no forward_ragged (padded layout only)", "a tensor"
            )
        randomness = dict(seeded_seqs=seeded_seqs, seeds=seeds, offsets=offsets)
        for name, value in randomness.items():
            if value is not None and not bound.accepts(entry, name):
                raise input_error(name, f"None: {type(sampler).__name__} draws no random numbers", "a value")
        extra = bound.randomness_for(entry, **randomness, is_greedy=is_greedy)
        rows = (target_probs, bonus_token_ids, draft_probs, draft_token_ids)
        if ragged:
            return bound.entries[entry](*rows, cu_num_draft_tokens, max_spec_len, **extra)
        return bound.entries[entry](*rows, **extra)

    def _bind(self, sampler: Any) -> BoundSampler:
        """The sampler as the seam reads it: once per sampler, not on every call."""
        if self._bound is None or self._bound.sampler is not sampler:
            self._bound = bind(sampler)
        return self._bound


def _greedy_rows(temperature: object, batch_size: int, device: torch.device) -> torch.Tensor | None:
    """[B] bool: requests at temperature 0 (None when no temperature is given)."""
    if temperature is None:
        return None
    if isinstance(temperature, torch.Tensor):
        if temperature.dim() == 0:
            return (temperature == 0).to(device).expand(batch_size).contiguous()
        if temperature.dim() != 1 or temperature.shape[0] != batch_size:
            raise input_error(
                "temperature",
                f"a scalar or a tensor of shape ({batch_size},) (one per request)",
                f"shape {tuple(temperature.shape)}",
            )
        return (temperature == 0).to(device)
    return torch.full((batch_size,), temperature == 0, dtype=torch.bool, device=device)


def _spread(name: str, value: Any, batch_size: int, request_of_row: torch.Tensor) -> Any:
    """A per-request [B] tensor of a known parameter -> one value per row; anything else as given."""
    if name not in PER_REQUEST_PARAMS or not isinstance(value, torch.Tensor):
        return value
    if value.dim() == 0:
        return value.reshape(1).expand(request_of_row.shape[0]).to(request_of_row.device)
    if value.dim() != 1 or value.shape[0] != batch_size:
        raise input_error(
            name, f"a scalar or a tensor of shape ({batch_size},) (one per request)", f"shape {tuple(value.shape)}"
        )
    return value.to(request_of_row.device)[request_of_row]
