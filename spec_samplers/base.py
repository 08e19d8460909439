"""Sampler base classes, compatible with vLLM V0's ``SpecDecodeBaseSampler`` family.

The base class runs every entry's pipeline once: validate the arguments, resolve seeds, offsets
and greedy rows, describe the rows (:class:`~spec_samplers.layout.VerifyBatch`), call the
sampler's one op (:meth:`SpecDecodeBaseSampler.verify`) and update the counters. A sampler
declares its algorithm once, as a reference function and a kernel launcher over a ``VerifyBatch``
(``reference_op`` / ``kernel_op``), or by overriding ``verify``; it then has all four entries
(``forward``, ``forward_ragged``, ``forward_from_logits``, ``forward_ragged_from_logits``).

A third-party sampler written against vLLM V0 that only overrides ``forward`` keeps working;
the other entries then raise :class:`NotImplementedError` naming what is missing. V0's helpers
are here with V0's signatures and outputs (:meth:`SpecDecodeBaseSampler._create_output`,
:meth:`SpecDecodeBaseSampler._raise_if_incorrect_input`, ``init_gpu_tensors``), and the
constructor accepts V0's ``use_flashinfer``. Counters are derived from the output layout alone,
so such a sampler gets them right through ``_create_output`` or by calling
:meth:`SpecDecodeBaseSampler._update_counters` with the standard layout; the package's kernels add
them in their finishing step (``kernel_counts``), so a kernel call runs no eager op for them.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import torch

from spec_samplers import custom_ops, validation
from spec_samplers.chunking import run_chunked
from spec_samplers.constants import PLACEHOLDER_TOKEN_ID, input_error
from spec_samplers.cpu import compiled_op, count_on_host, run_compiled
from spec_samplers.kernels.backend import LaunchConfig, check_backend, launch_config, use_triton
from spec_samplers.layout import RowLayout, VerifyBatch
from spec_samplers.output import build_output, num_leading_accepted
from spec_samplers.rng import row_seeds
from spec_samplers.sampling_params import SamplingParams, filter_tensors, process_logits, sampling_tensors
from spec_samplers.validation import Shapes

#: positions the counters' buffer has room for at construction (a larger k grows it once)
COUNTER_POSITIONS = 8

#: the four entries every sampler with an op has
ENTRIES = ("forward", "forward_ragged", "forward_from_logits", "forward_ragged_from_logits")


def _as_device(device: int | str | torch.device, device_type: str) -> torch.device:
    if isinstance(device, int):
        return torch.device(f"{device_type}:{device}")
    if isinstance(device, (str, torch.device)):
        return torch.device(device)
    raise TypeError(f"device: expected int, str or torch.device, got {type(device).__name__}")


def _load(target: str) -> Callable[..., torch.Tensor]:
    module, _, name = target.partition(":")
    fn: Callable[..., torch.Tensor] = getattr(importlib.import_module(module), name)
    return fn


def _process_sampling_params(
    layout: RowLayout,
    target_logits: torch.Tensor,  # [B, K+1, V] padded or [T, V] ragged
    draft_logits: torch.Tensor | None,  # [B, K, V] / [T, V] or None
    sampling_params: SamplingParams | Sequence[SamplingParams],
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(target probs, draft probs, is_greedy [B]): both processed row by row with their request's
    parameters (vLLM's order: temperature, min-p, top-k, top-p), so the verification that follows
    is lossless for the processed target, for drafts sampled from the processed draft. The
    processing runs the sampling operations on the sampler's ``backend``."""
    B, K, V = layout.batch_size, layout.max_drafts, layout.vocab_size
    device = target_logits.device
    params = sampling_tensors(sampling_params, B, device)

    def process(x: torch.Tensor, per_request: int) -> torch.Tensor:
        flat = x.reshape(-1, V)
        if flat.shape[0] == 0 or B == 0:
            return torch.zeros(x.shape, dtype=torch.float32, device=device)
        rows = params.select(layout.request_of_rows(flat.shape[0], per_request, device))
        return process_logits(flat, rows, backend=backend).view(x.shape)

    draft = None if draft_logits is None else process(draft_logits, K)
    return process(target_logits, K + 1), draft, params.is_greedy


