"""Seam in vLLM's V1 model runner: ``vllm.v1.sample.rejection_sampler.rejection_sample``.

``RejectionSampler.forward`` samples the bonus tokens with vLLM's own sampler, applies penalties,
bad words, logits processors, temperature, top-k and top-p to the target logits, then calls this
function, then computes logprobs from its output; the runner parses the output and counts the
metrics. Replacing only this function keeps all of that vLLM's.

Semantics kept from vLLM: greedy requests (temperature 0) are verified against the argmax of the
target logits; requests with their own ``torch.Generator`` (a per-request seed) draw their
randomness from it, and only when they have drafts (vLLM's rule), so re-seeding reproduces them;
the others draw from torch's default generator. Output [B, K+1] int32, -1 padded; every request
gets at least one token in the vocabulary (``ragged.at_least_one_token``: a first row without
probability mass, all NaN logits, gives token 0, as vLLM's own verification does).

Plain steps skip vLLM's glue (:func:`forward`, a wrapper of ``RejectionSampler.forward`` that
the plugin installs): when the batch needs nothing but temperature, the model's [T + B, V]
logits are verified in place, bonus rows included, and the bonus token is drawn in our kernels
instead of by vLLM's Sampler (fast_path.py: :func:`~spec_samplers.integrations.vllm.fast_path.plain_step`,
:func:`~spec_samplers.integrations.vllm.fast_path.verify_plain_step`). min_p and logit_bias on the
draft rows: min_p_logit_bias.py. vLLM issue #55005 on its CPU build: :func:`expand_batch_to_tokens`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from spec_samplers.constants import input_error
from spec_samplers.engine_seam import replace_engine_function
from spec_samplers.integrations.vllm.fast_path import plain_step, verify_plain_step
from spec_samplers.integrations.vllm.min_p_logit_bias import (  # noqa: F401 (their home before the move: still importable here)
    add_logit_bias_to_draft_rows,
    apply_logits_processors,
    apply_min_p_to_draft_rows,
)
from spec_samplers.integrations.vllm.ragged import (
    VERIFIER_ATTRIBUTE,
    RaggedVerifier,
    at_least_one_token,
    greedy_verify_ragged,
    seam_verifier,
    well_formed_requests,
)
from spec_samplers.rng import row_seeds


def make_rejection_sample(sampler: torch.nn.Module, vllm_rejection_sample: Callable[..., torch.Tensor]):
    """A drop-in for vLLM's ``rejection_sample`` (0.32 and 0.33 signatures: :func:`verify`'s
    after ``verifier``) that verifies with ``sampler``.

    vLLM's synthetic mode (a benchmarking mode that ignores the distributions) and, in 0.33, FLy
    (lossy deferred acceptance, ``fly_window_size``) stay vLLM's: such calls go to vLLM's function
    with the arguments as given. The engine config refuses both with our section, so these calls
    only come from code that bypasses it.
    """
    verifier = RaggedVerifier(sampler)
    replacement = replace_engine_function(sampler, verifier, verify, vllm_rejection_sample, _vllm_only)
    setattr(replacement, VERIFIER_ATTRIBUTE, verifier)
    return replacement


def _vllm_only(arguments: Mapping[str, Any]) -> bool:
    """vLLM's synthetic mode and FLy: calls that stay vLLM's."""
    return bool(arguments.get("synthetic_mode")) or arguments.get("fly_window_size") is not None


def verify(
    verifier: RaggedVerifier,
    draft_token_ids: torch.Tensor,  # [T]
    num_draft_tokens: list[int],  # [B]
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,  # [B]
    draft_probs: torch.Tensor | None,  # [T, V] or None
    target_logits: torch.Tensor,  # [T, V] fp32, temperature/top-k/top-p applied
    bonus_token_ids: torch.Tensor,  # [B, 1], sampled by vLLM
    sampling_metadata: Any,  # vllm.v1.sample.metadata.SamplingMetadata
    # vLLM's own modes, never set here (make_rejection_sample hands those calls to vLLM):
    synthetic_mode: bool = False,
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_fp64_gumbel: bool = False,
    fly_window_size: int | None = None,  # vLLM 0.33
    fly_entropy_threshold: float | None = None,  # vLLM 0.33
    fly_entropy_top_k: int = 3,  # vLLM 0.33
) -> torch.Tensor:
    """[B, K+1] int32: greedy rows by vLLM's rule, the others by the sampler.

    Our samplers get vLLM's processed logits as they are (``forward_ragged_from_logits`` at
    temperature 1, 0 for greedy requests: vLLM has already divided by each request's temperature
    and masked its top-k / top-p) and verify every request in one call, greedy ones by the argmax
    of the logits as vLLM does; no probability tensor is built. A sampler without that entry, or a
    step with draft probabilities (the drafts' law comes as probabilities), gets vLLM's fp32
    softmax, and vLLM's greedy verification replaces its greedy rows."""
    batch_size = len(num_draft_tokens)
    if cu_num_draft_tokens.dim() != 1 or cu_num_draft_tokens.shape[0] != batch_size:
        raise input_error(
            "cu_num_draft_tokens",
            f"shape ({batch_size},), one entry per num_draft_tokens entry",
            f"shape {tuple(cu_num_draft_tokens.shape)}",
        )
    device, vocab = target_logits.device, target_logits.shape[-1]
    bonus = bonus_token_ids.reshape(-1)  # [B]
    if sampling_metadata.all_greedy:
        greedy = greedy_verify_ragged(
            target_logits.argmax(dim=-1), draft_token_ids, bonus, cu_num_draft_tokens, max_spec_len, vocab
        )
        return greedy.to(torch.int32)
    is_greedy = None if sampling_metadata.all_random else sampling_metadata.temperature == 0  # [B]
    well_formed = well_formed_requests(cu_num_draft_tokens, max_spec_len, target_logits.shape[0])  # [B]
    # vLLM draws nothing from a request's generator in a step without drafts.
    generators = {i: g for i, g in sampling_metadata.generators.items() if num_draft_tokens[i] > 0}
    if draft_probs is None and verifier.has_logits_entry:
        ones = torch.ones(batch_size, dtype=torch.float32, device=device)
        temperature = ones if is_greedy is None else torch.where(is_greedy, 0.0, ones)
        out = verifier.from_logits(
            target_logits,
            bonus,
            None,
            draft_token_ids,
            cu_num_draft_tokens,
            max_spec_len,
            temperature=temperature,
            seeds=row_seeds(batch_size, device, generators),
        )
        return at_least_one_token(out, well_formed).to(torch.int32)
    seeds = row_seeds(batch_size, device, generators) if verifier.accepts("seeds") else None  # [B] int64
    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)  # [T, V]
    out = verifier(
        target_probs,
        bonus,
        draft_probs,
        draft_token_ids,
        cu_num_draft_tokens,
        max_spec_len,
        seeds=seeds,
        seeded_seqs=generators,
    )
    if is_greedy is not None:
        greedy = greedy_verify_ragged(
            target_logits.argmax(dim=-1), draft_token_ids, bonus, cu_num_draft_tokens, max_spec_len, vocab
        )
        out = torch.where(is_greedy[:, None], greedy, out)
    return at_least_one_token(out, well_formed).to(torch.int32)


