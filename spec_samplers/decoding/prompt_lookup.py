"""Prompt-lookup (n-gram) drafting: a draft :class:`LanguageModel` without weights.

``PromptLookupDrafter`` proposes the token that followed the first earlier occurrence of the
sequence's last n tokens (n from ``max_ngram_size`` down to 1), in the prompt or in what was
generated since, as transformers' ``prompt_lookup_num_tokens`` does; with no match it proposes the
last token again. Its logits are 0 at that token and -inf elsewhere, so the draft distribution the
sampler sees is the one-hot of the proposal, which is what a deterministic drafter draws from:
verification stays exact for every lossless sampler.

Its cache stores token ids in a :class:`TensorKVCache` (one "layer" of [B, 1, T, 1] ids), so the
decoding loop crops and selects requests as it does for a model's cache.
"""

from __future__ import annotations

import torch

from spec_samplers.constants import input_error
from spec_samplers.decoding.interfaces import KVCache, KVState
from spec_samplers.decoding.kv_cache import TensorKVCache


def lookup_next(history: list[int], max_ngram_size: int) -> int:
    """The token after the first occurrence (as transformers' prompt lookup) of ``history``'s last
    n tokens before the end, for the largest n <= ``max_ngram_size`` that occurs; the last token
    when none does."""
    for n in range(min(max_ngram_size, len(history) - 1), 0, -1):
        tail = history[-n:]
        for start in range(len(history) - n):  # a following token exists: the tail itself is excluded
            if history[start : start + n] == tail:
                return history[start + n]
    return history[-1]


class PromptLookupDrafter:
    """A draft model that proposes n-gram continuations (module docstring).

    Args:
        vocab_size: the target's vocabulary size (the width of the logits).
        max_ngram_size: the longest n-gram matched (transformers' ``max_matching_ngram_size``).
        device: where the logits are made (the target's device).

    Only the last query position's logits are computed (what the chain loop reads; earlier
    positions are uniform). Trees need a drafter that scores siblings (``forward_tree``): none here.
    """

    def __init__(self, vocab_size: int, max_ngram_size: int = 2, device: torch.device | str = "cpu") -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise input_error("vocab_size", "an int >= 1", repr(vocab_size))
        if isinstance(max_ngram_size, bool) or not isinstance(max_ngram_size, int) or max_ngram_size < 1:
            raise input_error("max_ngram_size", "an int >= 1", repr(max_ngram_size))
        self.vocab_size = vocab_size
        self.max_ngram_size = max_ngram_size
        self.device = torch.device(device)

    @property
    def eos_token_id(self) -> int:
        raise ValueError("PromptLookupDrafter has no EOS token (the target's ends requests)")

    def new_kv_cache(self) -> TensorKVCache:
        return TensorKVCache()

    def forward(self, query_token_ids: torch.Tensor, kv_cache: KVCache) -> torch.Tensor:
        """logits [B, Q, V]: at the last position, 0 at each request's proposal and -inf elsewhere."""
        if not isinstance(kv_cache, TensorKVCache):
            raise input_error(
                "kv_cache", "a TensorKVCache (PromptLookupDrafter.new_kv_cache())", type(kv_cache).__name__
            )
        layout = kv_cache.query_layout(query_token_ids)
        ids = layout.input_ids[:, None, :, None]
        kv_cache.update([KVState(ids, ids)], valid=layout.valid)
        valid = kv_cache.attention_mask()
        assert valid is not None
        stored = kv_cache._storage_states()[0].keys[:, 0, :, 0]  # [B, L]
        # host lists: the matching is Python work on the token history, once per drafted token
        proposals = [
            lookup_next(row[mask].tolist(), self.max_ngram_size) if bool(mask.any()) else 0
            for row, mask in zip(stored.cpu(), valid.cpu())
        ]
        B, Q = query_token_ids.shape
        logits = torch.zeros(B, Q, self.vocab_size, device=self.device)
        logits[:, -1] = float("-inf")
        logits[torch.arange(B, device=self.device), -1, torch.tensor(proposals, device=self.device)] = 0.0
        return logits
