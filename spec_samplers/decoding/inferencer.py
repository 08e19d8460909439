"""Plain autoregressive inference: the seed's ``Inferencer`` over a :class:`LanguageModel`, and the
baseline that speculative decoding is measured against."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spec_samplers.constants import input_error
from spec_samplers.decoding.interfaces import (
    PAD_TOKEN_ID,
    DecodeOutput,
    KVCache,
    LanguageModel,
    PrefillOutput,
    SampleStrategyLike,
)
from spec_samplers.decoding.output import (
    GenerationOutput,
    RequestStats,
    left_pad,
    model_device,
    start_generation,
    stop_token_ids,
)
from spec_samplers.decoding.strategy import SampleStrategy, request_seeds
from spec_samplers.sampling_params import SamplingParams


class AutoregressiveInferencer:
    """The seed's :class:`Inferencer`: one model, one token per forward pass.

    Example::

        >>> inferencer = AutoregressiveInferencer(model)
        >>> cache = model.new_kv_cache()
        >>> strategy = SampleStrategy(SamplingParams(temperature=0), batch_size=1)
        >>> first = inferencer.prefill(prompt_ids, cache, strategy)            # token_ids [1, 1]
        >>> rest = inferencer.decode(first.token_ids, cache, 15, strategy)    # token_ids [1, <=15]
    """

    def __init__(self, model: LanguageModel) -> None:
        self.model = model

    @torch.no_grad()
    def prefill(
        self, query_token_ids: torch.Tensor, kv_cache: KVCache, sample_strategy: SampleStrategyLike
    ) -> PrefillOutput:
        """Logits at every query position [B, Q, V] and the next token [B, 1] of each request."""
        logits = self.model.forward(query_token_ids, kv_cache)
        return PrefillOutput(token_ids=sample_strategy.sample(logits[:, -1])[:, None], token_logits=logits)

    @torch.no_grad()
    def decode(
        self, query_token_ids: torch.Tensor, kv_cache: KVCache, max_new_tokens: int, sample_strategy: SampleStrategyLike
    ) -> DecodeOutput:
        """Up to ``max_new_tokens`` tokens after ``query_token_ids`` [B, 1]: token_ids [B, N]
        (-1 after a request's EOS) and the logits [B, N, V] they were sampled from. Stops when
        every request has generated an EOS (reads one flag back per step, as transformers does)."""
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise input_error("max_new_tokens", "an int >= 1", repr(max_new_tokens))
        if query_token_ids.dim() != 2 or query_token_ids.shape[1] != 1:
            raise input_error(
                "query_token_ids", "shape [B, 1] (the tokens since the last call)", tuple(query_token_ids.shape)
            )
        eos = torch.tensor(stop_token_ids(self.model), dtype=torch.int64, device=query_token_ids.device)
        done = torch.zeros(query_token_ids.shape[0], dtype=torch.bool, device=query_token_ids.device)
        tokens, logits_seen = [], []
        query = query_token_ids
        for _ in range(max_new_tokens):
            logits = self.model.forward(query, kv_cache)[:, -1]  # [B, V]
            token = torch.where(done, PAD_TOKEN_ID, sample_strategy.sample(logits))
            tokens.append(token)
            logits_seen.append(logits)
            if eos.numel():
                done = done | torch.isin(token, eos)
                if bool(done.all()):
                    break
            query = token[:, None]  # finished requests feed padding, which the cache skips
        return DecodeOutput(token_ids=torch.stack(tokens, dim=1), token_logits=torch.stack(logits_seen, dim=1))


@torch.no_grad()
def generate_autoregressive(
    model: LanguageModel,
    prompt_ids: torch.Tensor | Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    seed: int | None = None,
) -> GenerationOutput:
    """Plain sampling with one model, in :class:`GenerationOutput` form (token_ids
    [B, <= max_new_tokens], -1 after EOS; statistics count forward passes, no drafts)."""
    start = start_generation(model, prompt_ids, max_new_tokens, sampling_params)
    prompts, params, buffer, B = start.prompts, start.params, start.buffer, start.batch_size
    if B and max_new_tokens:
        device = model_device(model)
        strategy = SampleStrategy(params, B, seeds=request_seeds(params, seed), device=device)
        inferencer = AutoregressiveInferencer(model)
        cache = model.new_kv_cache()
        first = inferencer.prefill(left_pad(prompts, max(len(p) for p in prompts), device), cache, strategy)
        generated = first.token_ids
        if max_new_tokens > 1:
            rest = inferencer.decode(first.token_ids, cache, max_new_tokens - 1, strategy)
            generated = torch.cat([generated, rest.token_ids], dim=1)
        generated = generated.cpu()
        buffer.append(torch.arange(B), generated, (generated != PAD_TOKEN_ID).sum(dim=1))
    stats = []
    for b in range(B):
        n = int(buffer.num_tokens[b])
        # one pass per token (a request's later passes only feed padding)
        stats.append(
            RequestStats(num_generated=n, target_forward_passes=n, finished_by_eos=bool(buffer.finished_by_eos[b]))
        )
    return GenerationOutput(token_ids=buffer.token_ids, stats=stats)
