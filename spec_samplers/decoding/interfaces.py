"""naive_speculate's inference interfaces (seed 003), with its names, shapes and semantics.

Batched use goes beyond the seed, which runs one sequence at a time: requests in one batch hold
different numbers of tokens once they accept different numbers of drafts. The extensions, all
optional for code that follows the seed alone, are:

* ``query_token_ids`` may hold -1 (:data:`PAD_TOKEN_ID`): a padding slot that is neither attended
  to nor given a position, and whose logits are meaningless (left-padded prompts);
* ``KVCache.crop`` takes one count per request as well as one int for all;
* ``KVCache.get_num_tokens_per_request`` and ``KVCache.batch_select_indices`` (the name of
  transformers' method: keep only some requests, e.g. the unfinished ones);
* ``LanguageModel.new_kv_cache()`` makes an empty cache of the kind the model writes, and
  ``LanguageModel.eos_token_ids`` lists every stop token when the configuration has several;
* ``LanguageModel.forward_last(query_token_ids, kv_cache)`` returns the last position's logits
  [B, V] only (the decoding loops use it where they read no other position: prefills, draft
  steps; ``decoding.rounds.last_logits`` falls back to ``forward(...)[:, -1]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import torch

#: a padding slot in ``query_token_ids``
PAD_TOKEN_ID = -1


class KVState(NamedTuple):
    """Keys and values of one transformer layer, each [batch_size, num_attention_heads, num_tokens,
    head_dim]."""

    keys: torch.Tensor  # [B, H, T, D]
    values: torch.Tensor  # [B, H, T, D]


class PrefillOutput(NamedTuple):
    """Output of :meth:`Inferencer.prefill`."""

    token_ids: torch.Tensor  # [B, 1] int64: the token generated after the query
    token_logits: torch.Tensor  # [B, num_query_tokens, V]: logits at every query position


class DecodeOutput(NamedTuple):
    """Output of :meth:`Inferencer.decode`."""

    token_ids: torch.Tensor  # [B, num_generated_tokens] int64 (-1 after a request's EOS)
    token_logits: torch.Tensor  # [B, num_generated_tokens, V]: the logits each token was sampled from


@runtime_checkable
class KVCache(Protocol):
    """Stores layerwise key and value tensors, which an :class:`Inferencer` uses during inference."""

    def update(self, kv_states: Sequence[KVState]) -> None:
        """Append new keys and values: one KVState per transformer layer, all of the same shape.

        Raises ValueError when the number of layers or the shapes do not match."""
        ...

    def crop(self, num_tokens_crop: int | Sequence[int] | torch.Tensor) -> None:
        """Remove the latest ``num_tokens_crop`` tokens: an int for every request or (extension)
        one count per request. Each count must be >= 0 and at most the request's tokens, else
        ValueError."""
        ...

    def get_num_tokens(self) -> int:
        """Number of tokens stored (for a batch whose requests differ: the largest)."""
        ...

    def get_kv_states(self) -> list[KVState]:
        """The stored KVState of every layer; an empty list before the first update."""
        ...

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """(extension) Keep only requests ``indices`` [M] int64, in that order."""
        ...


class LanguageModel(Protocol):
    """Runs the forward computation of a model on query token ids and a KV cache.

    Not ``runtime_checkable``: before Python 3.12, ``isinstance`` reads every member, and
    ``eos_token_id`` raises ValueError on models without an EOS token, as the seed says.
    """

    @property
    def eos_token_id(self) -> int:
        """Id of the end-of-sequence token in the model's configuration.

        Raises ValueError if the configuration has none."""
        ...

    def forward(self, query_token_ids: torch.Tensor, kv_cache: KVCache) -> torch.Tensor:
        """Logits [B, Q, V] at every query position (position i scores the token at i + 1) for
        ``query_token_ids`` [B, Q]; ``kv_cache`` holds every earlier token and receives the query's
        keys and values."""
        ...

    def new_kv_cache(self) -> KVCache:
        """(extension) An empty KV cache this model can write."""
        ...


class SampleStrategyLike(Protocol):
    """What an :class:`Inferencer` needs from a sampling strategy (see ``SampleStrategy``)."""

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, V] -> token ids [B] int64."""
        ...


@runtime_checkable
class Inferencer(Protocol):
    """Processes token sequences and generates new tokens with a sampling strategy, updating the
    KV cache it is given."""

    def prefill(
        self, query_token_ids: torch.Tensor, kv_cache: KVCache, sample_strategy: SampleStrategyLike
    ) -> PrefillOutput:
        """Process ``query_token_ids`` [B, Q] in parallel and sample the next token of each request."""
        ...

    def decode(
        self, query_token_ids: torch.Tensor, kv_cache: KVCache, max_new_tokens: int, sample_strategy: SampleStrategyLike
    ) -> DecodeOutput:
        """From ``query_token_ids`` [B, 1] (the tokens since the last call), generate up to
        ``max_new_tokens`` tokens autoregressively, stopping early once every request has
        generated an EOS token."""
        ...
