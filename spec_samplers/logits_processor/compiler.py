"""Compilation of a pipeline: legalize processors into ops, type-check, run the validity checks,
fuse windows of ops by priority (FlashInfer's compiler, with processor-or-op patterns).

A :class:`FusionRule` pattern is a tuple whose entries name an :class:`Op` class (matches ops of
that class) or a :class:`LogitsProcessor` class (matches the ops legalized from that processor),
so ``FusionRule(pattern=(Temperature, Softmax), ...)`` and
``FusionRule(pattern=(TemperatureOp, SoftmaxOp), ...)`` match the same window. Rules are tried in
decreasing ``prio`` (ties: built-ins first, then custom rules in the order given) at each position,
left to right; after a fusion the scan steps back one op so the fused op can fuse again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple

from spec_samplers.logits_processor import operators as ops
from spec_samplers.logits_processor.op import CompileError, Op
from spec_samplers.logits_processor.processors import LogitsProcessor
from spec_samplers.logits_processor.types import TensorType

#: a validity check inspects the legalized op list and raises (CompileError or ValueError) when invalid
ValidityCheck = Callable[[list[Op]], None]
STANDARD_INPUTS = (TensorType.LOGITS, TensorType.PROBS)


class LegalizationError(ValueError):
    """A processor that cannot take the type flowing into it."""


class FusionRule(NamedTuple):
    """Replace a window of ops matching ``pattern`` by ``build(window)`` when ``guard(window)``.

    Example::

        >>> rule = FusionRule(pattern=(Temperature, Softmax), guard=lambda w: True,
        ...                   build=lambda w: FusedTemperatureSoftmaxOp(), prio=20)
    """

    pattern: tuple[type, ...]
    guard: Callable[[list[Op]], bool]
    build: Callable[[list[Op]], Op]
    prio: int = 0


def _check_rule(rule: object) -> FusionRule:
    if not isinstance(rule, tuple) or len(rule) != 4:
        raise CompileError(f"custom_fusion_rules: expected FusionRule(pattern, guard, build, prio), got {rule!r}")
    rule = FusionRule(*rule)
    if not rule.pattern or not all(isinstance(p, type) and issubclass(p, (Op, LogitsProcessor)) for p in rule.pattern):
        raise CompileError(
            f"FusionRule.pattern: expected a non-empty tuple of Op or LogitsProcessor classes, got {rule.pattern!r}"
        )
    if not callable(rule.guard) or not callable(rule.build):
        raise CompileError("FusionRule: guard and build must be callables taking the matched window (a list of ops)")
    return rule


def _entry_matches(op: Op, entry: type) -> bool:
    if issubclass(entry, Op):
        return isinstance(op, entry)
    source = getattr(op, "processor", None)
    return source is not None and issubclass(source, entry)


def pattern_matches(window: Sequence[Op], pattern: tuple[type, ...]) -> bool:
    """True when every op of ``window`` matches the pattern entry at its position."""
    return len(window) == len(pattern) and all(_entry_matches(op, e) for op, e in zip(window, pattern))


# -- built-in fusion rules ----------------------------------------------------------------------


def _always(window: list[Op]) -> bool:
    return True


def fuse_into(fused: type[Op]) -> Callable[[list[Op]], Op]:
    """A ``build`` that gives ``fused`` the window's params merged (an earlier op's value wins:
    the filters' and the temperature's over the sampling op's and the softmax's)."""

    def build(window: list[Op]) -> Op:
        params: dict[str, object] = {}
        for op in reversed(window):
            params.update(op.params)
        return fused(**params)

    return build


#: (pattern, fused op, priority): temperature into softmax, and filters into the sampling that follows
BUILTIN_FUSIONS: tuple[tuple[tuple[type[Op], ...], type[Op], int], ...] = (
    ((ops.TemperatureOp, ops.SoftmaxOp), ops.FusedTemperatureSoftmaxOp, 10),
    ((ops.ProbsTopKOp, ops.TopPOp, ops.ProbsSampleOp), ops.FusedProbsTopKTopPSampleOp, 100),
    ((ops.ProbsTopKOp, ops.ProbsSampleOp), ops.FusedProbsTopKSampleOp, 10),
    ((ops.TopPOp, ops.ProbsSampleOp), ops.FusedProbsTopPSampleOp, 10),
    ((ops.MinPOp, ops.ProbsSampleOp), ops.FusedProbsMinPSampleOp, 10),
)


def default_fusion_rules() -> list[FusionRule]:
    """The built-in rules (:data:`BUILTIN_FUSIONS`), unguarded."""
    return [FusionRule(pattern, _always, fuse_into(fused), prio) for pattern, fused, prio in BUILTIN_FUSIONS]


# -- default validity checks --------------------------------------------------------------------


def single_softmax_rule(op_list: list[Op]) -> None:
    """At most one softmax (a second one would take probabilities for logits)."""
    count = sum(isinstance(op, (ops.SoftmaxOp, ops.FusedTemperatureSoftmaxOp)) for op in op_list)
    if count > 1:
        raise CompileError(f"found {count} Softmax operators; a pipeline may have at most one")


def indices_terminal_rule(op_list: list[Op]) -> None:
    """Nothing follows an op that outputs INDICES (a sampled token)."""
    for op, nxt in itertools.pairwise(op_list):
        if op.OUT == TensorType.INDICES:
            raise CompileError(
                f"nothing may follow {op!r}, which outputs INDICES (sampled tokens); found {nxt!r} after it"
            )


def default_validity_checks() -> list[ValidityCheck]:
    return [single_softmax_rule, indices_terminal_rule]


# -- legalization -------------------------------------------------------------------------------


def legalize_processors(processors: Sequence[LogitsProcessor], initial_type: TensorType) -> list[Op]:
    """The processors' ops for an input of ``initial_type``, each op tagged with its processor."""
    if not processors:
        raise LegalizationError("LogitsPipe: the pipeline is empty; give at least one processor")
    op_list: list[Op] = []
    current = initial_type
    previous = "the pipe input"
    for i, processor in enumerate(processors):
        name = type(processor).__name__
        if not isinstance(processor, LogitsProcessor):
            raise LegalizationError(
                f"LogitsPipe: processor {i} must be a LogitsProcessor, got {type(processor).__name__}"
            )
        if current == TensorType.INDICES:
            raise LegalizationError(
                f"LogitsPipe: nothing may follow {previous}, which outputs INDICES (sampled tokens); "
                f"found {name} at position {i}"
            )
        try:
            legal = list(processor.legalize(current))
        except (ValueError, TypeError) as exc:
            raise LegalizationError(
                f"LogitsPipe: processor {i} ({name}) cannot take {current} (the output of {previous}): {exc}"
            ) from exc
        if not legal or not all(isinstance(op, Op) for op in legal):
            raise LegalizationError(f"LogitsPipe: processor {i} ({name}).legalize must return a non-empty list of Op")
        for op in legal:
            if getattr(op, "processor", None) is None:
                op.processor = type(processor)
        op_list.extend(legal)
        current = legal[-1].OUT  # type: ignore[assignment]
        previous = f"processor {i} ({name})"
    return op_list


