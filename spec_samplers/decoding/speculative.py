"""A batched speculative decoding loop over two :class:`LanguageModel` s and any registered sampler.

One round, for every running request (k = ``num_speculative_tokens``):

1. the draft model proposes d_1..d_k, each sampled from the draft's logits processed with the
   request's SamplingParams (p'_i);
2. the target scores the last committed token and the k drafts in one forward pass, giving the
   processed target distributions q'_1..q'_{k+1}; the bonus token is sampled from q'_{k+1};
3. the sampler verifies: request b keeps a_b drafts plus one recovered or bonus token;
4. both KV caches drop, per request, the k - a_b entries of rejected tokens.

Cache invariants at the start of a round: the target holds every committed token but the last;
the draft holds every committed token but the last two, which it reads again in its first step
(so a round where all k drafts were accepted needs no extra draft pass for d_k). Random draws are
keyed by each request's seed and round (see ``strategy``), so a request's output does not depend
on the batch it runs in. The loop reads the sampler's output back once per round (to crop the
caches and retire finished requests).

Draft length (transformers' assisted-generation policy, ``confidence_threshold`` and
``draft_schedule``): a round stops drafting after the step where every running request's draft
gave its own sampled token a processed probability below the threshold (that token is still
verified), and the heuristic schedule moves the round's cap k by +2 / -1. The length is decided by
the draft's own values and earlier rounds only (a stopping time), so a token-wise sampler keeps its
law: each position's token is verified against the draft distribution it was drawn from, or, past
the last draft, is the bonus token drawn from the target. Block verification's acceptance of a
position depends on the drafts after it, so a draft-dependent length would change its law: block
samplers (and trees) always draft their fixed shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spec_samplers.constants import PLACEHOLDER_TOKEN_ID, input_error
from spec_samplers.decoding.interfaces import LanguageModel
from spec_samplers.decoding.output import (
    GenerationOutput,
    RoundObserver,
    RoundTarget,
    left_pad,
    model_device,
)
from spec_samplers.decoding.rounds import begin_rounds, fit_vocab, for_draft, last_logits
from spec_samplers.decoding.strategy import BONUS_STREAM, DRAFT_STREAM, derive_seed
from spec_samplers.decoding.tree_drafting import NodeBudget, as_tree_shape, generate_tree
from spec_samplers.engine_seam import bind
from spec_samplers.layout import check_policy
from spec_samplers.registry import get_sampler
from spec_samplers.sampling_params import SamplingParams

#: transformers' ``num_assistant_tokens_schedule`` values
DRAFT_SCHEDULES = ("constant", "heuristic", "heuristic_transient")


def draft_confidence(
    probs: torch.Tensor, logits: torch.Tensor, token: torch.Tensor, greedy: torch.Tensor | None
) -> torch.Tensor:
    """[n] the draft's probability of its own sampled ``token`` [n], as transformers'
    ``ConfidenceCriteria`` reads it: the processed distribution ``probs`` [n, V] (what the token was
    drawn from); for greedy rows (``greedy`` [n] bool, None when there are none) the softmax of the
    raw ``logits`` [n, V], as transformers' greedy assistant has no warpers."""
    conf = probs.gather(1, token[:, None])[:, 0]
    if greedy is None:
        return conf
    raw = torch.softmax(logits.float(), dim=-1).gather(1, token[:, None])[:, 0]
    return torch.where(greedy, raw, conf)


def after_own_drafts(q: torch.Tensor, own_k: torch.Tensor | None) -> torch.Tensor:
    """[n, V]: the target's distribution after each request's own last draft, where its bonus
    token is drawn: q [n, K+1, V] at own_k [n] (None: every request drafted K)."""
    if own_k is None:
        return q[:, -1]
    return q[torch.arange(q.shape[0], device=q.device), own_k]