def _sampling_filters(
    sampling_params: SamplingParams | Sequence[SamplingParams], batch_size: int, device: torch.device
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(temperature [B] fp32, 0 on greedy requests; {top_k, top_p, min_p} [B] each, or {} when no
    request filters): what a sampler that applies the filters itself reads from a VerifyBatch
    (no kernel: :func:`spec_samplers.sampling_params.filter_tensors`)."""
    return filter_tensors(sampling_params, batch_size, device)


class SpecDecodeBaseSampler(torch.nn.Module):
    """Base of every verification sampler.

    Args:
        strict_mode: what vLLM V0's strict mode checks, plus the [B] arguments: shapes, dtypes,
            devices (always checked), token ids in [0, V), ragged counts consistent with T and
            ``max_spec_len``, temperatures finite and >= 0. Synchronises with the host.
        backend: "auto", "torch" or "triton" (see :func:`spec_samplers.kernels.backend.use_triton`).
        check_values: also check the float inputs: probabilities finite, non-negative, rows
            summing to one; logits without NaN or +inf and with a finite entry per row. An opt-in
            apart from ``strict_mode`` because V0 callers pass unnormalised targets in strict mode.
        use_flashinfer: accepted for vLLM V0 compatibility and recorded; the kernels are chosen
            by ``backend``.

    Counters (0-dim int64 tensors, created on the CPU at construction, moved by
    :meth:`init_tensors` or to the device of the first output, updated without host
    synchronisation): ``num_accepted_tokens`` (accepted drafts), ``num_emitted_tokens`` (non -1
    outputs) and ``num_accepted_per_position`` ([k]: how often the draft at each position was
    accepted); ``num_draft_tokens`` is a host int (B * k per call). The three tensors are views of
    one int64 buffer, ``[accepted, emitted, per position...]``, which the kernels of a sampler that
    declares ``kernel_counts`` add to in their finishing step (atomics: no eager op per call); the
    PyTorch path adds to it with eager ops (:meth:`_update_counters`). A counter a caller assigns
    is folded into the buffer at the next call.

    Subclasses declare:

    * ``lossless``: whether the emitted tokens follow the target distribution exactly;
    * ``acceptance_law``: "token" (each draft judged on its own, as rejection sampling) or
      "block" (block verification): which lossless acceptance theory the bench compares with;
    * ``reference_op``: the PyTorch reference, ``fn(batch: VerifyBatch, **op_options) -> [B, K+1]``;
    * ``kernel_op``: the kernel launcher, same signature plus an optional ``config=``
      (:class:`~spec_samplers.kernels.backend.LaunchConfig`), from a module that imports triton
      only inside the launcher (None: the reference runs everywhere; a ``"module:function"``
      string is still accepted from third-party samplers);
    * :meth:`op_options`: the keyword options both receive;
    * ``takes_draft_rows``: True when both ops read ``VerifyBatch.draft_rows`` /
      ``draft_temperature`` (the ragged logits entry's indexed draft rows); otherwise those
      arguments are refused by name;
    * ``applies_filters``: True when both ops apply a batch's per-request top-k / top-p / min-p
      (``VerifyBatch.top_k`` ...) themselves; otherwise ``sampling_params=`` is processed into
      probabilities first (process, then verify);
    * ``bonus_rows_in_place``: True when the sampler's token at an out-of-range draft id is a
      sample of that position's target row, drawn by the position's recovery race (rejection
      sampling, block verification): what an engine's bonus rows verified in place need
      (:func:`spec_samplers.integrations.vllm.fast_path.bonus_row_verifiable`). A capability a
      third-party sampler declares, not a list of classes;
    * ``kernel_counts``: True when ``kernel_op`` adds the acceptance counters of its output to
      ``VerifyBatch.counters`` itself (declared with the launcher: a subclass that brings another
      ``kernel_op`` declares it again);
    * ``requests_independent``: True when ``reference_op``'s tokens for a request depend on that
      request's rows, ids and randomness alone (randomness a function of seed, offset, position,
      index): the reference then runs a chunk of requests at a time (:mod:`spec_samplers.chunking`,
      bounded memory). Off by default: a sampler drawing from one generator for the whole batch
      would draw differently per chunk.
    """

    lossless: ClassVar[bool | None] = None
    acceptance_law: ClassVar[str] = "token"
    applies_filters: ClassVar[bool] = False
    takes_draft_rows: ClassVar[bool] = False
    reference_op: ClassVar[Callable[..., torch.Tensor] | None] = None
    kernel_op: ClassVar[Callable[..., torch.Tensor] | str | None] = None
    requests_independent: ClassVar[bool] = False
    bonus_rows_in_place: ClassVar[bool] = False
    kernel_counts: ClassVar[bool] = False

    def __init__(
        self,
        strict_mode: bool = False,
        backend: str = "auto",
        *,
        check_values: bool = False,
        use_flashinfer: bool | None = None,
    ):
        super().__init__()
        for name, flag in (("strict_mode", strict_mode), ("check_values", check_values)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected bool, got {type(flag).__name__}")
        if use_flashinfer is not None and not isinstance(use_flashinfer, bool):
            raise TypeError(f"use_flashinfer: expected bool or None, got {type(use_flashinfer).__name__}")
        self._strict_mode = strict_mode
        self._check_values = check_values
        self.use_flashinfer = bool(use_flashinfer)
        self.backend = check_backend(backend)
        # Created on the CPU so they exist before any call; init_tensors moves them. Room for
        # COUNTER_POSITIONS positions: a larger k grows the buffer once (eager ops, that call only).
        self._counts = torch.zeros(2 + COUNTER_POSITIONS, dtype=torch.long)
        self._num_positions = 0  # the largest k seen: num_accepted_per_position's length
        self.num_accepted_tokens: torch.Tensor
        self.num_emitted_tokens: torch.Tensor
        self.num_accepted_per_position: torch.Tensor
        self._point_counters()
        self.num_draft_tokens: int = 0
        self._options: dict[str, Any] = {}  # op_options() of a sampler that sets them with _set_options
        self._prepared: dict[tuple[Any, ...], Prepared] = {}  # per call shape (_prepare)
        self._op_handle = custom_ops.register_sampler(self)  # names this instance to spec_samplers::verify

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state["_prepared"] = {}  # (ops bound to launch configs: a copy prepares its calls again)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__({"_options": {}, "_prepared": {}, **state})
        self._op_handle = custom_ops.register_sampler(self)  # a copy (deepcopy, pickle) is another instance

    def extra_repr(self) -> str:
        options = [
            f"strict_mode={self._strict_mode}",
            f"check_values={self._check_values}",
            f"backend={self.backend!r}",
        ]
        if self.use_flashinfer:
            options.append("use_flashinfer=True")
        return ", ".join(options + [f"{k}={v!r}" for k, v in self.op_options().items()])

    def init_gpu_tensors(self, device: int | str | torch.device) -> None:
        """vLLM V0's hook: :meth:`init_tensors` on CUDA (an int is a CUDA device index)."""
        self.init_tensors(device, device_type="cuda")

    def init_tensors(self, device: int | str | torch.device, device_type: str = "cuda") -> None:
        """Move the counters to ``device`` (an int means ``{device_type}:{device}``), keeping
        their values. Engines call it once after construction; calling it again moves them again."""
        self._counter_slots(0, _as_device(device, device_type))

    # -- the counters: views of one buffer (see the class docstring) ----------------------------

    def _point_counters(self) -> None:
        """The three counter attributes as views of the buffer (after it moved or grew)."""
        counts = self._counts
        self.num_accepted_tokens = counts[0]
        self.num_emitted_tokens = counts[1]
        self.num_accepted_per_position = counts[2 : 2 + self._num_positions]

    def _counter_slots(self, k: int, device: torch.device) -> torch.Tensor:
        """The counters' buffer on ``device`` with room for ``k`` positions. The first call moves
        it, a larger k grows it, a counter a caller assigned is folded into it (eager ops then);
        the steady state runs no op here."""
        counts = self._counts
        assigned = self.num_accepted_tokens._base is not counts or self.num_emitted_tokens._base is not counts
        if assigned or self.num_accepted_per_position._base is not counts:  # by a caller: its values are kept
            per_position = self.num_accepted_per_position
            counts = torch.zeros(2 + max(COUNTER_POSITIONS, per_position.shape[0]), dtype=torch.long)
            counts = counts.to(self.num_accepted_tokens.device)
            counts[0], counts[1] = self.num_accepted_tokens, self.num_emitted_tokens
            counts[2 : 2 + per_position.shape[0]] = per_position
            self._num_positions = per_position.shape[0]
        if counts.device != device:
            counts = counts.to(device)
        if k > self._num_positions and counts.shape[0] < 2 + k:  # (room for _num_positions: no shape read)
            grown = torch.zeros(2 + max(k, 2 * (counts.shape[0] - 2)), dtype=torch.long, device=device)
            grown[: counts.shape[0]] = counts
            counts = grown
        if counts is not self._counts or k > self._num_positions:
            self._counts, self._num_positions = counts, max(self._num_positions, k)
            self._point_counters()
        return counts

    def _kernel_counters(self, k: int, device: torch.device) -> torch.Tensor | None:
        """``VerifyBatch.counters`` of a call: the buffer when the sampler's kernels run and count
        (``kernel_counts``), else None (the pipeline counts with eager ops). On meta tensors (a
        tool planning launches) a scratch buffer of the same shape: the plan is the GPU's, and
        nothing is counted."""
        if not self._op_counts(use_triton(self.backend, device, launch_config()), device):
            return None
        if device.type == "meta":
            return torch.empty(2 + k, dtype=torch.long, device=device)
        return self._counter_slots(k, device)

    def _op_counts(self, kernels: bool, device: torch.device) -> bool:
        """Whether the op :meth:`_choose_op` picks adds the counters (``VerifyBatch.counters``):
        the sampler's kernels when they run (``kernel_counts``), or a compiled CPU twin (every twin
        counts in its kernel: at B = 1 counting after the call cost about as much as the kernel)."""
        cls = type(self)
        if cls.verify is not SpecDecodeBaseSampler.verify or cls.reference_op is None:
            return False
        if cls.kernel_op is not None and kernels:
            return cls.kernel_counts
        return self.backend == "auto" and compiled_op(cls.reference_op, device) is not None

    @property
    def probs_dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def token_id_dtype(self) -> torch.dtype:
        return torch.int64

    @property
    def strict_mode(self) -> bool:
        return self._strict_mode

    @property
    def check_values(self) -> bool:
        return self._check_values

    # -- the one op ------------------------------------------------------------------------------

    def op_options(self) -> dict[str, Any]:
        """Keyword options passed to ``reference_op`` and ``kernel_op`` (e.g. thresholds): those
        set with :meth:`_set_options`. An override is called at every call."""
        return dict(self._options)

    def _set_options(self, **options: Any) -> None:
        """Set keyword options of the op (what :meth:`op_options` returns): a call reads them as
        they are then, without calling a method."""
        self._options = {**self._options, **options}

    @classmethod
    def has_op(cls) -> bool:
        """True when the sampler implements the one op (and so every entry)."""
        return cls.reference_op is not None or cls.verify is not SpecDecodeBaseSampler.verify

    @classmethod
    def supported_entries(cls) -> tuple[str, ...]:
        """The public entries this sampler can run."""
        if cls.has_op():
            return ENTRIES
        return ("forward",) if cls.forward is not _forward_of(cls) else ()

    def verify(self, batch: VerifyBatch) -> torch.Tensor:
        """The sampler's one op: [B, K+1] int64 tokens of a validated batch.

        Runs ``kernel_op`` when the backend resolves to Triton for the batch's device, else
        ``reference_op``. Override it to bring an algorithm without the two declarations."""
        return self._op_for(batch)(batch)

    def _op_for(self, batch: VerifyBatch) -> Callable[[VerifyBatch], torch.Tensor]:
        """The function that runs the one op on ``batch``, its options bound. The pipeline calls
        what it returns, so a launch is three calls from a public entry (entry, :meth:`_run`,
        launcher)."""
        cls = type(self)
        if cls.verify is not SpecDecodeBaseSampler.verify:
            return self.verify  # a sampler that brings its own op
        if cls.reference_op is None:
            raise NotImplementedError(f"{cls.__name__} declares no reference_op")
        return self._choose_op(cls.kernel_op, cls.reference_op, run_chunked, batch.target.device, self.op_options())

    def _choose_op(
        self,
        kernel: Callable[..., Any] | str | None,  # the launcher (a third party's may be "module:function")
        reference: Callable[..., Any],
        chunked: Callable[..., Any],  # runs ``reference`` a chunk of requests at a time
        device: torch.device,
        options: dict[str, Any],
    ) -> Callable[..., Any]:
        """Kernels, compiled CPU twin or reference, options bound: the one backend decision of chain
        and tree ops ("auto" on CPU tensors runs a reference's compiled twin when numba imports).

        The launcher gets ``config=`` when a tool plans for another device
        (:func:`spec_samplers.kernels.backend.planned_for`); then ``config.kernels`` picks the
        launcher even where the backend would run PyTorch (meta tensors), unless "torch"."""
        config = launch_config()
        if kernel is not None and use_triton(self.backend, device, config):
            launcher = _load(kernel) if isinstance(kernel, str) else kernel
            if config is not None:
                options = {**options, "config": config}
            return functools.partial(launcher, **options)
        compiled = compiled_op(reference, device) if self.backend == "auto" else None
        if compiled is not None:  # CPU tensors: the reference's compiled twin (spec_samplers.cpu)
            return functools.partial(run_compiled, compiled, **options)
        if type(self).requests_independent:
            return functools.partial(chunked, reference, **options)
        return functools.partial(reference, **options)

    def _seeds(
        self,
        batch_size: int,
        device: torch.device,
        randomness: Randomness,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(seeds [B] int64, offsets [B] int64 or None): the per-request keys of the counter RNG
        from ``seeds=`` / ``offsets=`` or V0's ``seeded_seqs``, drawn from torch's default
        generator for the other rows (chain and tree entries alike)."""
        if randomness.offsets is not None:
            validation.check_seed_tensor("offsets", randomness.offsets, batch_size, device)
        seeds = row_seeds(batch_size, device, randomness.seeded_seqs, randomness.seeds)
        offsets = None if randomness.offsets is None else randomness.offsets.to(torch.int64)
        return seeds, offsets

    # -- the pipeline, run once for every entry ----------------------------------------------------

    def _run(
        self,
        entry: str,
        target: torch.Tensor,  # [B, k+1, V] padded or [T, V] ragged: probabilities, or logits
        bonus_token_ids: torch.Tensor,  # [B, 1] padded, [B] or [B, 1] ragged
        draft: torch.Tensor | None,  # [B, k, V] padded or [T, V] ragged, or None: point-mass drafts
        draft_token_ids: torch.Tensor,  # [B, k] padded or [T] ragged
        ragged: Ragged | None = None,  # the ragged layout's metadata; None: padded
        processing: Processing | None = None,  # logits entries: how the logits become laws; None: probabilities
        randomness: Randomness | None = None,  # stochastic samplers; None: no randomness arguments
        drafts: DraftRows | None = None,  # ragged logits entries: what the draft tensor holds
    ) -> torch.Tensor:
        """The one pipeline of every chain entry: the entry's arguments arrive typed (which
        layout, target law and draft law is explicit); checked once per shape (:meth:`_prepare`),
        they become a :class:`~spec_samplers.layout.VerifyBatch`, the op runs on it, the counters
        follow (added by the kernels, or here)."""
        config = launch_config()
        cu = None if ragged is None else ragged.cu_num_draft_tokens
        temperature = None if processing is None else processing.temperature
        params = None if processing is None else processing.sampling_params
        seeds, offsets, is_greedy = (None, None, None) if randomness is None else randomness[1:]
        rows, draft_temperature = (None, None) if drafts is None else drafts[:2]
        key = None
        if not (self._strict_mode or self._check_values or torch.compiler.is_compiling()):
            # what the checks read: every tensor's shape, dtype and device, and the host arguments
            host = (
                None if ragged is None else (type(ragged.max_spec_len), ragged.max_spec_len),
                processing is None, params is None, randomness is None or not randomness.seeded_seqs,
                None if drafts is None else drafts.kind, self.backend,
            )  # fmt: skip
            tensors = (target, bonus_token_ids, draft, draft_token_ids, cu, temperature, rows, draft_temperature)
            key = _call_key(host, tensors + (is_greedy, seeds, offsets))
        prepared = self._prepared.get(key) if key is not None else None
        if prepared is None or prepared.config is not config:
            if drafts is None:  # (the entries without indexed draft rows pass none)
                drafts = DraftRows(None, None, "probs" if processing is None else "logits")
            call = ChainCall(target, bonus_token_ids, draft, draft_token_ids, ragged, processing, randomness, drafts)
            prepared = self._prepare(entry, call, config, key)
            if prepared is None:  # traced by Dynamo, or meta tensors: the custom op (custom_ops.routed's rule)
                return self._run_as_op(entry, call)
        B, K, device = prepared.batch_size, prepared.max_drafts, target.device
        layout = prepared.layout
        if layout is None:  # ragged: the counts are this call's ([B] metadata is read as contiguous)
            layout = RowLayout(True, B, K, prepared.vocab_size, target.shape[0], cu.contiguous())  # type: ignore[union-attr]
        if randomness is not None:
            if seeds is None or randomness.seeded_seqs:
                seeds = row_seeds(B, device, randomness.seeded_seqs, seeds)
            elif seeds.dtype != torch.int64:  # (the test costs less than to()'s no-op)
                seeds = seeds.to(torch.int64)
            if offsets is not None and offsets.dtype != torch.int64:
                offsets = offsets.to(torch.int64)
        filters: dict[str, torch.Tensor] = {}
        if params is not None and type(self).applies_filters:
            # fused: the op reads logits and applies each request's parameters (no probability tensor)
            temperature, filters = filter_tensors(params, B, device)
        elif params is not None:
            target, draft, is_greedy = _process_sampling_params(layout, target, draft, params, self.backend)
        counters = None
        if prepared.kernel_counts:  # the kernels add to the counters (a scratch buffer on meta tensors)
            counters = torch.empty(2 + K, dtype=torch.long, device=device) if prepared.meta else None
            counters = self._counter_slots(K, device) if counters is None else counters
        batch = VerifyBatch(
            layout,
            target,
            draft,
            draft_token_ids,
            bonus_token_ids.reshape(B),
            seeds=seeds,
            offsets=offsets,
            is_greedy=is_greedy,
            temperature=temperature,
            **filters,
            draft_rows=rows,
            draft_temperature=draft_temperature,
            draft_is_probs=prepared.draft_is_probs,
            counters=counters,
        )
        if prepared.op is None:
            out = self.verify(batch)  # a sampler that brings its own op
        else:
            out = prepared.op(batch, **(self.op_options() if prepared.options_call else self._options))
        if counters is None:
            self._update_counters(out, layout.num_rows if layout.ragged else None)
        elif not prepared.meta:  # (a host int: __dict__ skips nn.Module.__setattr__'s checks, as in _count)
            self.__dict__["num_draft_tokens"] += layout.num_rows if layout.ragged else B * K
        return out

    def _prepare(
        self, entry: str, call: ChainCall, config: LaunchConfig | None, key: tuple[Any, ...] | None
    ) -> Prepared | None:
        """What every call shaped like ``call`` shares, after its checks: the layout's sizes, the op
        (the backend decision), whether the kernels count; remembered under ``key`` (the checks
        read only shapes, dtypes and devices then: an engine calls with a few shapes). None: the
        call runs as the ``spec_samplers::verify`` custom op (traced by Dynamo, or meta tensors)."""
        target, _, draft, _, ragged, processing, randomness, drafts = call
        if not self.has_op():
            raise NotImplementedError(
                f"{type(self).__name__}.{entry}: this sampler implements only vLLM V0's padded forward(); "
                f"{', '.join(e for e in ENTRIES if e != 'forward')} need the one op: declare reference_op "
                "(and optionally kernel_op) or override verify(batch) (see spec_samplers.base)"
            )
        if ragged is not None and ragged.max_spec_len is None:
            raise input_error("max_spec_len", "an int >= 0 with cu_num_draft_tokens (ragged layout)", None)
        if processing is not None and (processing.temperature is None) == (processing.sampling_params is None):
            if processing.temperature is None:  # the logits entries take one of the two
                raise input_error("temperature", "a [B] float tensor (0 = greedy), or sampling_params=", None)
            raise input_error("sampling_params", "None when temperature is given (pass one or the other)", "both")
        if drafts is None:
            drafts = DraftRows(None, None, "probs" if processing is None else "logits")
            call = call._replace(drafts=drafts)
        names = _argument_names(ragged is not None, processing is not None, drafts.kind)
        # the target is read below (its device) before the checks of the rest
        validation.require_tensor(names[0], target)
        # value checks read the tensors: on meta tensors the checks below refuse them by name
        checks_values = self._strict_mode or self._check_values
        device = target.device
        meta = device.type == "meta"
        # on meta tensors a tool planning our launches (kernels.backend.planned_for) gets the launch plan
        kernels = use_triton(self.backend, device, config)
        if (meta or torch.compiler.is_compiling()) and not (meta and kernels) and not (checks_values and meta):
            return None
        shapes = self._check_call(call, names)
        B, K, V = shapes.batch_size, shapes.num_draft_tokens, shapes.vocab_size
        cls = type(self)
        own_op = cls.verify is not SpecDecodeBaseSampler.verify
        op = None
        if not own_op:
            assert cls.reference_op is not None  # (has_op)
            op = self._choose_op(cls.kernel_op, cls.reference_op, run_chunked, device, {})
        prepared = Prepared(
            config=config,
            op=op,
            options_call=cls.op_options is not SpecDecodeBaseSampler.op_options,
            layout=None if ragged is not None else RowLayout.padded(B, K, V),
            batch_size=B,
            max_drafts=K,
            vocab_size=V,
            kernel_counts=self._op_counts(kernels, device),
            meta=meta,
            draft_is_probs=processing is not None and drafts.kind == "probs",
        )
        if key is not None:
            if len(self._prepared) >= 64:  # (an engine's batch size changes every step: keep the memo small)
                self._prepared.clear()
            self._prepared[key] = prepared
        return prepared

    def _seam_op(self, device: torch.device, config: LaunchConfig | None) -> Prepared | None:
        """What :meth:`_prepare` decides for a call on ``device`` (the op, whether its options come
        from an overridden :meth:`op_options`, whether the kernels count), for an engine seam that
        builds the batch of its own checked inputs and keeps this per shape
        (``integrations.vllm.fast_path.ChunkPlan``); None for a sampler without a reference op
        (its entry raises by name). Only the op's fields are filled."""
        cls = type(self)
        own_op, reference = cls.verify is not SpecDecodeBaseSampler.verify, cls.reference_op
        if reference is None and not own_op:
            return None
        kernels = use_triton(self.backend, device, config)
        return Prepared(
            config=config,
            op=None
            if own_op or reference is None
            else self._choose_op(cls.kernel_op, reference, run_chunked, device, {}),
            options_call=cls.op_options is not SpecDecodeBaseSampler.op_options,
            layout=None,
            batch_size=0,
            max_drafts=0,
            vocab_size=0,
            kernel_counts=self._op_counts(kernels, device),
            meta=device.type == "meta",
            draft_is_probs=False,
        )

    def _run_prepared(self, prepared: Prepared, batch: VerifyBatch) -> torch.Tensor:
        """The op :meth:`_seam_op` chose on a validated batch, then the counters (the end of
        :meth:`_run`, for a seam's batch)."""
        if prepared.op is None:
            out = self.verify(batch)
        else:
            out = prepared.op(batch, **(self.op_options() if prepared.options_call else self._options))
        self._count(batch, out)
        return out

    def _verify_counted(self, batch: VerifyBatch) -> torch.Tensor:
        """The op on a validated batch, then the counters: how every chain entry ends (:meth:`_run`
        spells it out, so the launch stays three calls from the public entry), for an engine seam
        that builds the batch of its own checked inputs
        (``integrations.vllm.fast_path.verify_chunk_with_bonus_rows``)."""
        out = self._op_for(batch)(batch)
        self._count(batch, out)
        return out

    def _count(self, batch: VerifyBatch, out: torch.Tensor) -> None:
        """The counters after the op: the kernels added the tensor counters (``batch.counters``),
        else they are counted here."""
        num_draft_tokens = batch.layout.num_rows if batch.layout.ragged else None
        if batch.counters is None:
            self._update_counters(out, num_draft_tokens)
        elif batch.target.device.type != "meta":
            drafts = out.shape[0] * (out.shape[1] - 1) if num_draft_tokens is None else num_draft_tokens
            # a host int, no parameter, buffer or submodule: set in __dict__, skipping
            # nn.Module.__setattr__'s checks (a few us per call)
            self.__dict__["num_draft_tokens"] += drafts

    def _run_as_op(self, entry: str, call: ChainCall) -> torch.Tensor:
        """The call as the ``spec_samplers::verify`` custom op (what crosses it: tensors and scalars)."""
        processing, randomness, drafts = call.processing, call.randomness, call.drafts
        if drafts is None:  # (the entries without indexed draft rows pass none)
            drafts = DraftRows(None, None, "probs" if processing is None else "logits")
        during = "None under torch.compile and on meta tensors"
        if processing is not None and processing.sampling_params is not None:
            raise input_error("sampling_params", f"{during} (pass temperature=)", "a value")
        if randomness is not None and randomness.seeded_seqs:
            raise input_error("seeded_seqs", f"{during} (pass seeds=)", "a value")
        cu, K = (None, None) if call.ragged is None else call.ragged
        temperature = None if processing is None else processing.temperature
        seeds, offsets, is_greedy = (None, None, None) if randomness is None else randomness[1:]
        return custom_ops.verify(
            self._op_handle, entry, call.target, call.bonus_token_ids, call.draft, call.draft_token_ids, cu, K,
            temperature, seeds, offsets, is_greedy, randomness is not None, drafts.rows, drafts.temperature,
            drafts.kind == "probs",
        )  # fmt: skip

    def _run_from_op(
        self,
        entry: str,
        rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor],  # target, bonus, draft, ids
        ragged: tuple[torch.Tensor, int] | None,  # (cu_num_draft_tokens, max_spec_len)
        temperature: torch.Tensor | None,  # [B]: logits entries
        randomness: tuple[None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None] | None,
        drafts: tuple[torch.Tensor | None, torch.Tensor | None, bool],  # draft_rows, draft_temperature, is_probs
    ) -> torch.Tensor:
        """:meth:`_run` on the arguments that crossed the ``spec_samplers::verify`` op, typed again."""
        kind = "logits" if temperature is not None and not drafts[2] else "probs"
        return self._run(
            entry,
            *rows,
            None if ragged is None else Ragged(*ragged),
            None if temperature is None else Processing(temperature, None),
            None if randomness is None else Randomness(*randomness),
            DraftRows(drafts[0], drafts[1], kind),
        )

    def _check_call(self, call: ChainCall, names: tuple[str, str]) -> Shapes:
        """Every check of a chain entry's arguments (:meth:`_prepare`), and their shapes."""
        target, bonus_token_ids, draft, draft_token_ids, ragged, processing, randomness, drafts = call
        logits = processing is not None
        draft_is_probs = logits and drafts.kind == "probs"
        if ragged is not None:
            cu, max_spec_len = ragged
            shapes = validation.check_ragged_metadata(
                target, bonus_token_ids, draft, draft_token_ids, cu, max_spec_len, *names, drafts.rows
            )
            if self._strict_mode:
                validation.check_ragged_values(cu, target.shape[0], max_spec_len)
        else:
            shapes = validation.check_metadata(target, bonus_token_ids, draft, draft_token_ids, *names)
        if self._strict_mode:
            validation.check_token_ids(shapes.vocab_size, bonus_token_ids, draft_token_ids)
            if drafts.rows is not None and draft is not None:
                validation.check_draft_rows_values(drafts.rows, draft.shape[0])
        if self._check_values:
            validation.check_float_values(target, None if draft_is_probs else draft, *names, logits)
            if draft_is_probs and draft is not None:
                validation.check_float_values(draft, None, names[1], names[1], logits=False)
        B, device = shapes.batch_size, target.device
        temperature = None if processing is None else processing.temperature
        if temperature is not None:
            validation.check_temperature(temperature, B, device, self._strict_mode)
        if drafts.temperature is not None:
            validation.check_temperature(drafts.temperature, B, device, self._strict_mode, draft=True)
        is_greedy = None if randomness is None else randomness.is_greedy
        if is_greedy is not None:
            validation.check_row_mask("is_greedy", is_greedy, B, device)
        if randomness is not None:  # (seeded_seqs are host objects: rng.row_seeds checks them at each call)
            validation.check_seed_tensor("offsets", randomness.offsets, B, device)
            validation.check_seed_tensor("seeds", randomness.seeds, B, device)
        return shapes

    # -- checks and counters (also V0-style subclasses call these) --------------------------------

    def _validate(
        self,
        target_with_bonus_probs: torch.Tensor,  # [B, k+1, V]
        bonus_token_ids: torch.Tensor,  # [B, 1]
        draft_probs: torch.Tensor | None,  # [B, k, V] or None
        draft_token_ids: torch.Tensor,  # [B, k]
        logits: bool = False,  # the float tensors are target_logits / draft_logits
    ) -> Shapes:
        names = _argument_names(False, logits, "logits" if logits else "probs")
        shapes = validation.check_metadata(
            target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, *names
        )
        if self._strict_mode:
            validation.check_token_ids(shapes.vocab_size, bonus_token_ids, draft_token_ids)
        if self._check_values:
            validation.check_float_values(target_with_bonus_probs, draft_probs, *names, logits)
        return shapes

    def _update_counters(self, output_token_ids: torch.Tensor, num_draft_tokens: int | None = None) -> None:
        """output_token_ids: [B, k+1] in the standard layout; num_draft_tokens defaults to B * k
        (pass T for the ragged layout). Counters on another device move to the output's first."""
        if output_token_ids.device.type == "meta":
            return  # shapes only (e.g. tracing): nothing to count
        B, kp1 = output_token_ids.shape
        k = kp1 - 1
        counts = self._counter_slots(k, output_token_ids.device)
        if output_token_ids.device.type == "cpu" and type(output_token_ids) is torch.Tensor:
            count_on_host(counts.numpy(), output_token_ids.numpy())  # (five eager ops cost more than a small call)
        else:
            # Position i's draft was accepted iff slot i+1 holds a token.
            accepted = output_token_ids[:, 1:] != PLACEHOLDER_TOKEN_ID  # [B, k]
            per_position = accepted.sum(dim=0)
            counts[2 : 2 + k].add_(per_position)  # (add_ on the views: no write-back copy)
            counts[0].add_(per_position.sum())
            counts[1].add_((output_token_ids != PLACEHOLDER_TOKEN_ID).sum())
        self.num_draft_tokens += B * k if num_draft_tokens is None else num_draft_tokens

    # -- vLLM V0's helpers, with V0's signatures and outputs ----------------------------------------

    def _create_output(
        self,
        accepted: torch.Tensor,  # [B, k] bool
        substitute_token_ids: torch.Tensor,  # [B, k] int: the token emitted at the first rejection
        draft_token_ids: torch.Tensor,  # [B, k] int
        bonus_token_ids: torch.Tensor,  # [B] or [B, 1] int
    ) -> torch.Tensor:
        """vLLM V0's output format: [B, k+1] int64 with the accepted prefix of the drafts, then
        the substitute token at the first rejection, or the bonus token after k acceptances
        (V0: only where the last draft id is not -1), then -1. Updates the counters (from the
        output layout: acceptances after a rejection do not count, unlike V0's accepted.sum()).

        Example::

            >>> s = SpecDecodeBaseSampler()
            >>> s._create_output(torch.tensor([[True, False]]), torch.tensor([[7, 8]]),
            ...                  torch.tensor([[3, 4]]), torch.tensor([[9]]))
            tensor([[3, 8, -1]])
        """
        B, k = substitute_token_ids.shape
        bonus = bonus_token_ids.reshape(B).to(torch.int64)
        n = num_leading_accepted(accepted.reshape(B, k).to(torch.bool))  # [B] first rejection (k: none)
        if k == 0:
            final = bonus
        else:
            substitute = substitute_token_ids.to(torch.int64).gather(1, n.clamp(max=k - 1)[:, None]).squeeze(1)
            # V0 fills the bonus slot only where the output's last draft slot is not -1
            bonus = torch.where(draft_token_ids[:, -1] != PLACEHOLDER_TOKEN_ID, bonus, PLACEHOLDER_TOKEN_ID)
            final = torch.where(n < k, substitute, bonus)
        out = build_output(draft_token_ids, n, final)
        self._update_counters(out)
        return out

    def _raise_if_incorrect_input(
        self,
        target_with_bonus_probs: torch.Tensor,  # [B, k+1, V]
        draft_token_ids: torch.Tensor,  # [B, k]
        bonus_token_ids: torch.Tensor,  # [B, 1]
        draft_probs: torch.Tensor | None = None,  # [B, k, V] or None
    ) -> None:
        """vLLM V0's strict-mode check: shapes, dtypes, devices and token ids in [0, V). Raises
        :class:`~spec_samplers.constants.SpecSamplerInputError` (an AssertionError, as V0's asserts)
        naming the argument."""
        shapes = validation.check_metadata(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)
        validation.check_token_ids(shapes.vocab_size, bonus_token_ids, draft_token_ids)