def _accepts(processor: LogitsProcessor, input_type: TensorType) -> bool:
    try:
        legal = processor.legalize(input_type)
    except (ValueError, TypeError):
        return False
    return bool(legal) and getattr(legal[0], "IN", None) == input_type


def infer_initial_type(processors: Sequence[LogitsProcessor]) -> TensorType:
    """The pipe's input type from its first processor: the one standard type (LOGITS or PROBS)
    it legalizes for into an op taking that type."""
    if not processors:
        raise LegalizationError("LogitsPipe: the pipeline is empty; give at least one processor")
    first = processors[0]
    if not isinstance(first, LogitsProcessor):
        raise LegalizationError(f"LogitsPipe: processor 0 must be a LogitsProcessor, got {type(first).__name__}")
    valid = [t for t in STANDARD_INPUTS if _accepts(first, t)]
    if len(valid) == 1:
        return valid[0]
    name = type(first).__name__
    if valid:
        raise LegalizationError(
            f"LogitsPipe: cannot infer the input type: {name} accepts both LOGITS and PROBS; "
            "pass input_type=TensorType.LOGITS or TensorType.PROBS"
        )
    raise LegalizationError(f"LogitsPipe: the first processor ({name}) accepts neither LOGITS nor PROBS")


# -- compilation --------------------------------------------------------------------------------


def type_check(op_list: list[Op]) -> None:
    """Each op takes what the previous one gives; the first takes LOGITS or PROBS."""
    first = op_list[0]
    if first.IN not in STANDARD_INPUTS:
        raise CompileError(f"the first operator ({first!r}) takes {first.IN}; a pipe input is LOGITS or PROBS")
    current: TensorType | None = first.IN
    for i, op in enumerate(op_list):
        if op.IN != current:
            raise CompileError(
                f"type mismatch at operator {i} ({op!r}): it takes {op.IN}, the previous operator gives {current}"
            )
        current = op.OUT


class Compiler:
    """Holds the fusion rules (sorted by priority) and validity checks of one compilation."""

    def __init__(self) -> None:
        self.fusion_rules: list[FusionRule] = []
        self.validity_checks: list[ValidityCheck] = list(default_validity_checks())
        for rule in default_fusion_rules():
            self.register_fusion_rule(rule)

    def register_fusion_rule(self, rule: FusionRule) -> None:
        self.fusion_rules.append(_check_rule(rule))
        self.fusion_rules.sort(key=lambda r: -r.prio)  # stable: equal priorities keep their order

    def register_validity_check(self, check: ValidityCheck) -> None:
        if not callable(check):
            raise CompileError(f"custom_validity_checks: expected callables taking the op list, got {check!r}")
        self.validity_checks.append(check)

    def compile(self, op_list: list[Op]) -> list[Op]:
        if not op_list:
            raise CompileError("cannot compile an empty operator list")
        op_list = list(op_list)
        type_check(op_list)
        for check in self.validity_checks:
            check(op_list)
        return self.fuse(op_list)

    def fuse(self, op_list: list[Op]) -> list[Op]:
        i = 0
        while i < len(op_list):
            for rule in self.fusion_rules:
                window = op_list[i : i + len(rule.pattern)]
                if pattern_matches(window, rule.pattern) and rule.guard(window):
                    fused = rule.build(window)
                    if not isinstance(fused, Op):
                        raise CompileError(
                            f"fusion rule {rule.pattern!r}: build returned {type(fused).__name__}, not an Op"
                        )
                    if not fused.fused_from:
                        fused.fused_from = tuple(window)
                    op_list[i : i + len(window)] = [fused]
                    i = max(i - 1, 0)
                    break
            else:
                i += 1
        return op_list


def compile_pipeline(
    op_list: list[Op],
    custom_fusion_rules: Sequence[FusionRule] | None = None,
    custom_validity_checks: Sequence[ValidityCheck] | None = None,
) -> list[Op]:
    """Type-check, validate and fuse ``op_list`` (legalized ops). Returns the compiled ops."""
    compiler = Compiler()
    for rule in custom_fusion_rules or ():
        compiler.register_fusion_rule(rule)
    for check in custom_validity_checks or ():
        compiler.register_validity_check(check)
    return compiler.compile(op_list)
