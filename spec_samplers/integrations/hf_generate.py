"""``model.generate(custom_generate=speculative_generate)``: batched speculative decoding with any
registered sampler inside transformers' ``generate``.

transformers prepares the call (generation config, left-padded ``input_ids`` and attention mask,
logits processors, stopping criteria) and hands it to :data:`speculative_generate`, which maps it
onto :class:`~spec_samplers.decoding.SpeculativeDecoder` (the one decoding loop) and returns what
``generate`` returns. Imported by ``spec_samplers.integrations.transformers``; documented in
docs/transformers.md.

What crosses over, and how:

* sampling: ``do_sample=False`` is greedy; otherwise the temperature, top-k, top-p and min-p
  warpers transformers built are read back into :class:`~spec_samplers.SamplingParams`, and the
  package's fused filters apply them to target and draft alike. Any other logits processor
  (repetition penalty, min length, bad words, ...) is refused by name: the sampler can only keep
  the target's law for a distribution both models are processed to.
* drafting: ``assistant_model`` (a draft model), ``prompt_lookup_num_tokens`` without one
  (n-gram drafting), ``tree=`` (token trees). k is ``num_assistant_tokens`` (or
  ``prompt_lookup_num_tokens``). With a draft model and a token-wise sampler, the draft length
  follows transformers' policy, read from the same generation config: a round stops drafting
  once the draft's probability of its own token falls below ``assistant_confidence_threshold``
  (transformers' default 0.4; 0 drafts k every round), and ``num_assistant_tokens_schedule``
  "heuristic" / "heuristic_transient" moves k by +2 / -1 per round (default "constant").
* stopping: EOS and ``max_new_tokens``/``max_length`` natively; any other stopping criterion
  (stop strings, max time, your own) is checked after every emitted token, so a request ends at
  the token where transformers' own loop would end it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from spec_samplers.constants import input_error
from spec_samplers.decoding.output import RoundTarget
from spec_samplers.decoding.prompt_lookup import PromptLookupDrafter
from spec_samplers.decoding.speculative import SpeculativeDecoder
from spec_samplers.decoding.tree_drafting import NodeBudget
from spec_samplers.sampling_params import SamplingParams

#: the warpers read back into SamplingParams, by transformers class name
_WARPERS = {
    "TemperatureLogitsWarper": "temperature",
    "TopKLogitsWarper": "top_k",
    "TopPLogitsWarper": "top_p",
    "MinPLogitsWarper": "min_p",
}
#: stopping criteria the decoding loop applies itself (EOS ids and the token budget)
_NATIVE_CRITERIA = ("MaxLengthCriteria", "EosTokenCriteria")


def _fail(message: str) -> ValueError:
    return ValueError(f"speculative_generate: {message}")


def sampling_fields(logits_processor: Sequence[Any], do_sample: bool) -> dict[str, float | int]:
    """SamplingParams fields (temperature, top_k, top_p, min_p) of a prepared
    ``LogitsProcessorList``; ValueError naming any processor that the fused filters cannot
    reproduce on both models."""
    fields: dict[str, float | int] = {}
    for position, processor in enumerate(logits_processor):
        name = type(processor).__name__
        field = _WARPERS.get(name)
        if field is None:
            raise _fail(
                f"logits processor {name} cannot be applied exactly to both the target and the draft "
                f"(supported: temperature, top_k, top_p, min_p, i.e. {', '.join(_WARPERS)}); remove it, or the "
                "generation-config field that adds it, or use generate without custom_generate"
            )
        if field in fields:
            raise _fail(f"two {name} in logits_processor; expected at most one")
        if field == "temperature" and position:
            raise _fail(f"{name} after another warper; expected the temperature first (transformers' order)")
        if getattr(processor, "min_tokens_to_keep", 1) != 1:
            raise _fail(f"{name}.min_tokens_to_keep: expected 1, got {processor.min_tokens_to_keep}")
        if getattr(processor, "filter_value", float("-inf")) != float("-inf"):
            raise _fail(f"{name}.filter_value: expected -inf, got {processor.filter_value}")
        fields[field] = getattr(processor, field)
    if not do_sample:  # warpers keep the argmax: greedy is greedy whatever they say
        return {"temperature": 0.0}
    if "min_p" in fields and "top_p" in fields:
        # transformers filters top-p then min-p, the fused filters min-p then top-p: different laws
        raise _fail(
            "MinPLogitsWarper with TopPLogitsWarper: transformers applies top-p before min-p and the fused "
            "filters min-p before top-p, which keep different tokens; set only one of min_p and top_p"
        )
    return fields


#: transformers' GenerationConfig defaults for assisted generation (its global defaults in 5.x)
_ASSISTED_DEFAULTS = {"assistant_confidence_threshold": 0.4, "num_assistant_tokens_schedule": "constant"}


def draft_policy(config: Any) -> dict[str, Any]:
    """SpeculativeDecoder's ``confidence_threshold`` and ``draft_schedule`` from a generation
    config's ``assistant_confidence_threshold`` and ``num_assistant_tokens_schedule`` (None:
    transformers' defaults, 0.4 and "constant")."""
    values = {name: getattr(config, name, None) for name in _ASSISTED_DEFAULTS}
    values = {name: default if values[name] is None else values[name] for name, default in _ASSISTED_DEFAULTS.items()}
    return {
        "confidence_threshold": values["assistant_confidence_threshold"],
        "draft_schedule": values["num_assistant_tokens_schedule"],
    }