def _forward_of(cls: type) -> Callable[..., Any]:
    """The base-class ``forward`` that ``cls`` inherits from this module."""
    for klass in (SpecDecodeStochasticBaseSampler, SpecDecodeDeterministicBaseSampler):
        if issubclass(cls, klass):
            return klass.forward
    return SpecDecodeBaseSampler.forward


# -- the public entries ---------------------------------------------------------------------------
#
# Each entry is a plain method that names its arguments and hands them to ``_run``, the one
# pipeline. The deterministic samplers' entries take no randomness arguments, so that a seed is
# never silently ignored; the stochastic samplers' take ``seeded_seqs`` (by position too, after the
# entry's own positional arguments), ``seeds`` and ``offsets``, and the probability entries
# ``is_greedy``.


def _call_key(host: tuple[Any, ...], tensors: tuple[torch.Tensor | None, ...]) -> tuple[Any, ...] | None:
    """``host`` and the (shape, dtype, device) of every tensor (None for None): what a chain
    entry's checks read, the key of :meth:`SpecDecodeBaseSampler._prepare`'s memo; None where the
    checks read more (a non-tensor where a tensor belongs: its error is raised by name)."""
    key: list[Any] = [host]
    for t in tensors:
        if t is None:
            key.append(None)
        elif isinstance(t, torch.Tensor):
            key.append((t.shape, t.dtype, t.device))
        else:
            return None
    return tuple(key)


