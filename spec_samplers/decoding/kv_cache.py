"""KV caches whose requests may hold different numbers of tokens.

Layout: every layer stores [B, H, L, D] keys and values over L *slots*; a [B, L] bool mask on the
cache's device says which slots hold a token of the request. Cropping request b invalidates its
latest n_b tokens (a hole the attention mask hides) and trims the slots no request uses any more;
when holes waste a quarter of the slots (and at least ``compact_min_slots``), ``compact`` moves each
request's tokens to the right end (left padding) with one gather per layer. A token's position is
the number of valid slots before it, so holes and padding never shift positions.

:class:`SlotKVCache` holds this bookkeeping; subclasses provide the storage (:class:`TensorKVCache`:
plain tensors; ``spec_samplers.integrations.transformers.HFKVCache``: a transformers DynamicCache).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from spec_samplers.constants import input_error
from spec_samplers.decoding.interfaces import PAD_TOKEN_ID, KVState


class QueryLayout(NamedTuple):
    """What a model adapter passes to the model for one query (see :meth:`SlotKVCache.query_layout`)."""

    input_ids: torch.Tensor  # [B, Q] int64, padding slots replaced by token 0
    attention_mask: torch.Tensor  # [B, L + Q] int64, 1 = a token to attend to (cache slots, then query)
    position_ids: torch.Tensor  # [B, Q] int64, tokens before the slot (padding: ignored, never attended)
    valid: torch.Tensor  # [B, Q] bool, False on padding slots


def _per_request_counts(name: str, counts: int | Sequence[int] | torch.Tensor, batch_size: int) -> list[int]:
    if isinstance(counts, torch.Tensor):
        if counts.dim() != 1 or counts.shape[0] != batch_size or counts.is_floating_point():
            raise input_error(
                name, f"an int or {batch_size} integer counts", f"tensor {tuple(counts.shape)} {counts.dtype}"
            )
        return [int(c) for c in counts.tolist()]
    if isinstance(counts, int) and not isinstance(counts, bool):
        return [counts] * batch_size
    if isinstance(counts, Sequence) and all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
        if len(counts) != batch_size:
            raise input_error(name, f"an int or {batch_size} counts (one per request)", f"{len(counts)} counts")
        return list(counts)
    raise input_error(name, "an int, a sequence of ints or an integer tensor", type(counts).__name__)


class SlotKVCache:
    """Bookkeeping of a KV cache over slots with a validity mask (see the module docstring).

    Subclasses implement the ``_storage_*`` hooks and ``_num_slots``.
    """

    #: compact when at least this many slots (and a quarter of them) would be freed
    compact_min_slots: int = 16

    def __init__(self) -> None:
        self._valid: torch.Tensor | None = None  # [B, L] bool on the cache's device

    # ----------------------------------------------------------------- storage hooks
    def _num_slots(self) -> int:
        raise NotImplementedError

    def _storage_append(self, kv_states: Sequence[KVState]) -> None:
        raise NotImplementedError

    def _storage_trim(self, num_slots: int) -> None:
        """Drop the last ``num_slots`` (> 0) slots of every request."""
        raise NotImplementedError

    def _storage_gather(self, index: torch.Tensor) -> None:
        """index [B, L'] int64: slot j of request b becomes old slot index[b, j]."""
        raise NotImplementedError

    def _storage_select(self, indices: torch.Tensor) -> None:
        """Keep requests ``indices`` ([M] int64), in that order."""
        raise NotImplementedError

    def _storage_states(self) -> list[KVState]:
        raise NotImplementedError

    # ----------------------------------------------------------------- the seed's interface
    @property
    def batch_size(self) -> int | None:
        """Requests in the cache (None before the first query or update)."""
        return None if self._valid is None else self._valid.shape[0]

    def _check_states(self, kv_states: Sequence[KVState]) -> tuple[int, int]:
        if not isinstance(kv_states, Sequence) or len(kv_states) == 0:
            raise input_error("kv_states", "a non-empty sequence of KVState (one per layer)", type(kv_states).__name__)
        existing = self._storage_states()
        if existing and len(kv_states) != len(existing):
            raise input_error("kv_states", f"{len(existing)} KVStates (one per layer)", f"{len(kv_states)}")
        shape = None
        for i, state in enumerate(kv_states):
            keys, values = state
            if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor) or keys.dim() != 4:
                raise input_error(f"kv_states[{i}]", "keys and values tensors [B, H, T, D]", type(keys).__name__)
            if keys.shape != values.shape or (shape is not None and keys.shape != shape):
                raise input_error(
                    f"kv_states[{i}]",
                    f"keys and values of shape {shape or tuple(keys.shape)}",
                    f"{tuple(keys.shape)} and {tuple(values.shape)}",
                )
            shape = keys.shape
            if existing:
                old = existing[i].keys
                if (keys.shape[0], keys.shape[1], keys.shape[3]) != (old.shape[0], old.shape[1], old.shape[3]):
                    raise input_error(
                        f"kv_states[{i}]",
                        f"shape ({old.shape[0]}, {old.shape[1]}, T, {old.shape[3]})",
                        f"{tuple(keys.shape)}",
                    )
        assert shape is not None
        return shape[0], shape[2]

    def update(self, kv_states: Sequence[KVState], valid: torch.Tensor | None = None) -> None:
        """Append one KVState per layer (each [B, H, T, D]). ``valid`` [B, T] bool (extension)
        marks padding slots False."""
        batch_size, num_tokens = self._check_states(kv_states)
        device = kv_states[0].keys.device
        if valid is None:
            valid = torch.ones(batch_size, num_tokens, dtype=torch.bool, device=device)
        elif valid.shape != (batch_size, num_tokens):
            raise input_error("valid", f"shape ({batch_size}, {num_tokens})", f"{tuple(valid.shape)}")
        self._storage_append(kv_states)
        self._append_slots(valid.to(device=device, dtype=torch.bool))

    def crop(self, num_tokens_crop: int | Sequence[int] | torch.Tensor) -> None:
        """Remove the latest ``num_tokens_crop`` tokens of every request (an int) or of each
        request (one count per request). Each count must lie in [0, tokens of the request]."""
        if self._valid is None:  # empty: only zero counts are in bounds
            counts = [num_tokens_crop] if isinstance(num_tokens_crop, int) else list(num_tokens_crop)
            if any(c != 0 for c in counts):
                raise input_error("num_tokens_crop", "0 (the cache is empty)", repr(num_tokens_crop))
            return
        valid = self._valid
        B, L = valid.shape
        counts = _per_request_counts("num_tokens_crop", num_tokens_crop, B)
        if not any(counts):
            return
        crop = torch.tensor(counts, dtype=torch.int64, device=valid.device)
        # valid slots at or after each slot: the latest n_b valid slots have a count <= n_b
        after = valid.flip(1).to(torch.int64).cumsum(1).flip(1)
        cropped = valid & (after > crop[:, None])
        slot_end = torch.arange(1, L + 1, device=valid.device)
        end_t = (cropped.any(dim=0) * slot_end).amax() if L else torch.zeros((), dtype=torch.int64, device=valid.device)
        *have, end = torch.cat([valid.sum(dim=1), end_t[None]]).tolist()  # the one read-back
        bad = [b for b in range(B) if not 0 <= counts[b] <= have[b]]
        if bad:
            b = bad[0]
            name = "num_tokens_crop" if isinstance(num_tokens_crop, int) else f"num_tokens_crop[{b}]"
            raise input_error(name, f"an int in [0, {have[b]}] (tokens held by request {b})", counts[b])
        valid = cropped
        if end < L:
            self._storage_trim(L - end)
            valid = valid[:, :end]
        self._valid = valid
        remaining = max(h - c for h, c in zip(have, counts))
        freed = end - remaining
        if freed >= max(self.compact_min_slots, end // 4, 1):
            self.compact(remaining)

    def get_num_tokens(self) -> int:
        """Tokens stored; for a batch whose requests differ, the largest count."""
        per_request = self.get_num_tokens_per_request()
        return max(per_request) if per_request else 0

    def get_kv_states(self) -> list[KVState]:
        """Every layer's KVState [B, H, L, D] after :meth:`compact`; with requests of different
        lengths, request b's tokens are the last ones and :meth:`attention_mask` marks them."""
        if self._valid is not None:
            self.compact()
        return self._storage_states()

    # ----------------------------------------------------------------- extensions
    def get_num_tokens_per_request(self) -> list[int]:
        if self._valid is None:
            return []
        return [int(n) for n in self._valid.sum(dim=1).tolist()]

    def attention_mask(self) -> torch.Tensor | None:
        """[B, L] bool: which slots of :meth:`get_kv_states` hold tokens (None before any)."""
        return self._valid

    def batch_select_indices(self, indices: torch.Tensor | Sequence[int]) -> None:
        """Keep only requests ``indices`` (in that order)."""
        if self._valid is None:
            return
        index = torch.as_tensor(indices, dtype=torch.int64, device=self._valid.device)
        if index.dim() != 1:
            raise input_error("indices", "a 1-d sequence of request indices", f"shape {tuple(index.shape)}")
        self._storage_select(index)
        self._valid = self._valid[index]

    def compact(self, num_slots: int | None = None) -> None:
        """Move each request's tokens to the last slots (left padding) and drop unused slots.
        ``num_slots``: the largest request's token count if known (saves reading it back)."""
        valid = self._valid
        if valid is None:
            return
        B, L = valid.shape
        if B == 0 or bool(valid.all()):
            return
        if num_slots is None:
            num_slots = int(valid.sum(dim=1).max())
        # invalid slots first (key < L), then valid ones in order: the last num_slots are kept
        key = valid.to(torch.int64) * L + torch.arange(L, device=valid.device)
        index = key.argsort(dim=1)[:, L - num_slots :]  # [B, num_slots]
        self._storage_gather(index)
        self._valid = valid.gather(1, index)

    def query_layout(self, query_token_ids: torch.Tensor) -> QueryLayout:
        """Inputs of a forward over ``query_token_ids`` [B, Q] (-1 = padding): ids, attention mask
        over cache slots and query, positions. No host synchronisation."""
        if (
            not isinstance(query_token_ids, torch.Tensor)
            or query_token_ids.dim() != 2
            or query_token_ids.is_floating_point()
        ):
            actual = (
                f"{tuple(query_token_ids.shape)} {query_token_ids.dtype}"
                if isinstance(query_token_ids, torch.Tensor)
                else type(query_token_ids).__name__
            )
            raise input_error("query_token_ids", "an integer tensor [B, Q]", actual)
        B = query_token_ids.shape[0]
        device = query_token_ids.device
        if self._valid is None:
            self._valid = torch.zeros(B, 0, dtype=torch.bool, device=device)
        if self._valid.shape[0] != B:
            raise input_error("query_token_ids", f"{self._valid.shape[0]} requests (the cache's batch)", f"{B}")
        if self._valid.shape[1] != self._num_slots():
            raise RuntimeError(f"KV cache holds {self._num_slots()} slots but its mask {self._valid.shape[1]}")
        valid_query = query_token_ids != PAD_TOKEN_ID
        before = self._valid.sum(dim=1, keepdim=True)  # [B, 1]
        positions = (before + valid_query.to(torch.int64).cumsum(dim=1) - 1).clamp(min=0)
        return QueryLayout(
            input_ids=torch.where(valid_query, query_token_ids, torch.zeros_like(query_token_ids)).to(torch.int64),
            attention_mask=torch.cat([self._valid, valid_query], dim=1).to(torch.int64),
            position_ids=positions,
            valid=valid_query,
        )

    def keep_query_slots(self, keep: torch.Tensor) -> None:
        """(extension, tree decoding) ``keep`` [B, Q] bool over the last Q slots (the last query):
        the slots marked False stop holding tokens, as crop's holes (a draft tree's rejected
        branches). Positions stay right: a token's position is the valid slots before it."""
        if self._valid is None or keep.shape[1] == 0:
            return
        Q = keep.shape[1]
        self._valid = torch.cat([self._valid[:, :-Q], self._valid[:, -Q:] & keep.to(self._valid.device)], dim=1)
        self._tidy()

    def _tidy(self) -> None:
        """Trim trailing slots no request uses and compact when holes waste a quarter of the
        slots (one read-back)."""
        valid = self._valid
        assert valid is not None
        B, L = valid.shape
        if B == 0 or L == 0:
            return
        slot_end = torch.arange(1, L + 1, device=valid.device)
        end_t = (valid.any(dim=0) * slot_end).amax()
        end, remaining = torch.stack([end_t, valid.sum(dim=1).amax()]).tolist()
        if end < L:
            self._storage_trim(L - end)
            self._valid = valid[:, :end]
        if end - remaining >= max(self.compact_min_slots, end // 4, 1):
            self.compact(remaining)

    def append_query_slots(self, layout: QueryLayout) -> None:
        """Record the query's slots after the model appended their keys and values."""
        self._append_slots(layout.valid)

    def _append_slots(self, valid: torch.Tensor) -> None:
        if self._valid is None:
            self._valid = valid.clone()
            return
        if valid.shape[0] != self._valid.shape[0]:
            raise input_error("kv_states", f"batch size {self._valid.shape[0]}", valid.shape[0])
        self._valid = torch.cat([self._valid, valid.to(self._valid.device)], dim=1)


class TensorKVCache(SlotKVCache):
    """A :class:`SlotKVCache` over plain tensors: the seed's KVCache for models written in PyTorch
    (call :meth:`update` with each forward's new keys and values).

    Example::

        >>> cache = TensorKVCache()
        >>> kv = KVState(torch.zeros(2, 4, 5, 8), torch.zeros(2, 4, 5, 8))   # [B, H, T, D]
        >>> cache.update([kv, kv])                                          # two layers
        >>> cache.crop([1, 3]); cache.get_num_tokens_per_request()
        [4, 2]
    """

    def __init__(self) -> None:
        super().__init__()
        self._layers: list[KVState] = []

    def _num_slots(self) -> int:
        return self._layers[0].keys.shape[2] if self._layers else 0

    def _storage_append(self, kv_states: Sequence[KVState]) -> None:
        if not self._layers:
            self._layers = [KVState(k, v) for k, v in kv_states]
        else:
            self._layers = [
                KVState(torch.cat([o.keys, n[0]], 2), torch.cat([o.values, n[1]], 2))
                for o, n in zip(self._layers, kv_states)
            ]

    def _storage_trim(self, num_slots: int) -> None:
        self._layers = [KVState(k[:, :, :-num_slots], v[:, :, :-num_slots]) for k, v in self._layers]

    def _storage_gather(self, index: torch.Tensor) -> None:
        self._layers = [KVState(_gather_slots(k, index), _gather_slots(v, index)) for k, v in self._layers]

    def _storage_select(self, indices: torch.Tensor) -> None:
        self._layers = [KVState(k[indices], v[indices]) for k, v in self._layers]

    def _storage_states(self) -> list[KVState]:
        return list(self._layers)


def _gather_slots(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, H, L, D], index [B, L'] -> [B, H, L', D] with slot j of row b = x[b, :, index[b, j]]."""
    B, H, _, D = x.shape
    return x.gather(2, index.to(x.device)[:, None, :, None].expand(B, H, index.shape[1], D))