def _generate_frame_locals() -> dict[str, Any]:
    """The locals of transformers' ``generate`` that called us, or {}.

    transformers hands a ``custom_generate`` callable neither ``assistant_model`` (4.56 and 5.x)
    nor ``streamer`` (5.x passes only the callable's own declared parameters found in its
    ``**kwargs``; both are named parameters of ``generate``), so they are read from its frame."""
    frame = inspect.currentframe()
    try:
        caller = frame.f_back if frame is not None else None
        for _ in range(4):
            if caller is None:
                break
            names = caller.f_locals
            if caller.f_code.co_name == "generate" and "custom_generate" in names:
                return dict(names)
            caller = caller.f_back
        return {}
    finally:
        del frame


def _as_id_list(eos: Any) -> list[int] | None:
    if eos is None:
        return None
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    return [int(eos)] if isinstance(eos, int) else [int(t) for t in eos]


class _GenerateObserver:
    """The decoding loop's RoundObserver for one generate call: stopping criteria after each
    emitted token, the streamer, and the sequences/scores/logits transformers returns."""

    def __init__(
        self,
        input_ids: torch.Tensor,  # [B, P] as generate received them (left padding included)
        max_new_tokens: int,
        pad_token_id: int,
        criteria: Any,  # a StoppingCriteriaList of the criteria checked here, or None
        streamer: Any,
        scores: bool,
        logits: bool,
        greedy: torch.Tensor,  # [B] bool
    ) -> None:
        B, P = input_ids.shape
        self.prompt_width = P
        self.sequences = torch.full((B, P + max_new_tokens), pad_token_id, dtype=torch.int64)
        self.sequences[:, :P] = input_ids.cpu()
        self.pad_token_id = pad_token_id
        self.criteria = criteria
        self.streamer = streamer
        self.want_scores, self.want_logits = scores, logits
        self.greedy = greedy
        self.scores: torch.Tensor | None = None  # [B, max_new_tokens, V] once a round is seen
        self.logits: torch.Tensor | None = None

    def _record(self, rows: torch.Tensor, keep: torch.Tensor, have: torch.Tensor, target: RoundTarget) -> None:
        M, W = target.positions.shape
        V = target.logits.shape[-1]
        index = target.positions[:, :, None].expand(M, W, V)
        raw = target.logits.gather(1, index).float()  # [M, W, V]
        j = torch.arange(W, device=raw.device)[None]
        mask = j < keep.to(raw.device)[:, None]
        row_index = rows.to(raw.device)[:, None].expand(M, W)[mask]
        step_index = (have.to(raw.device)[:, None] + j)[mask]
        B, T = self.sequences.shape[0], self.sequences.shape[1] - self.prompt_width
        for name, wanted in (("scores", self.want_scores), ("logits", self.want_logits)):
            if not wanted:
                continue
            store = getattr(self, name)
            if store is None:  # rows past their end read as the pad token's certainty
                store = torch.full((B, T, V), float("-inf"), device=raw.device)
                store[:, :, min(self.pad_token_id, V - 1)] = 0.0
                setattr(self, name, store)
            values = raw
            if name == "scores":  # what the token was drawn from: log q' (greedy: the raw logits)
                greedy = self.greedy.to(raw.device)[rows.to(raw.device)][:, None, None]
                values = torch.where(greedy, raw, target.probs.gather(1, index).log())
            store[row_index, step_index] = values[mask]

    def __call__(
        self,
        rows: torch.Tensor,
        new: torch.Tensor,
        keep: torch.Tensor,
        have: torch.Tensor,
        target: RoundTarget | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keep = keep.clone()
        stopped = torch.zeros_like(keep, dtype=torch.bool)
        P = self.prompt_width
        for m, (row, n, before) in enumerate(zip(rows.tolist(), keep.tolist(), have.tolist())):
            self.sequences[row, P + before : P + before + n] = new[m, :n]
            if self.criteria is None:
                continue
            for j in range(n):
                end = P + before + j + 1
                scores = target.logits[m, target.positions[m, j]][None] if target is not None else None
                if bool(self.criteria(self.sequences[row : row + 1, :end], scores).any()):
                    keep[m], stopped[m] = j + 1, True
                    self.sequences[row, end : P + before + n] = self.pad_token_id
                    break
        if target is not None and (self.want_scores or self.want_logits):
            self._record(rows, keep, have, target)
        if self.streamer is not None and int(keep[0]):
            self.streamer.put(new[:1, : int(keep[0])])
        return keep, stopped

    def output(self, num_generated: torch.Tensor) -> tuple[torch.Tensor, tuple | None, tuple | None]:
        """(sequences [B, P + T], scores, logits): T the longest request's tokens, as generate."""
        T = int(num_generated.max()) if num_generated.numel() else 0
        steps = lambda store: None if store is None else tuple(store[:, :T].unbind(1))  # noqa: E731
        scores = steps(self.scores) if self.want_scores else None
        logits = steps(self.logits) if self.want_logits else None
        return self.sequences[:, : self.prompt_width + T], scores, logits


class SpeculativeGenerate:
    """The ``custom_generate`` callable (:data:`speculative_generate`; module docstring).

    Its own parameters, passed to ``generate`` next to the usual ones (transformers 5.x passes a
    callable's declared parameters through; on 4.56, bind them with :meth:`with_options` instead):

    Args:
        sampler: a registered sampler name (``spec_samplers.available_samplers()``) or instance.
        sampler_options: the sampler's constructor options.
        tree: draft token trees: a branching list such as [2, 2, 1] or a ``NodeBudget``.
        draft_sampling: siblings' draw in a tree: "independent", "without_replacement" or
            "deterministic".
        num_paths: K independent draft paths per round, verified in one target pass (with
            ``sampler="multipath_block_verification"``; docs/multipath.md).
        seeds: one int per sequence: a sequence's output depends on its seed only, never on
            the batch it runs in. None: seeds from torch's default generator
            (``torch.manual_seed`` makes a call reproducible).
        stats: a list; the call appends its :class:`~spec_samplers.decoding.GenerationOutput`
            (acceptance per position, rounds, forward passes per sequence).
        assistant_model: the draft model (``generate``'s own ``assistant_model`` is read from its
            call). Without one, ``prompt_lookup_num_tokens`` selects n-gram drafting.
    """

    def __init__(self, language_model: Any, require: Any, **defaults: Any) -> None:
        # the transformers adapter (HFLanguageModel, require_transformers), handed over by
        # spec_samplers.integrations.transformers, which builds the public instance: this module
        # never imports that one (one direction)
        self._language_model, self._require = language_model, require
        self._defaults = defaults

    def with_options(self, **options: Any) -> SpeculativeGenerate:
        """A copy with ``options`` (any parameter of the call) bound: what transformers versions
        before declared-parameter support (4.56) need, e.g.
        ``custom_generate=speculative_generate.with_options(sampler="block_verification")``."""
        allowed = set(inspect.signature(self.__call__).parameters) - {"model_kwargs"}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise input_error("options", f"parameters of speculative_generate ({', '.join(sorted(allowed))})", unknown)
        return SpeculativeGenerate(self._language_model, self._require, **{**self._defaults, **options})

    def __call__(
        self,
        model: Any,
        input_ids: torch.Tensor,
        logits_processor: Any = None,
        stopping_criteria: Any = None,
        generation_config: Any = None,
        synced_gpus: bool = False,
        streamer: Any = None,
        assistant_model: Any = None,
        sampler: str | torch.nn.Module | None = None,
        sampler_options: dict[str, object] | None = None,
        tree: Sequence[int] | NodeBudget | None = None,
        draft_sampling: str | None = None,
        seeds: Sequence[int] | None = None,
        stats: list[Any] | None = None,
        num_paths: int | None = None,
        **model_kwargs: Any,
    ) -> Any:
        given = {
            "num_paths": num_paths,
            "assistant_model": assistant_model,
            "sampler": sampler,
            "sampler_options": sampler_options,
            "tree": tree,
            "draft_sampling": draft_sampling,
            "seeds": seeds,
            "stats": stats,
            "streamer": streamer,
        }
        options = {**self._defaults, **{k: v for k, v in given.items() if v is not None}}
        frame = _generate_frame_locals()
        for name in ("assistant_model", "streamer"):
            if options.get(name) is None and frame.get(name) is not None:
                options[name] = frame[name]
        return _speculative_generate(
            model, input_ids, logits_processor or [], stopping_criteria or [], generation_config, synced_gpus,
            options, model_kwargs, self._language_model, self._require,
        )  # fmt: skip


def _check_call(input_ids: torch.Tensor, config: Any, synced_gpus: bool, model_kwargs: dict[str, Any]) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise input_error("input_ids", "a tensor [batch, prompt length]", type(input_ids).__name__)
    if config is None:
        raise input_error("generation_config", "the GenerationConfig generate prepared", None)
    if getattr(config, "num_beams", 1) != 1:
        raise _fail(f"num_beams: expected 1 (speculative decoding samples one path), got {config.num_beams}")
    for flag in ("output_attentions", "output_hidden_states"):
        if getattr(config, flag, False) and getattr(config, "return_dict_in_generate", False):
            raise _fail(f"{flag}: not supported (expected False)")
    if synced_gpus:
        raise _fail("synced_gpus: not supported (expected False)")
    for name in ("past_key_values", "cache"):
        cache = model_kwargs.get(name)
        if cache is not None and hasattr(cache, "get_seq_length") and int(cache.get_seq_length()) > 0:
            raise _fail(f"{name}: continuing from a filled cache is not supported (pass the whole prompt)")


def _speculative_generate(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Sequence[Any],
    stopping_criteria: Sequence[Any],
    config: Any,
    synced_gpus: bool,
    options: dict[str, Any],
    model_kwargs: dict[str, Any],
    HFLanguageModel: Any,  # noqa: N803 (the class, as transformers.py names it)
    require_transformers: Any,
) -> Any:
    transformers = require_transformers()
    _check_call(input_ids, config, synced_gpus, model_kwargs)
    B, P = input_ids.shape
    fields = sampling_fields(logits_processor, bool(config.do_sample))
    seeds = options.get("seeds")
    if seeds is not None:
        if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or len(seeds) != B:
            raise input_error("seeds", f"a sequence of {B} ints (one per sequence)", repr(seeds))
    params = [SamplingParams(**fields, seed=None if seeds is None else seeds[b]) for b in range(B)]  # type: ignore[arg-type]
    draft_model = options.get("assistant_model")
    lookup = getattr(config, "prompt_lookup_num_tokens", None)
    if draft_model is None and not lookup:
        raise _fail("no drafter: pass assistant_model=<draft model> or prompt_lookup_num_tokens=<k>")
    k: Any = lookup if draft_model is None else getattr(config, "num_assistant_tokens", None) or 5
    tree = options.get("tree")
    if draft_model is None and (tree is not None or options.get("num_paths") is not None):
        raise _fail("tree= and num_paths= need assistant_model (prompt lookup drafts chains)")
    # everything the decoder checks (sampler name and options, k, tree) fails here, before any model call
    decoder_args = dict(
        sampler=options.get("sampler") or "rejection_sampler",
        num_speculative_tokens=int(k),
        sampler_options=options.get("sampler_options"),
        tree=tree,
        draft_sampling=options.get("draft_sampling") or "independent",
        num_paths=options.get("num_paths"),
        # transformers' draft-length policy, for a draft model's chains (n-gram drafts are not scored)
        **(draft_policy(config) if draft_model is not None and tree is None and not options.get("num_paths") else {}),
    )
    eos = _as_id_list(getattr(config, "eos_token_id", None))
    target = HFLanguageModel(model, eos_token_id=eos)
    if draft_model is not None:
        draft: Any = HFLanguageModel(draft_model, eos_token_id=None)
    else:
        vocab = target.vocab_size or int(model.get_output_embeddings().weight.shape[0])
        draft = PromptLookupDrafter(vocab, getattr(config, "max_matching_ngram_size", None) or 2, model.device)
    decoder = SpeculativeDecoder(target, draft, **decoder_args)

    max_new_tokens = int(config.max_length) - P
    streamer = options.get("streamer")
    if streamer is not None and B != 1:
        raise _fail(f"streamer: supported for batch size 1 (as transformers), got batch size {B}")
    extra = [c for c in stopping_criteria if type(c).__name__ not in _NATIVE_CRITERIA]
    pad_ids = _as_id_list(config.pad_token_id)  # an int, a list or a tensor: the first id pads
    pad = pad_ids[0] if pad_ids else eos[0] if eos else 0
    return_dict = bool(getattr(config, "return_dict_in_generate", False))
    observer = _GenerateObserver(
        input_ids,
        max_new_tokens,
        pad,
        transformers.StoppingCriteriaList(extra) if extra else None,
        streamer,
        scores=return_dict and bool(getattr(config, "output_scores", False)),
        logits=return_dict and bool(getattr(config, "output_logits", False)),
        greedy=torch.tensor([p.is_greedy for p in params]),
    )
    mask = model_kwargs.get("attention_mask")
    rows = input_ids.cpu().tolist()
    if mask is not None:
        keep = mask.cpu().bool().tolist()
        rows = [[t for t, m in zip(row, kept) if m] for row, kept in zip(rows, keep)]
    out = decoder.generate(rows, max(max_new_tokens, 0), params, observer=observer)
    if streamer is not None:
        streamer.end()
    sequences, scores, logits = observer.output(torch.tensor(out.num_tokens, dtype=torch.int64))
    sequences = sequences.to(input_ids.device)
    if options.get("stats") is not None:
        options["stats"].append(out)
    if not return_dict:
        return sequences
    return transformers.generation.utils.GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits)