def _argument_names(ragged: bool, logits: bool, draft_kind: str) -> tuple[str, str]:
    """The entry's own names of its target and draft tensors (what its errors name)."""
    if ragged:
        target_name = "target_logits" if logits else "target_probs"
    else:
        target_name = "target_logits" if logits else "target_with_bonus_probs"
    return target_name, "draft_logits" if logits and draft_kind != "probs" else "draft_probs"


class Ragged(NamedTuple):
    """The ragged entries' layout: requests delimited by ``cu_num_draft_tokens``."""

    cu_num_draft_tokens: torch.Tensor  # [B] int32/int64, inclusive cumulative sum of k_b
    max_spec_len: int  # K >= every k_b


class Processing(NamedTuple):
    """The logits entries' target law: softmax at ``temperature``, or ``sampling_params``
    (exactly one of the two is given)."""

    temperature: torch.Tensor | None  # [B] float, 0 = greedy request
    sampling_params: SamplingParams | Sequence[SamplingParams] | None


class DraftRows(NamedTuple):
    """What the draft tensor of a chain entry holds: "logits" (logits entries) or "probs"
    (probability entries, and the ragged logits entry's ``draft_probs=``), its indexed rows and
    their temperature (ragged logits entry)."""

    rows: torch.Tensor | None  # [T] int32/int64 rows of an [N, V] draft matrix
    temperature: torch.Tensor | None  # [B] float, T of the draft rows
    kind: str  # "logits" or "probs"