def own_length(
    out: torch.Tensor, num_accepted: torch.Tensor, lengths: torch.Tensor, bonus: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A round's tokens as if request b had drafted only its own ``lengths[b]`` tokens (the batch
    drafts until every request stopped): out [n, K+1] host, num_accepted, lengths and bonus [n].

    A token-wise sampler decides each position from that position's draft alone, so the first
    lengths[b] positions stand; a request that accepted all of its own drafts then takes its bonus
    token, drawn from the target after its last draft. Its tokens are those it would get alone."""
    full = num_accepted >= lengths
    num_accepted = torch.minimum(num_accepted, lengths)
    column = torch.arange(out.shape[1])[None]
    out = torch.where(column > num_accepted[:, None], PLACEHOLDER_TOKEN_ID, out)
    out = torch.where(full[:, None] & (column == lengths[:, None]), bonus[:, None], out)
    return out, num_accepted


class SpeculativeDecoder:
    """Speculative decoding with a target and a draft :class:`LanguageModel`.

    Args:
        target, draft: the models (e.g. ``spec_samplers.integrations.transformers.HFLanguageModel``);
            they must share a tokenizer. Their vocabulary sizes may differ (the draft's
            distribution is truncated or padded to the target's).
        sampler: a registered sampler name (``spec_samplers.available_samplers()``) or an instance.
        num_speculative_tokens: k, drafts per round (>= 1); ignored with ``tree``.
        sampler_options: constructor options when ``sampler`` is a name.
        tree: draft a token tree per round instead of a chain (:mod:`spec_samplers.decoding.tree_drafting`):
            a branching list (children per node at each depth, EAGLE's static shape, e.g. [2, 2, 1]:
            2 + 4 + 4 = 10 nodes, depth 3), or a :class:`~spec_samplers.decoding.tree_drafting.NodeBudget`
            (a dynamic tree of at most that many nodes grown by top-k or sampled expansion). The
            target scores the tree in one pass with tree attention (the models need
            ``forward_tree``, as ``HFLanguageModel``), the sampler's ``forward_tree`` verifies it
            and both caches keep only the accepted path.
        draft_sampling: how siblings are drawn from their parent's draft distribution:
            "independent", "without_replacement" or "deterministic" (top-k).
        num_paths: K: draft K independent paths of k tokens per round (the tree [K, 1, .., 1]),
            verified in one target pass; what ``sampler="multipath_block_verification"`` needs
            (docs/multipath.md). Any tree sampler takes them; not with ``tree``.
        confidence_threshold: transformers' ``assistant_confidence_threshold``: stop a round's
            drafting once every running request's draft gave its sampled token a probability below
            it (0: always k drafts). Token-wise samplers on chains only (module docstring); costs
            one host read-back per draft step when > 0.
        draft_schedule: transformers' ``num_assistant_tokens_schedule``: "constant" (k per round),
            or "heuristic" / "heuristic_transient": the next round's cap is k + 2 when every running
            request accepted all drafts, else max(1, k - 1) (it starts at ``num_speculative_tokens``
            in every call). Token-wise samplers on chains only.

    Example::

        >>> decoder = SpeculativeDecoder(target, draft, "rejection_sampler", num_speculative_tokens=4)
        >>> out = decoder.generate(prompt_ids, max_new_tokens=64,           # prompt_ids [B, P]
        ...                        sampling_params=SamplingParams(temperature=0.8, top_p=0.95, seed=0))
        >>> out.token_ids.shape, out.acceptance_rate, out.tokens_per_target_pass
    """

    def __init__(
        self,
        target: LanguageModel,
        draft: LanguageModel,
        sampler: str | torch.nn.Module = "rejection_sampler",
        num_speculative_tokens: int = 4,
        sampler_options: dict[str, object] | None = None,
        tree: Sequence[int] | NodeBudget | None = None,
        draft_sampling: str = "independent",
        num_paths: int | None = None,
        confidence_threshold: float = 0.0,
        draft_schedule: str = "constant",
    ) -> None:
        k = num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise input_error("num_speculative_tokens", "an int >= 1", repr(k))
        if num_paths is not None:
            if isinstance(num_paths, bool) or not isinstance(num_paths, int) or num_paths < 1:
                raise input_error("num_paths", "an int >= 1 or None", repr(num_paths))
            if tree is not None:
                raise input_error(
                    "num_paths", "None when tree= is given (K paths are the tree [K, 1, .., 1])", num_paths
                )
            tree = [num_paths] + [1] * (k - 1)
        if isinstance(sampler, str):
            sampler = get_sampler(sampler, **(sampler_options or {}))
        elif sampler_options:
            raise input_error("sampler_options", "None when sampler is an instance", sampler_options)
        if not callable(sampler):
            raise input_error("sampler", "a registered sampler name or a sampler instance", type(sampler).__name__)
        self.target = target
        self.draft = draft
        self.sampler = sampler
        self.num_speculative_tokens = k
        self._bound = bind(sampler)  # how it takes randomness, read once
        self.tree = None if tree is None else as_tree_shape(tree)
        threshold = confidence_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            raise input_error("confidence_threshold", "a float in [0, 1]", repr(threshold))
        if draft_schedule not in DRAFT_SCHEDULES:
            raise input_error("draft_schedule", f"one of {DRAFT_SCHEDULES}", repr(draft_schedule))
        # the policy only where the draft length cannot change the law (module docstring)
        adaptive = self.tree is None and getattr(sampler, "acceptance_law", "token") == "token"
        self.confidence_threshold = float(threshold) if adaptive else 0.0
        self.draft_schedule = draft_schedule if adaptive else "constant"
        self.draft_sampling = check_policy(draft_sampling)
        if self.tree is not None and not hasattr(sampler, "forward_tree"):
            raise input_error("sampler", "a sampler with forward_tree when tree= is given", type(sampler).__name__)
        if getattr(sampler, "tree_layout", None) == "paths":  # verifies K independent paths only
            K = self.tree.widths[0] if self.tree is not None else 1
            if self.tree is not None and self.tree.branching != (K,) + (1,) * (self.tree.depth - 1):
                raise input_error("tree", "None or K paths [K, 1, .., 1] (num_paths=K)", self.tree.branching)
            if self.tree is not None and self.draft_sampling != "independent":
                raise input_error("draft_sampling", "'independent' (K independent paths)", repr(self.draft_sampling))

    def _verify(
        self,
        target_probs: torch.Tensor,  # [B, k+1, V] fp32
        bonus_token_ids: torch.Tensor,  # [B, 1] int64
        draft_probs: torch.Tensor,  # [B, k, V] fp32
        draft_token_ids: torch.Tensor,  # [B, k] int64
        seeds: torch.Tensor,  # [B] int64
        offsets: torch.Tensor,  # [B] int64
    ) -> torch.Tensor:
        args = (target_probs, bonus_token_ids, draft_probs, draft_token_ids)
        if self._bound.randomness == "tensors":
            return self.sampler(*args, seeds=seeds, offsets=offsets)
        if self._bound.randomness == "generators":  # one generator per row: a host loop, V0 samplers only
            device = target_probs.device
            seeded = {
                b: torch.Generator(device=device).manual_seed(derive_seed(s, o) & ((1 << 63) - 1))
                for b, (s, o) in enumerate(zip(seeds.tolist(), offsets.tolist()))
            }
            return self.sampler(*args, seeded_seqs=seeded)
        return self.sampler(*args)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor | Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        seed: int | None = None,
        observer: RoundObserver | None = None,
    ) -> GenerationOutput:
        """Generate up to ``max_new_tokens`` tokens for each prompt.

        Args:
            prompt_ids: [B, P] int tensor, or B id lists of different lengths.
            max_new_tokens: tokens per request (a request stops earlier at the target's EOS).
            sampling_params: one SamplingParams for all requests, one per request, or None
                (temperature 1). Greedy requests (temperature 0) give the target's greedy output.
            seed: seeds requests whose SamplingParams.seed is None (request i gets a seed derived
                from ``seed`` and i). Set SamplingParams.seed for outputs that do not depend on a
                request's place in the batch.
            observer: sees each round's tokens before they are committed and may end requests
                early (:class:`~spec_samplers.decoding.output.RoundObserver`; the transformers
                integration's stopping criteria, streamer and scores).

        Returns:
            :class:`GenerationOutput`: token_ids [B, L] (L the longest request, <= max_new_tokens; -1 after EOS) and
            per-request statistics.
        """
        k = self.num_speculative_tokens
        positions = k if self.tree is None else self.tree.depth  # counted per round
        if self.tree is None and self.draft_schedule != "constant":  # the heuristic cap grows up to the budget
            positions = max(k, max_new_tokens) if isinstance(max_new_tokens, int) else k
        start, stats, strategy = begin_rounds(
            self.target, prompt_ids, max_new_tokens, sampling_params, seed, positions, observer
        )
        prompts, buffer, B = start.prompts, start.buffer, start.batch_size
        if strategy is None:
            return stats.output(buffer)
        if self.tree is not None:
            return generate_tree(self, start, stats, strategy)
        device = model_device(self.target)
        target_cache, draft_cache = self.target.new_kv_cache(), self.draft.new_kv_cache()
        longest = max(len(p) for p in prompts)
        lengths = torch.tensor([len(p) for p in prompts])
        vocab = getattr(self.target, "vocab_size", None)
        # the prefills fill the caches; their logits are not read (the last position's only, for
        # the vocabulary size: a model with forward_last skips the head everywhere else)
        if longest > 1:
            logits = last_logits(self.target, left_pad([p[:-1] for p in prompts], longest - 1, device), target_cache)
            vocab = vocab or logits.shape[-1]
            stats.target_passes += (lengths > 1).to(torch.int64)
        if longest > 2:
            last_logits(self.draft, left_pad([p[:-2] for p in prompts], longest - 2, device), draft_cache)
            stats.draft_passes += (lengths > 2).to(torch.int64)
        tail = left_pad([p[-2:] for p in prompts], 2, torch.device("cpu"))  # [B, 2] last two committed
        active = torch.arange(B)  # original index of each running request
        rounds = torch.zeros(B, dtype=torch.int64, device=device)  # [B_active], the requests' offsets
        draft_vocab: int | None = None
        threshold = self.confidence_threshold
        policy = threshold > 0 or self.draft_schedule != "constant"  # transformers' draft-length policy
        caps = torch.full((B,), k, dtype=torch.int64)  # [B_active] host: each request's draft cap
        greedy = torch.tensor([p.is_greedy for p in strategy.params])  # [B_active] host
        while active.numel():
            # 1. draft k tokens (with the policy: each request up to its cap, until its draft's confidence drops)
            cap = int(caps.max()) if policy else k
            own_k = caps.to(device) if policy else None  # [n] each request's drafts this round
            rows_greedy = greedy.to(device) if threshold > 0 and bool(greedy.any()) else None
            query = tail.to(device)
            draft_probs, drafts = [], []
            for i in range(cap):
                logits = last_logits(self.draft, for_draft(query, draft_vocab), draft_cache)  # [n, V_d]
                draft_vocab = logits.shape[-1]
                vocab = vocab or draft_vocab
                probs = strategy.probs(fit_vocab(logits, vocab))  # [n, V]
                token = strategy.draw(probs, rounds, i, DRAFT_STREAM)  # [n]
                draft_probs.append(probs)
                drafts.append(token)
                query = token[:, None]
                if own_k is not None and threshold > 0 and i + 1 < cap:
                    unsure = draft_confidence(probs, logits, token, rows_greedy) < threshold
                    own_k = torch.where(unsure & (own_k > i + 1), i + 1, own_k)
                    if not bool((own_k > i + 1).any()):  # the policy's read-back: every request stopped
                        break
            K = len(drafts)
            draft_ids = torch.stack(drafts, dim=1)  # [n, K]
            p = torch.stack(draft_probs, dim=1)  # [n, K, V]
            # 2. score them with the target
            logits = self.target.forward(torch.cat([tail[:, 1:].to(device), draft_ids], dim=1), target_cache)
            if logits.shape[-1] != vocab:
                raise ValueError(f"target logits have {logits.shape[-1]} columns but its vocab_size is {vocab}")
            q = strategy.probs(logits)  # [n, K+1, V]
            bonus = strategy.draw(after_own_drafts(q, own_k), rounds, 0, BONUS_STREAM)  # [n]
            # 3. verify
            out = self._verify(q, bonus[:, None], p, draft_ids, strategy.seeds, rounds)  # [n, K+1]
            overlap = torch.minimum(p, q[:, :K]).sum(dim=-1)  # [n, K] sum_x min(p', q'): lossless acceptance
            out_host, overlap_host = out.cpu(), overlap.double().cpu()  # the round's read-back
            num_accepted = (out_host[:, 1:] != PLACEHOLDER_TOKEN_ID).sum(dim=1)  # [n]
            own_k_host = None if own_k is None else own_k.cpu()
            if own_k_host is not None:
                out_host, num_accepted = own_length(out_host, num_accepted, own_k_host, bonus.cpu())
            emitted = torch.arange(K + 1, device=device)[None].expand(out.shape[0], K + 1)
            finished = buffer.append(active, out_host, num_accepted + 1, RoundTarget(logits, q, emitted))
            stats.round(active, num_accepted, overlap_host, own_k_host)
            if self.draft_schedule != "constant" and own_k_host is not None:  # transformers' +2 / -1, per request
                all_in = num_accepted == own_k_host
                caps = torch.where(all_in, caps + 2, caps - 1).clamp(min=1, max=stats.k)
            # 4. crop both caches to the committed tokens (see the module docstring)
            crop = (K - num_accepted).tolist()
            target_cache.crop(crop)
            draft_cache.crop(crop)
            last = out_host.gather(1, num_accepted[:, None])[:, 0]
            before = out_host.gather(1, (num_accepted - 1).clamp(min=0)[:, None])[:, 0]
            tail = torch.stack([torch.where(num_accepted > 0, before, tail[:, 1]), last], dim=1)
            rounds = rounds + 1
            if bool(finished.any()):
                keep = (~finished).nonzero()[:, 0]
                active, tail, greedy, caps = active[keep], tail[keep], greedy[keep], caps[keep]
                rounds = rounds[keep.to(device)]
                strategy = strategy.select(keep)
                target_cache.batch_select_indices(keep.to(device))
                draft_cache.batch_select_indices(keep.to(device))
        return stats.output(buffer)
