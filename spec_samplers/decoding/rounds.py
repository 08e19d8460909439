"""What the chain and tree decoding loops share within a round: fitting the draft's vocabulary to
the target's, the draft's view of committed tokens, and the per-request counters."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spec_samplers.decoding.interfaces import KVCache, LanguageModel
from spec_samplers.decoding.output import (
    GenerationOutput,
    GenerationStart,
    RequestStats,
    RoundObserver,
    TokenBuffer,
    model_device,
    start_generation,
)
from spec_samplers.decoding.strategy import SampleStrategy, request_seeds
from spec_samplers.sampling_params import SamplingParams


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """logits [..., V'] -> [..., vocab_size]: truncated, or padded with -inf (tokens the model
    cannot propose). Draft and target vocabularies of one tokenizer often differ by padding."""
    V = logits.shape[-1]
    if V == vocab_size:
        return logits
    if V > vocab_size:
        return logits[..., :vocab_size]
    return torch.nn.functional.pad(logits, (0, vocab_size - V), value=float("-inf"))


def for_draft(query: torch.Tensor, draft_vocab: int | None) -> torch.Tensor:
    """Target tokens outside the draft's vocabulary read as token 0: the draft's context may be
    anything, only its proposals must follow the distribution given to the sampler."""
    if draft_vocab is None:
        return query
    return torch.where(query >= draft_vocab, torch.zeros_like(query), query)


def last_logits(model: LanguageModel, query: torch.Tensor, kv_cache: KVCache) -> torch.Tensor:
    """logits [B, V] of ``query``'s last position (the cache receives every query slot): through
    the model's ``forward_last`` where it has one (extension: ``HFLanguageModel`` then runs its LM
    head on that position alone), else ``forward(...)[:, -1]``."""
    forward_last = getattr(model, "forward_last", None)
    if forward_last is not None:
        return forward_last(query, kv_cache)
    return model.forward(query, kv_cache)[:, -1]


class RoundCounters:
    """Per-request counters on the host ([B] tensors indexed by original request)."""

    def __init__(self, batch_size: int, k: int) -> None:
        self.k = k
        self.drafted = torch.zeros(batch_size, dtype=torch.int64)
        self.accepted = torch.zeros(batch_size, dtype=torch.int64)
        self.per_position = torch.zeros(batch_size, k, dtype=torch.int64)
        self.rounds = torch.zeros(batch_size, dtype=torch.int64)
        self.target_passes = torch.zeros(batch_size, dtype=torch.int64)
        self.draft_passes = torch.zeros(batch_size, dtype=torch.int64)
        self.verified = torch.zeros(batch_size, dtype=torch.int64)
        self.expected = torch.zeros(batch_size, dtype=torch.float64)

    def round(
        self, rows: torch.Tensor, num_accepted: torch.Tensor, overlap: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> None:
        """num_accepted [n] int64, overlap [n, K] float64 (sum_x min(p', q') per position; K <= k
        the round's draft passes), lengths [n] int64 each request's own drafts (None: K)."""
        K = overlap.shape[1]
        position = torch.arange(K)[None, :]
        reached = position <= num_accepted[:, None]  # drafts the sampler had to judge: all before were accepted
        if lengths is not None:
            reached &= position < lengths[:, None]
        self.drafted[rows] += K if lengths is None else lengths
        self.accepted[rows] += num_accepted
        self.verified[rows] += reached.sum(dim=1)
        self.expected[rows] += (overlap * reached).sum(dim=1)
        self.per_position[rows, :K] += (position < num_accepted[:, None]).to(torch.int64)
        self.rounds[rows] += 1
        self.target_passes[rows] += 1
        self.draft_passes[rows] += K

    def output(self, buffer: TokenBuffer) -> GenerationOutput:
        stats = [
            RequestStats(
                num_generated=int(buffer.num_tokens[b]),
                num_drafted=int(self.drafted[b]),
                num_accepted=int(self.accepted[b]),
                accepted_per_position=self.per_position[b].tolist(),
                num_verified=int(self.verified[b]),
                num_rounds=int(self.rounds[b]),
                target_forward_passes=int(self.target_passes[b]),
                draft_forward_passes=int(self.draft_passes[b]),
                expected_accepted=float(self.expected[b]),
                finished_by_eos=bool(buffer.finished_by_eos[b]),
            )
            for b in range(self.drafted.shape[0])
        ]
        return GenerationOutput(token_ids=buffer.token_ids, stats=stats)


def begin_rounds(
    target: LanguageModel,
    prompt_ids: torch.Tensor | Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    seed: int | None,
    positions: int,
    observer: RoundObserver | None = None,
) -> tuple[GenerationStart, RoundCounters, SampleStrategy | None]:
    """What a decoding loop (chain or tree) sets up before its first round: the checked requests,
    the counters (``positions`` per round: k, or the tree's depth) and the sampling strategy on
    the target's device; the strategy is None when there is nothing to generate. ``observer`` sees
    each round's tokens (:class:`~spec_samplers.decoding.output.RoundObserver`)."""
    start = start_generation(target, prompt_ids, max_new_tokens, sampling_params, observer)
    stats = RoundCounters(start.batch_size, positions)
    if start.batch_size == 0 or max_new_tokens == 0:
        return start, stats, None
    seeds = request_seeds(start.params, seed)
    return start, stats, SampleStrategy(start.params, start.batch_size, seeds=seeds, device=model_device(target))