def _draft_rows(
    sampler: SpecDecodeBaseSampler,
    sampling_params: object,
    draft_logits: torch.Tensor | None,
    draft_probs: torch.Tensor | None,
    draft_rows: torch.Tensor | None,
    draft_temperature: torch.Tensor | None,
) -> tuple[torch.Tensor | None, DraftRows]:
    """(the draft tensor, what it holds) of a ragged logits entry: ``draft_logits`` or, instead,
    ``draft_probs`` (probabilities read as given: no temperature). Indexed draft rows and draft
    probabilities come only with ``temperature=`` and, for the rows, a sampler whose ops read them
    (``takes_draft_rows``)."""
    for name, value in (("draft_rows", draft_rows), ("draft_temperature", draft_temperature)):
        if value is None:
            continue
        if not type(sampler).takes_draft_rows:
            expected = f"None for {type(sampler).__name__} (its ops read [T, V] draft rows: takes_draft_rows)"
            raise input_error(name, expected, "a tensor")
        if sampling_params is not None:
            raise input_error(name, "None with sampling_params (pass temperature=)", "a tensor")
    if draft_probs is not None and sampling_params is not None:
        raise input_error("draft_probs", "None with sampling_params (pass temperature=)", "a tensor")
    if draft_probs is None:
        return draft_logits, DraftRows(draft_rows, draft_temperature, "logits")
    if draft_logits is not None:
        raise input_error("draft_probs", "None when draft_logits is given (one draft law)", "a tensor")
    if draft_temperature is not None:
        raise input_error("draft_temperature", "None with draft_probs (probabilities are read as given)", "a tensor")
    return draft_probs, DraftRows(draft_rows, None, "probs")