# --- the fast path's wrap: plain steps (fast_path.py) ------------------------------------------


def forward(vllm_forward: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps V1's ``RejectionSampler.forward(metadata, draft_probs, logits, sampling_metadata)``.

    With our sampler installed at the seam (its ``rejection_sample`` carries the verifier) and a
    plain step (:func:`~spec_samplers.integrations.vllm.fast_path.plain_step`), the step is
    :func:`~spec_samplers.integrations.vllm.fast_path.verify_plain_step`: vLLM's glue (the
    gather of the target rows, their fp32 copy and clone, the division by temperature) and its
    bonus draw by its Sampler are skipped. Anything else is vLLM's forward, which calls our
    ``rejection_sample`` as before; without our section it is vLLM's forward, unchanged."""
    module_name = vllm_forward.__module__  # vllm.v1.sample.rejection_sampler: the seam's module

    @functools.wraps(vllm_forward)
    def _forward(self: Any, metadata: Any, draft_probs: Any, logits: torch.Tensor, sampling_metadata: Any) -> Any:
        verifier = seam_verifier(module_name)
        if verifier is None or not plain_step(self, verifier, metadata, draft_probs, logits, sampling_metadata):
            return vllm_forward(self, metadata, draft_probs, logits, sampling_metadata)
        from vllm.v1.outputs import SamplerOutput

        tokens = verify_plain_step(verifier, metadata, draft_probs, logits, sampling_metadata)
        return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=None)

    return _forward


# --- vLLM issue #55005: expand_batch_to_tokens on CPU ------------------------------------------


def expand_batch_to_tokens(vllm_expand: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wraps V1's ``expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from, replace_to)``,
    which ``RejectionSampler.forward`` (``apply_sampling_constraints``) uses to lay each request's
    temperature, top-k and top-p out per draft row before dividing the target logits.

    vLLM's CPU build returns uninitialised memory for float tensors there (vLLM issue #55005, fix
    PR #55006, both open for 0.32 and 0.33), so a batch that is not all greedy gets draft rows
    divided by garbage temperatures: wrong tokens with vLLM's own verification and, on steps that
    are not plain (top-k / top-p / min-p, penalties...), with ours. With our sampler installed at
    the seam this is :func:`expand_to_tokens` (torch ops, every device, no host sync); without it,
    vLLM's function, unchanged."""
    module_name = vllm_expand.__module__  # vllm.v1.sample.rejection_sampler: the seam's module

    @functools.wraps(vllm_expand)
    def _expand_batch_to_tokens(
        x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: Any = 0, replace_to: Any = 0
    ) -> torch.Tensor:
        if seam_verifier(module_name) is None:
            return vllm_expand(x, cu_num_tokens, num_tokens, replace_from, replace_to)
        return expand_to_tokens(x, cu_num_tokens, num_tokens, replace_from, replace_to)

    return _expand_batch_to_tokens


def expand_to_tokens(
    x: torch.Tensor,  # [B]
    cu_num_tokens: torch.Tensor,  # [B] inclusive cumulative sum of each request's rows
    num_tokens: int,
    replace_from: Any = 0,
    replace_to: Any = 0,
) -> torch.Tensor:
    """[num_tokens]: row t holds x of the request it belongs to, ``replace_to`` where that is
    ``replace_from`` (vLLM's ``expand_batch_to_tokens``; rows past the last request repeat it)."""
    if num_tokens == 0 or x.shape[0] == 0:
        return x.new_empty(num_tokens)
    rows = torch.arange(num_tokens, device=x.device)
    request = torch.searchsorted(cu_num_tokens.to(torch.int64), rows, right=True).clamp_(max=x.shape[0] - 1)
    out = x[request]
    return out.masked_fill_(out == replace_from, replace_to)
