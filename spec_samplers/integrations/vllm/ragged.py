"""Ragged verification: B requests with k_b drafts each, flattened to T = sum_b k_b rows.

vLLM's layout (both runners): draft rows of all requests back to back, ``cu_num_draft_tokens``
the inclusive cumulative sum of k_b, output [B, K+1] (K = max k_b) with -1 after each row's
emitted tokens.

Strategy for calling a sampler:

- a sampler with ``forward_ragged(target_probs, bonus_token_ids, draft_probs, draft_token_ids,
  cu_num_draft_tokens, max_spec_len, *, seeds=, offsets=, is_greedy=)`` gets the ragged inputs
  as they are (the keywords it does not declare are left out);
- any other sampler (vLLM V0's padded ``forward``, e.g. a third-party one) gets the inputs padded
  to [B, K+1, V] / [B, K, V] / [B, K]. Position k_b of a short row is made a certain rejection
  whose recovery is the bonus token: target row one-hot at the bonus token, draft token another
  id, draft row uniform (so p(x) > 0 = q(x), and the residual (q - p)+ is proportional to the
  one-hot). Positions after k_b are filled the same way and never reached. All padding is valid
  ids and valid distributions, so strict-mode samplers accept it.

Both runners' lean paths verify the engine's logits where the engine wrote them, bonus rows
included: :mod:`spec_samplers.integrations.vllm.fast_path`.

Everything is vectorised over the batch: no host synchronisation, no loop over rows.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from spec_samplers.constants import input_error
from spec_samplers.engine_seam import bind
from spec_samplers.layout import ragged_layout
from spec_samplers.output import PLACEHOLDER_TOKEN_ID, build_output, num_leading_accepted


def ragged_positions(
    cu_num_draft_tokens: torch.Tensor,  # [B] int32/int64, inclusive cumulative sum of k_b
    max_spec_len: int,
    num_tokens: int,  # T, the flat rows: a request reaching past them is malformed
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(index [B, K] int64 into the T flat rows, 0 where not ``valid``; valid [B, K] bool;
    num_draft_tokens [B] int64, -1 for a malformed request (:func:`spec_samplers.layout.request_spans`),
    which has no valid position and must emit no token)."""
    _, draft_rows, num_draft = ragged_layout(cu_num_draft_tokens, max_spec_len, num_tokens)
    return draft_rows.clamp(min=0), draft_rows >= 0, num_draft


def pad_ragged(
    x: torch.Tensor,  # [T, ...]
    index: torch.Tensor,  # [B, K] int64
    valid: torch.Tensor,  # [B, K] bool
    fill: torch.Tensor | float | int,  # broadcastable to [B, K, ...]
) -> torch.Tensor:
    """[B, K, ...]: x's rows where ``valid``, ``fill`` elsewhere."""
    B, K = index.shape
    if x.shape[0] == 0:
        out = torch.empty((B, K, *x.shape[1:]), dtype=x.dtype, device=x.device)
        out[...] = fill
        return out
    gathered = x[index.reshape(-1)].reshape(B, K, *x.shape[1:])
    mask = valid.reshape(B, K, *([1] * (x.dim() - 1)))
    fill_t = torch.as_tensor(fill, dtype=x.dtype, device=x.device)
    return torch.where(mask, gathered, fill_t)


def greedy_verify_ragged(
    target_argmax: torch.Tensor,  # [T] int: argmax of the target at each draft row
    draft_token_ids: torch.Tensor,  # [T] int32/int64
    bonus_token_ids: torch.Tensor,  # [B] int32/int64
    cu_num_draft_tokens: torch.Tensor,  # [B]
    max_spec_len: int,
    vocab_size: int,  # V: a bonus id outside [0, V) is no token
) -> torch.Tensor:
    """vLLM's greedy verification: accept x_i iff x_i == argmax q_i; emit argmax q_j at the first
    rejection, the bonus token after k_b acceptances. Returns [B, K+1] int64, -1 padded. As the
    samplers' ragged entries (docs/contract.md, "Robustness"): a malformed request emits nothing,
    and an out-of-range bonus id is not emitted."""
    num_tokens = min(target_argmax.shape[0], draft_token_ids.shape[0])
    index, valid, num_draft = ragged_positions(cu_num_draft_tokens, max_spec_len, num_tokens)
    drafts = pad_ragged(draft_token_ids.to(torch.int64), index, valid, -1)  # [B, K]
    argmax = pad_ragged(target_argmax.to(torch.int64), index, valid, 0)  # [B, K]
    accepted = valid & (drafts == argmax)
    n = num_leading_accepted(accepted)  # [B]
    bonus = bonus_token_ids.to(torch.int64)
    bonus = torch.where((num_draft >= 0) & (bonus >= 0) & (bonus < vocab_size), bonus, PLACEHOLDER_TOKEN_ID)
    if max_spec_len == 0:
        return build_output(drafts, n, bonus)
    recovered = argmax.gather(1, n.clamp(max=max_spec_len - 1)[:, None]).squeeze(1)  # [B]
    final = torch.where(n < num_draft, recovered, bonus)
    return build_output(drafts, n, final)