class Randomness(NamedTuple):
    """The stochastic entries' randomness arguments."""

    seeded_seqs: dict[int, torch.Generator] | None
    seeds: torch.Tensor | None  # [B] int64
    offsets: torch.Tensor | None  # [B] int64
    is_greedy: torch.Tensor | None = None  # [B] bool (probability entries)


class ChainCall(NamedTuple):
    """A chain entry's arguments, typed: the layout, the target law and the draft law are
    explicit (never implied by which optional tensors are present)."""

    target: torch.Tensor  # [B, k+1, V] padded or [T, V] ragged: probabilities, or logits
    bonus_token_ids: torch.Tensor  # [B, 1] padded, [B] or [B, 1] ragged
    draft: torch.Tensor | None  # [B, k, V] padded or [T, V] ragged (or [N, V] indexed), or None: point masses
    draft_token_ids: torch.Tensor  # [B, k] padded or [T] ragged
    ragged: Ragged | None  # None: padded
    processing: Processing | None  # None: probabilities
    randomness: Randomness | None  # None: a deterministic sampler
    drafts: DraftRows


class Prepared(NamedTuple):
    """What the calls of one shape share (:meth:`SpecDecodeBaseSampler._prepare`): checked once."""

    config: LaunchConfig | None  # the launch config it was planned under (kernels.backend.planned_for)
    op: Callable[..., torch.Tensor] | None  # the launcher or reference (options not bound); None: verify()
    options_call: bool  # the options come from an overridden op_options() (else the sampler's _options)
    layout: RowLayout | None  # padded; None: ragged (the counts are each call's)
    batch_size: int  # B
    max_drafts: int  # K
    vocab_size: int  # V
    kernel_counts: bool  # the kernels add the counters (VerifyBatch.counters)
    meta: bool  # meta tensors, planned for a device (nothing is counted)
    draft_is_probs: bool  # a logits entry's drafts given as probabilities


