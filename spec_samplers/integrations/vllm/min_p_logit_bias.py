"""``min_p`` and ``logit_bias`` under speculative decoding (vLLM 0.32 and 0.33), when our section is set.

vLLM refuses both with speculative decoding on (``SamplingParams._validate_spec_decode``: "not yet
supported with speculative decoding") and its V1 model runner then builds only the min-tokens
logits processor. Our samplers verify against the processed target exactly and judge each draft
against the law it was drawn from, so with ``additional_config["spec_samplers"]`` set these
requests are served losslessly:

- validation: vLLM's own ``_validate_spec_decode`` runs on a copy of the request with ``min_p``
  and ``logit_bias`` neutral, so exactly those two refusals are lifted (a bias on a token outside
  the vocabulary is still refused by ``_validate_logit_bias``); the engine's input processor
  says, for the duration of its own validation, whether its configuration holds our section;
- V1 runner: ``build_logitsprocs`` builds vLLM's three built-in processors (min-tokens, logit
  bias, min-p) as without speculative decoding, so vLLM's Sampler applies them to the bonus rows;
  the draft rows get them from :func:`apply_logits_processors` (:func:`add_logit_bias_to_draft_rows`,
  :func:`apply_min_p_to_draft_rows`);
- Model Runner V2 needs nothing more: its ``Sampler.apply_sampling_params`` already applies logit
  bias, penalties, temperature, min-p and top-k/top-p to every logits row, draft rows included.

Without our section every wrapped function is vLLM's, called with the arguments as given. The
four wraps (``plugin.WRAPS``, feature ``min_p_logit_bias``) are used together: if vLLM changed the
signature of one of them, the plugin leaves it as vLLM's, and :func:`validate_spec_decode` and
:func:`build_logitsprocs` stay vLLM's too (``plugin.feature_installed``), so min_p and logit_bias
are refused as vLLM refuses them, never accepted and then dropped on the draft rows.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import torch

from spec_samplers.integrations.vllm.config import CONFIG_KEY
from spec_samplers.integrations.vllm.plugin import MIN_P_LOGIT_BIAS, feature_installed

#: whether the input processor validating the current request belongs to an engine with our section
_section_set: ContextVar[bool] = ContextVar("spec_samplers_section_set", default=False)


def section_set(vllm_config: Any) -> bool:
    """Whether ``vllm_config.additional_config`` holds our section (validated at engine start)."""
    additional = getattr(vllm_config, "additional_config", None)
    return isinstance(additional, dict) and CONFIG_KEY in additional


def neutral_copy(params: Any) -> Any:
    """A shallow copy of a ``SamplingParams`` with ``min_p`` and ``logit_bias`` at their defaults."""
    neutral = copy.copy(params)
    neutral.min_p = 0.0
    neutral.logit_bias = None
    return neutral


def validate_params(vllm_validate_params: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps ``InputProcessor._validate_params``: vLLM's, run while :func:`validate_spec_decode`
    knows whether this engine has our section."""

    @functools.wraps(vllm_validate_params)
    def _validate_params(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _section_set.set(section_set(getattr(self, "vllm_config", None)))
        try:
            return vllm_validate_params(self, *args, **kwargs)
        finally:
            _section_set.reset(token)

    return _validate_params


def validate_spec_decode(vllm_validate_spec_decode: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps ``SamplingParams._validate_spec_decode``: with our section, vLLM's checks run on
    :func:`neutral_copy` of the request (min_p and logit_bias are served); otherwise vLLM's as is."""

    @functools.wraps(vllm_validate_spec_decode)
    def _validate_spec_decode(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _section_set.get() and feature_installed(MIN_P_LOGIT_BIAS):
            return vllm_validate_spec_decode(neutral_copy(self), *args, **kwargs)
        return vllm_validate_spec_decode(self, *args, **kwargs)

    return _validate_spec_decode


def build_logitsprocs(vllm_build_logitsprocs: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps V1's ``build_logitsprocs`` (as the V1 model runner imported it): with our section
    and speculative decoding, vLLM's built-in processors (min-tokens, logit bias, min-p) are built
    as vLLM builds them without speculative decoding. Custom processors and pooling models go to
    vLLM's function, which refuses the first and builds none for the second."""

    @functools.wraps(vllm_build_logitsprocs)
    def _build_logitsprocs(
        vllm_config: Any,
        device: Any,
        is_pin_memory: bool,
        is_pooling_model: bool,
        custom_logitsprocs: Any = (),
    ) -> Any:
        if (
            is_pooling_model
            or custom_logitsprocs
            or getattr(vllm_config, "speculative_config", None) is None
            or not section_set(vllm_config)
            or not feature_installed(MIN_P_LOGIT_BIAS)
        ):
            return vllm_build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs)
        from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, LogitsProcessors

        return LogitsProcessors(ctor(vllm_config, device, is_pin_memory) for ctor in BUILTIN_LOGITS_PROCESSORS)

    return _build_logitsprocs


# --- V1: logit bias and min-p on the draft rows ----------------------------------------------------


def apply_logits_processors(vllm_apply_logits_processors: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wraps V1's ``RejectionSampler.apply_logits_processors`` so that the draft rows get the logit
    bias and min-p processors that vLLM's Sampler applies to the bonus rows, in the Sampler's order:
    the bias before the penalties, min-p after them and before temperature, top-k and top-p.

    vLLM's method applies penalties, allowed-token and bad-words masks and min-tokens to the draft
    rows, but not the batch's ``LogitBiasLogitsProcessor`` / ``MinPLogitsProcessor``; vLLM builds
    those with speculative decoding only when our section is set (:func:`build_logitsprocs`), so
    without it this wrapper finds neither and changes nothing. The masks commute with the bias (-inf stays
    -inf), so adding it first is the Sampler's order. Min-p is applied before temperature as
    ``x < max(x) + T log(min_p)``, which is vLLM's ``p < min_p max(p)`` on ``softmax(x / T)``."""

    @functools.wraps(vllm_apply_logits_processors)
    def _apply_logits_processors(
        self: Any, logits: torch.Tensor, sampling_metadata: Any, metadata: Any
    ) -> torch.Tensor:
        logitsprocs = sampling_metadata.logitsprocs
        logits = add_logit_bias_to_draft_rows(
            logits, logitsprocs.non_argmax_invariant, metadata.cu_num_draft_tokens, metadata.max_spec_len
        )
        logits = vllm_apply_logits_processors(self, logits, sampling_metadata, metadata)
        return apply_min_p_to_draft_rows(
            logits, logitsprocs.argmax_invariant, metadata.cu_num_draft_tokens, sampling_metadata.temperature
        )

    return _apply_logits_processors


def _first_of(processors: list[Any], class_name: str) -> Any:
    return next((p for p in processors if type(p).__name__ == class_name), None)


def add_logit_bias_to_draft_rows(
    logits: torch.Tensor,  # [T, V] fp32, updated in place
    processors: list[Any],  # the batch's non-argmax-invariant V1 logits processors
    cu_num_draft_tokens: torch.Tensor,  # [B] inclusive
    max_spec_len: int,  # K: no request has more drafts (a host int in vLLM's metadata)
) -> torch.Tensor:
    """Adds each request's ``logit_bias`` to every one of its draft rows, from the batch's
    ``LogitBiasLogitsProcessor`` (its ``(request, token)`` pairs and biases, already on the device).
    [T, V]: the same tensor."""
    bias = _first_of(processors, "LogitBiasLogitsProcessor")
    if bias is None or not bias.biases or logits.shape[0] == 0:  # biases: a host dict
        return logits
    reqs, tokens = (t.to(torch.int64) for t in bias.logits_slice)  # [P], [P]
    cu = cu_num_draft_tokens.to(torch.int64)  # [B]
    num_draft = torch.diff(cu, prepend=cu.new_zeros(1))  # [B]
    step = torch.arange(max_spec_len, device=logits.device)  # [K]
    valid = step[None, :] < num_draft[reqs][:, None]  # [P, K]
    rows = torch.where(valid, (cu - num_draft)[reqs][:, None] + step[None, :], 0)  # [P, K]
    values = torch.where(valid, bias.bias_tensor.to(logits.dtype)[:, None], 0.0)  # [P, K]: 0 added off the rows
    columns = tokens[:, None].expand_as(rows)  # [P, K]
    logits.index_put_((rows.reshape(-1), columns.reshape(-1)), values.reshape(-1), accumulate=True)
    return logits


def apply_min_p_to_draft_rows(
    logits: torch.Tensor,  # [T, V] fp32 before temperature, updated in place
    processors: list[Any],  # the batch's argmax-invariant V1 logits processors
    cu_num_draft_tokens: torch.Tensor,  # [B] inclusive
    temperature: torch.Tensor | None,  # [B] fp32, 0 for greedy requests; None when all are greedy
) -> torch.Tensor:
    """Masks to -inf the tokens that min-p drops from each draft row, from the batch's
    ``MinPLogitsProcessor`` (``min_p`` [B, 1] on the device). [T, V]: the same tensor."""
    min_p = _first_of(processors, "MinPLogitsProcessor")
    if min_p is None or not min_p.min_p_count or temperature is None or logits.shape[0] == 0:
        return logits
    rows = torch.arange(logits.shape[0], device=logits.device)
    req_of_row = torch.searchsorted(cu_num_draft_tokens.to(torch.int64), rows, right=True)  # [T]
    row_min_p = min_p.min_p.reshape(-1)[req_of_row]  # [T]; 0 where unset (greedy requests have 0)
    row_temp = temperature.to(torch.float32)[req_of_row]  # [T]
    row_temp = torch.where(row_temp > 0, row_temp, 1.0)  # vLLM divides greedy rows by 1
    threshold = logits.amax(dim=-1) + row_temp * torch.log(row_min_p)  # [T]; -inf where min_p = 0
    return logits.masked_fill_(logits < threshold[:, None], float("-inf"))