class RaggedVerifier:
    """Calls one sampler on ragged inputs, by its ragged method or through padding. What it
    calls is read once (:func:`spec_samplers.engine_seam.bind`): the runners call it every step."""

    def __init__(self, sampler: torch.nn.Module):
        self.sampler = sampler
        self.bound = bind(sampler)
        ragged = self.bound.entry("forward_ragged")
        self.uses_ragged_method = ragged is not None
        self._entry_name = "forward_ragged" if ragged is not None else "forward"
        self._logits_entry = self.bound.entry("forward_ragged_from_logits")
        #: Model Runner V2's chunks: shape key -> ChunkPlan (integrations.vllm.fast_path.chunk_plan)
        self.chunk_plans: dict[tuple[Any, ...], Any] = {}

    @property
    def has_logits_entry(self) -> bool:
        """Whether the sampler verifies ragged logits itself (``forward_ragged_from_logits``,
        greedy requests at temperature 0 included): one call, no probability tensor."""
        return self._logits_entry is not None

    def from_logits(
        self,
        target_logits: torch.Tensor,  # [T, V] fp32/fp16/bf16, row t scores draft token t
        bonus_token_ids: torch.Tensor,  # [B] int32/int64
        draft_logits: torch.Tensor | None,  # [T, V] or None for point-mass drafts
        draft_token_ids: torch.Tensor,  # [T] int32/int64
        cu_num_draft_tokens: torch.Tensor,  # [B] inclusive cumulative sum of k_b
        max_spec_len: int,
        *,
        temperature: torch.Tensor,  # [B] float, 0 = greedy request
        seeds: torch.Tensor | None = None,  # [B] int64
        offsets: torch.Tensor | None = None,  # [B] int64
        **draft_rows: torch.Tensor,  # draft_rows [T], draft_temperature [B]: passed only when given
    ) -> torch.Tensor:
        """Returns [B, K+1] int64, -1 padded (requires :attr:`has_logits_entry`). ``draft_rows``
        / ``draft_temperature`` (the entry's indexed draft rows, ``draft_logits`` then an [N, V]
        matrix) go to samplers that take them (``takes_draft_rows``)."""
        fn = self._logits_entry
        if fn is None:
            raise input_error(
                "sampler",
                "a sampler with forward_ragged_from_logits (see RaggedVerifier.has_logits_entry)",
                type(self.sampler).__name__,
            )
        extra = self.bound.randomness_for("forward_ragged_from_logits", seeds=seeds, offsets=offsets)
        return fn(
            target_logits,
            bonus_token_ids,
            draft_logits,
            draft_token_ids,
            cu_num_draft_tokens,
            max_spec_len,
            temperature=temperature,
            **extra,
            **draft_rows,
        )

    def accepts(self, keyword: str) -> bool:
        """Whether the sampler's entry point takes ``keyword`` (seeds, offsets, is_greedy, seeded_seqs)."""
        return self.bound.accepts(self._entry_name, keyword)

    def __call__(
        self,
        target_probs: torch.Tensor,  # [T, V] fp32/fp16/bf16: row t scores draft token t
        bonus_token_ids: torch.Tensor,  # [B] int32/int64
        draft_probs: torch.Tensor | None,  # [T, V], or None for point-mass drafts
        draft_token_ids: torch.Tensor,  # [T] int32/int64
        cu_num_draft_tokens: torch.Tensor,  # [B] inclusive cumulative sum of k_b
        max_spec_len: int,
        *,
        seeds: torch.Tensor | None = None,  # [B] int64
        offsets: torch.Tensor | None = None,  # [B] int64
        is_greedy: torch.Tensor | None = None,  # [B] bool
        seeded_seqs: dict[int, torch.Generator] | None = None,  # row -> generator (V0 samplers)
    ) -> torch.Tensor:
        """Returns [B, K+1] int64, -1 padded."""
        # seeds already drawn from the generators must not be drawn twice
        generators = seeded_seqs if seeds is None else None
        randomness = dict(seeds=seeds, offsets=offsets, is_greedy=is_greedy, seeded_seqs=generators)
        kwargs = self.bound.randomness_for(self._entry_name, **randomness)
        if self.uses_ragged_method:
            return self.bound.entries["forward_ragged"](
                target_probs,
                bonus_token_ids,
                draft_probs,
                draft_token_ids,
                cu_num_draft_tokens,
                max_spec_len,
                **kwargs,
            )
        return self._padded_forward(
            target_probs, bonus_token_ids, draft_probs, draft_token_ids, cu_num_draft_tokens, max_spec_len, kwargs
        )

    def _padded_forward(
        self,
        target_probs: torch.Tensor,  # [T, V]
        bonus_token_ids: torch.Tensor,  # [B]
        draft_probs: torch.Tensor | None,  # [T, V] or None
        draft_token_ids: torch.Tensor,  # [T]
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,
        kwargs: dict[str, object],
    ) -> torch.Tensor:
        V = target_probs.shape[1]
        K = max_spec_len
        index, valid, num_draft = ragged_positions(cu_num_draft_tokens, K, target_probs.shape[0])
        bonus = bonus_token_ids.to(torch.int64).clamp(0, V - 1)  # [B]
        one_hot = torch.nn.functional.one_hot(bonus, V).to(target_probs.dtype)  # [B, V]
        valid_ext = torch.nn.functional.pad(valid, (0, 1), value=False)  # [B, K+1]: row K is the bonus row
        index_ext = torch.nn.functional.pad(index, (0, 1), value=0)
        target = pad_ragged(target_probs, index_ext, valid_ext, 0)  # [B, K+1, V]
        target = torch.where(valid_ext[:, :, None], target, one_hot[:, None, :])
        # A certain rejection at the padding: any id but the bonus token.
        reject_id = (bonus + 1) % V if V > 1 else bonus
        drafts = torch.where(valid, pad_ragged(draft_token_ids.to(torch.int64), index, valid, 0), reject_id[:, None])
        drafts = drafts.to(draft_token_ids.dtype)  # [B, K]
        padded_draft_probs = None
        if draft_probs is not None:
            padded_draft_probs = pad_ragged(draft_probs, index, valid, 1.0 / V)  # [B, K, V]
        out = self.sampler(target, bonus_token_ids.reshape(-1, 1), padded_draft_probs, drafts, **kwargs)
        # a malformed request (num_draft -1) was padded to a certain rejection; it emits nothing
        return torch.where(num_draft[:, None] >= 0, out, PLACEHOLDER_TOKEN_ID)