class SpecDecodeDeterministicBaseSampler(SpecDecodeBaseSampler):
    """Samplers whose output is a function of the inputs alone: the entries take no seeds."""

    def forward(
        self,
        target_with_bonus_probs: torch.Tensor,  # [B, k+1, V] fp32/fp16/bf16
        bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
        draft_probs: torch.Tensor | None,  # [B, k, V] fp32/fp16/bf16, or None
        draft_token_ids: torch.Tensor,  # [B, k] int32/int64
    ) -> torch.Tensor:
        """Verify k drafts per request, padded layout (vLLM V0's ``forward``).

        Parameters
        ----------
        target_with_bonus_probs, draft_probs : torch.Tensor
            [B, k+1, V] and [B, k, V] fp32/fp16/bf16: the target's probabilities at the k draft
            positions and the bonus position; the drafts' (None: point-mass drafts).
        bonus_token_ids, draft_token_ids : torch.Tensor
            [B, 1] and [B, k] int32/int64: the token emitted after k acceptances; the drafts.

        Returns
        -------
        torch.Tensor
            [B, k+1] int64, row b: its accepted drafts, one more token, then -1 to the end.

        Examples
        --------
        >>> out = TypicalAcceptanceSampler()(target_probs, bonus_ids, None, draft_ids)  # [B, k+1]
        """
        return self._run("forward", target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)

    def forward_ragged(
        self,
        target_probs: torch.Tensor,  # [T, V] fp32/fp16/bf16
        bonus_token_ids: torch.Tensor,  # [B] or [B, 1] int32/int64
        draft_probs: torch.Tensor | None,  # [T, V] fp32/fp16/bf16, or None
        draft_token_ids: torch.Tensor,  # [T] int32/int64
        cu_num_draft_tokens: torch.Tensor,  # [B] int32/int64, inclusive cumsum of k_b
        max_spec_len: int,  # K >= every k_b
    ) -> torch.Tensor:
        """Verify k_b drafts per request, ragged layout (vLLM V1): T = sum_b k_b rows.

        Parameters
        ----------
        target_probs, draft_probs : torch.Tensor
            [T, V] fp32/fp16/bf16: row t scores draft token t (``draft_probs`` None: point-mass
            drafts).
        bonus_token_ids, draft_token_ids, cu_num_draft_tokens : torch.Tensor
            [B] (or [B, 1]), [T] and [B] int32/int64; ``cu_num_draft_tokens`` is the inclusive
            cumulative sum of k_b (k_b may be 0).
        max_spec_len : int
            K >= every k_b: fixes the output width.

        Returns
        -------
        torch.Tensor
            [B, K+1] int64, -1 padded: the same tokens as :meth:`forward` on the same data. There
            are no bonus rows, so a bonus id outside [0, V) becomes -1 rather than a resample.

        Examples
        --------
        >>> out = sampler.forward_ragged(target_probs, bonus_ids, None, draft_ids,
        ...                              torch.tensor([2, 2, 5]), max_spec_len=3)  # [3, 4]
        """
        ragged = Ragged(cu_num_draft_tokens, max_spec_len)
        return self._run("forward_ragged", target_probs, bonus_token_ids, draft_probs, draft_token_ids, ragged)

    def forward_from_logits(
        self,
        target_logits: torch.Tensor,  # [B, k+1, V] logits
        bonus_token_ids: torch.Tensor,  # [B, 1] int32/int64
        draft_logits: torch.Tensor | None,  # [B, k, V] logits, or None
        draft_token_ids: torch.Tensor,  # [B, k] int32/int64
        temperature: torch.Tensor | None = None,  # [B] float, 0 = greedy request
        *,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> torch.Tensor:
        """:meth:`forward` on q = softmax(target_logits / T) and p = softmax(draft_logits / T).

        Each request's T serves both; T == 0 makes the request greedy on the target logits'
        argmax. The Triton backend fuses the softmax and never writes a probability tensor.
        Without strict mode a NaN logit counts as -inf and a negative or non-finite T as 1;
        strict mode raises for both.

        Parameters
        ----------
        target_logits, draft_logits : torch.Tensor
            [B, k+1, V] and [B, k, V] fp32/fp16/bf16 (``draft_logits`` None: point-mass drafts).
        bonus_token_ids, draft_token_ids : torch.Tensor
            [B, 1] and [B, k] int32/int64.
        temperature : torch.Tensor, optional
            [B] float, 0 = greedy request. Give this or ``sampling_params``.
        sampling_params : SamplingParams or sequence of SamplingParams, optional
            One for the batch or one per request. Target and draft logits are then processed
            alike, per request, in vLLM's order: temperature, min-p, top-k (ties kept), top-p,
            each renormalised (greedy requests: the target's argmax). The output follows the
            processed target exactly, provided each draft token was sampled from the draft
            logits processed with the same parameters. ``SamplingParams.seed`` is not read here.

        Returns
        -------
        torch.Tensor
            [B, k+1] int64, -1 padded, as :meth:`forward`; greedy requests emit the target's
            argmax where they stop accepting.

        Examples
        --------
        >>> out = sampler.forward_from_logits(target_logits, bonus_ids, draft_logits, draft_ids,
        ...                                   temperature=torch.tensor([0.8, 0.0]))
        """
        processing = Processing(temperature, sampling_params)
        inputs = (target_logits, bonus_token_ids, draft_logits, draft_token_ids)
        return self._run("forward_from_logits", *inputs, processing=processing)

    def forward_ragged_from_logits(
        self,
        target_logits: torch.Tensor,  # [T, V] logits
        bonus_token_ids: torch.Tensor,  # [B] or [B, 1] int32/int64
        draft_logits: torch.Tensor | None,  # [T, V] logits, or None
        draft_token_ids: torch.Tensor,  # [T] int32/int64
        cu_num_draft_tokens: torch.Tensor,  # [B] int32/int64
        max_spec_len: int,  # K >= every k_b
        temperature: torch.Tensor | None = None,  # [B] float, 0 = greedy request
        *,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        draft_rows: torch.Tensor | None = None,  # [T] int32/int64 rows of an [N, V] draft_logits
        draft_temperature: torch.Tensor | None = None,  # [B] float, T of the draft rows
        draft_probs: torch.Tensor | None = None,  # [T, V] (or [N, V] with draft_rows) probabilities
    ) -> torch.Tensor:
        """Ragged twin of :meth:`forward_from_logits`.

        Parameters
        ----------
        target_logits, draft_logits : torch.Tensor
            [T, V] fp32/fp16/bf16 (``draft_logits`` may be None: point-mass drafts).
        bonus_token_ids, draft_token_ids, cu_num_draft_tokens, max_spec_len
            As :meth:`forward_ragged`.
        temperature, sampling_params
            As :meth:`forward_from_logits` (one of the two).
        draft_rows, draft_temperature, draft_probs
            As :meth:`SpecDecodeStochasticBaseSampler.forward_ragged_from_logits`.

        Returns
        -------
        torch.Tensor
            [B, K+1] int64, -1 padded, as :meth:`forward_ragged`.

        Examples
        --------
        >>> out = sampler.forward_ragged_from_logits(target_logits, bonus_ids, None, draft_ids,
        ...     cu_num_draft_tokens, max_spec_len, sampling_params=SamplingParams(temperature=0.7))
        """
        ragged = Ragged(cu_num_draft_tokens, max_spec_len)
        processing = Processing(temperature, sampling_params)
        draft, drafts = _draft_rows(self, sampling_params, draft_logits, draft_probs, draft_rows, draft_temperature)
        inputs = (target_logits, bonus_token_ids, draft, draft_token_ids)
        return self._run("forward_ragged_from_logits", *inputs, ragged, processing, drafts=drafts)


class SpecDecodeStochasticBaseSampler(SpecDecodeBaseSampler):
    """Samplers that draw random numbers. Every entry also takes ``seeded_seqs`` (vLLM V0's:
    row -> torch.Generator; by position after the entry's own positional arguments) and the
    keyword-only ``seeds`` and ``offsets`` ([B] int64 device tensors keying the counter RNG per
    request; offsets default to 0); the probability entries also take ``is_greedy`` ([B] bool,
    rows sampled at temperature 0)."""

    def forward(
        self,
        target_with_bonus_probs: torch.Tensor,  # [B, k+1, V] float
        bonus_token_ids: torch.Tensor,  # [B, 1] int
        draft_probs: torch.Tensor | None,  # [B, k, V] float or None
        draft_token_ids: torch.Tensor,  # [B, k] int
        seeded_seqs: dict[int, torch.Generator] | None = None,
        *,
        seeds: torch.Tensor | None = None,  # [B] int64
        offsets: torch.Tensor | None = None,  # [B] int64
        is_greedy: torch.Tensor | None = None,  # [B] bool
    ) -> torch.Tensor:
        """Verify k drafts per request, padded layout (vLLM V0's ``forward``).

        Parameters
        ----------
        target_with_bonus_probs : torch.Tensor
            [B, k+1, V] fp32/fp16/bf16: the target's probabilities at the k draft positions and
            the bonus position.
        bonus_token_ids : torch.Tensor
            [B, 1] int32/int64: the token emitted after k acceptances.
        draft_probs : torch.Tensor or None
            [B, k, V] fp32/fp16/bf16: the law each draft was sampled from, or None for
            point-mass drafts (greedy drafting).
        draft_token_ids : torch.Tensor
            [B, k] int32/int64.
        seeded_seqs : dict[int, torch.Generator], optional
            vLLM V0's per-row generators: row b's seed is drawn from ``seeded_seqs[b]``.
        seeds, offsets : torch.Tensor, optional
            [B] int64 on the inputs' device: the counter RNG's key per request and its offset
            (default 0). Rows without a seed draw one from torch's default generator.
        is_greedy : torch.Tensor, optional
            [B] bool: requests sampled at temperature 0 (verified against the target's argmax).

        Returns
        -------
        torch.Tensor
            [B, k+1] int64: the accepted drafts, the recovered or bonus token, then -1.

        Examples
        --------
        >>> sampler = RejectionSampler()
        >>> seeds, offsets = torch.arange(B), torch.zeros(B, dtype=torch.int64)
        >>> out = sampler(target_probs, bonus_ids, draft_probs, draft_ids, seeds=seeds, offsets=offsets)
        """
        randomness = Randomness(seeded_seqs, seeds, offsets, is_greedy)
        inputs = (target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)
        return self._run("forward", *inputs, randomness=randomness)

    def forward_ragged(
        self,
        target_probs: torch.Tensor,  # [T, V] float
        bonus_token_ids: torch.Tensor,  # [B] or [B, 1] int
        draft_probs: torch.Tensor | None,  # [T, V] float or None
        draft_token_ids: torch.Tensor,  # [T] int
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,  # K >= every k_b
        seeded_seqs: dict[int, torch.Generator] | None = None,
        *,
        seeds: torch.Tensor | None = None,  # [B] int64: per request, not per row
        offsets: torch.Tensor | None = None,  # [B] int64
        is_greedy: torch.Tensor | None = None,  # [B] bool: per request
    ) -> torch.Tensor:
        """Verify k_b drafts per request, ragged layout (vLLM V1): T = sum_b k_b rows.

        Parameters
        ----------
        target_probs, draft_probs : torch.Tensor
            [T, V] fp32/fp16/bf16: row t scores draft token t (``draft_probs`` may be None).
        bonus_token_ids : torch.Tensor
            [B] or [B, 1] int32/int64.
        draft_token_ids : torch.Tensor
            [T] int32/int64.
        cu_num_draft_tokens : torch.Tensor
            [B] int32/int64: inclusive cumulative sum of k_b (k_b may be 0).
        max_spec_len : int
            K >= every k_b: fixes the output width.
        seeded_seqs, seeds, offsets, is_greedy
            As :meth:`forward`.

        Returns
        -------
        torch.Tensor
            [B, K+1] int64, -1 padded: the same tokens as :meth:`forward` on the same data and
            seeds. A bonus id outside [0, V) becomes -1 rather than a resample.

        Examples
        --------
        >>> out = sampler.forward_ragged(target_probs, bonus_ids, draft_probs, draft_ids,
        ...                              torch.tensor([2, 2, 5]), 3, seeds=torch.arange(3))
        """
        ragged = Ragged(cu_num_draft_tokens, max_spec_len)
        randomness = Randomness(seeded_seqs, seeds, offsets, is_greedy)
        inputs = (target_probs, bonus_token_ids, draft_probs, draft_token_ids)
        return self._run("forward_ragged", *inputs, ragged, randomness=randomness)

    def forward_from_logits(
        self,
        target_logits: torch.Tensor,  # [B, k+1, V] logits
        bonus_token_ids: torch.Tensor,  # [B, 1]
        draft_logits: torch.Tensor | None,  # [B, k, V] logits or None
        draft_token_ids: torch.Tensor,  # [B, k]
        temperature: torch.Tensor | None = None,  # [B], 0 = greedy
        seeded_seqs: dict[int, torch.Generator] | None = None,
        *,
        seeds: torch.Tensor | None = None,  # [B] int64
        offsets: torch.Tensor | None = None,  # [B] int64
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> torch.Tensor:
        """:meth:`forward` on q = softmax(target_logits / T) and p = softmax(draft_logits / T).

        Each request's T serves both; T == 0 makes the request greedy on the target logits'
        argmax (so there is no ``is_greedy``). The Triton backend fuses the softmax and never
        writes a probability tensor.

        Parameters
        ----------
        target_logits : torch.Tensor
            [B, k+1, V] fp32/fp16/bf16.
        bonus_token_ids : torch.Tensor
            [B, 1] int32/int64.
        draft_logits : torch.Tensor or None
            [B, k, V] fp32/fp16/bf16, or None for point-mass drafts.
        draft_token_ids : torch.Tensor
            [B, k] int32/int64.
        temperature : torch.Tensor, optional
            [B] float, 0 = greedy request. Give this or ``sampling_params``.
        seeded_seqs, seeds, offsets
            As :meth:`forward`.
        sampling_params : SamplingParams or sequence of SamplingParams, optional
            Per-request processing in vLLM's order (temperature, min-p, top-k, top-p), as
            :meth:`SpecDecodeDeterministicBaseSampler.forward_from_logits`; lossless for the
            processed target when the drafts were sampled from the draft processed alike.
            ``SamplingParams.seed`` is not read here: pass ``seeds``.

        Returns
        -------
        torch.Tensor
            [B, k+1] int64, -1 padded (the layout of :meth:`forward`'s output, whatever the
            input form).

        Examples
        --------
        >>> out = sampler.forward_from_logits(target_logits, bonus_ids, draft_logits, draft_ids,
        ...     sampling_params=[SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=0)])
        """
        processing = Processing(temperature, sampling_params)
        randomness = Randomness(seeded_seqs, seeds, offsets)
        inputs = (target_logits, bonus_token_ids, draft_logits, draft_token_ids)
        return self._run("forward_from_logits", *inputs, processing=processing, randomness=randomness)

    def forward_ragged_from_logits(
        self,
        target_logits: torch.Tensor,  # [T, V] logits
        bonus_token_ids: torch.Tensor,  # [B] or [B, 1]
        draft_logits: torch.Tensor | None,  # [T, V] logits or None
        draft_token_ids: torch.Tensor,  # [T]
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,  # K >= every k_b
        temperature: torch.Tensor | None = None,  # [B], 0 = greedy
        seeded_seqs: dict[int, torch.Generator] | None = None,
        *,
        seeds: torch.Tensor | None = None,  # [B] int64: per request, not per row
        offsets: torch.Tensor | None = None,  # [B] int64
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        draft_rows: torch.Tensor | None = None,  # [T] int32/int64 rows of an [N, V] draft_logits
        draft_temperature: torch.Tensor | None = None,  # [B] float, T of the draft rows
        draft_probs: torch.Tensor | None = None,  # [T, V] (or [N, V] with draft_rows) probabilities
    ) -> torch.Tensor:
        """:meth:`forward_from_logits` in the ragged layout of :meth:`forward_ragged`.

        Parameters
        ----------
        target_logits : torch.Tensor
            [T, V] fp32/fp16/bf16: row t scores draft token t.
        draft_logits : torch.Tensor or None
            [T, V] fp32/fp16/bf16, or None for point-mass drafts; with ``draft_rows`` an [N, V]
            matrix of any row stride (e.g. an engine's cache ``cache.view(-1, V')[:, :V]``,
            read in place: no copy).
        bonus_token_ids, draft_token_ids, cu_num_draft_tokens, max_spec_len
            As :meth:`forward_ragged`: [B] (or [B, 1]), [T], [B] and K.
        temperature, sampling_params, seeded_seqs, seeds, offsets
            As :meth:`forward_from_logits`.
        draft_rows : torch.Tensor, optional
            [T] int32/int64: draft row t is ``draft_logits[draft_rows[t]]`` (rows may repeat or
            come in any order). An index outside [0, N) rejects that draft (its row is never
            read; strict mode raises). Needs ``temperature=`` (not ``sampling_params``) and a
            sampler with ``takes_draft_rows`` (rejection sampling, block verification, typical
            acceptance).
        draft_temperature : torch.Tensor, optional
            [B] float: the temperature of request b's draft rows, p = softmax(draft / T_draft)
            (default ``temperature``); the target rows keep ``temperature``, whose 0 still
            marks a greedy request. A value not > 0 (or NaN) counts as 1; strict mode raises.
        draft_probs : torch.Tensor, optional
            The drafts' law as probabilities instead of ``draft_logits`` (then None): [T, V]
            fp32/fp16/bf16, or with ``draft_rows`` an [N, V] matrix of any row stride, read as
            given (no temperature, no ``draft_temperature``; bad values as in
            :meth:`forward_ragged`), while the target stays logits. For an engine whose drafter
            hands over q itself (vLLM V1's draft probabilities): no softmax or copy of either.

        Returns
        -------
        torch.Tensor
            [B, K+1] int64, -1 padded: row b holds at most k_b + 1 tokens.

        Examples
        --------
        >>> out = sampler.forward_ragged_from_logits(target_logits, bonus_ids, draft_logits, draft_ids,
        ...     cu_num_draft_tokens, max_spec_len, temperature=torch.ones(B), seeds=seeds)

        An engine's drafter cache [R, S, V'] (pre-temperature logits) read in place, target
        logits already divided by their temperature (so T = 1, 0 for greedy requests):

        >>> out = sampler.forward_ragged_from_logits(target_logits, bonus_ids,
        ...     cache.view(-1, cache.shape[-1])[:, :V], draft_ids, cu_num_draft_tokens, K,
        ...     temperature=torch.where(req_temp == 0, 0.0, 1.0), seeds=seeds,
        ...     draft_rows=row_state * S + row_step, draft_temperature=req_temp)
        """
        ragged = Ragged(cu_num_draft_tokens, max_spec_len)
        processing = Processing(temperature, sampling_params)
        randomness = Randomness(seeded_seqs, seeds, offsets)
        draft, drafts = _draft_rows(self, sampling_params, draft_logits, draft_probs, draft_rows, draft_temperature)
        inputs = (target_logits, bonus_token_ids, draft, draft_token_ids)
        return self._run("forward_ragged_from_logits", *inputs, ragged, processing, randomness, drafts)