#: the attribute of our ``rejection_sample`` replacements (both runners) holding their
#: :class:`RaggedVerifier`: what the plain-step wrappers read to know that our sampler is installed
VERIFIER_ATTRIBUTE = "__spec_samplers_verifier__"


def seam_verifier(module_name: str, attribute: str = "rejection_sample") -> RaggedVerifier | None:
    """The verifier of our replacement installed at ``module_name``'s ``attribute`` (vLLM's seam),
    or None when vLLM's own function is there (or the module is not imported)."""
    seam = getattr(sys.modules.get(module_name), attribute, None)
    return getattr(seam, VERIFIER_ATTRIBUTE, None)


def at_least_one_token(out: torch.Tensor, well_formed: torch.Tensor | None = None) -> torch.Tensor:
    """vLLM's contract at its verification seam (both runners): every request gains at least one
    token per step, and every emitted token is in the vocabulary (vLLM's own
    ``test_all_nan_target_logits_in_range``). Our samplers emit -1 where a target row has no
    probability mass (all NaN or -inf logits: docs/contract.md); a request whose first row has none
    would get no token and never progress. Such a slot becomes token 0, what vLLM's own
    verification gives there (``argmax`` of an all-NaN or all -inf row). Later -1 slots stay: the
    request has gained its accepted drafts. A request whose metadata is malformed
    (``well_formed`` [B] bool False) keeps its -1s: it emits no token (docs/contract.md,
    "Robustness"). [B, K+1], the same tensor (a few ops, no host sync)."""
    first = out[:, :1]
    filled = first.clamp(min=0)
    if well_formed is not None:
        filled = torch.where(well_formed[:, None], filled, first)
    out[:, :1] = filled
    return out


def well_formed_requests(
    cu_num_draft_tokens: torch.Tensor,  # [B] inclusive cumulative sum of k_b
    max_spec_len: int,
    num_tokens: int,  # T, the flat rows
) -> torch.Tensor:
    """[B] bool: the requests whose metadata :func:`ragged_positions` accepts (no host read)."""
    return ragged_layout(cu_num_draft_tokens, max_spec_len, num_tokens)[2] >= 0
