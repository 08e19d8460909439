"""Planted faults: verification samplers with the slips users report, to show that certify catches them.

Each is a :class:`~spec_samplers.RejectionSampler` (the last: a block verification sampler) with one
slip in the entry our decoding loop calls (``forward`` for chains, ``forward_tree`` for trees); none is
registered as a sampler.

* :class:`DraftTemperatureSlip`: drafts drawn from the draft at the request's temperature are judged
  against the draft's law at another temperature (EAGLE #329, transformers #47932 in kind).
* :class:`AcceptAllSampler`: accepts every draft.
* :class:`SiblingsAgainstTargetSampler`: the siblings of a draft tree are each tested against the
  unmodified target row instead of the residual left by the siblings rejected before them.
* :class:`FullDraftProductSampler`: block verification that accepts the whole draft with
  min(1, prod q/p) (the released HSD code's test, docs/multipath.md) instead of the capped rho_k.

``spec-samplers certify --plant NAME`` runs our loop with one of them (``PLANTS``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from spec_samplers.block import BlockVerificationSampler
from spec_samplers.layout import TreeBatch, as_probabilities
from spec_samplers.output import TreeOutput, finish_walk
from spec_samplers.output import at as _at
from spec_samplers.output import seeds_of as _seeds
from spec_samplers.rejection import RejectionSampler
from spec_samplers.rng import accept_uniforms
from spec_samplers.torch_ops import valid_ids
from spec_samplers.tree.reference import gather_rows


class DraftTemperatureSlip(RejectionSampler):
    """Judges the drafts against their law at ``judged / drawn`` times the temperature they were
    drawn at: the draft probabilities p' (at temperature T) are replaced by p'^(T / T_j)
    renormalised, which is the draft's law at T_j on p''s support.

    Args:
        drawn_temperature, judged_temperature: T and T_j (> 0).
    """

    lossless: ClassVar[bool] = False

    def __init__(self, drawn_temperature: float = 0.7, judged_temperature: float = 1.0, **options: Any) -> None:
        super().__init__(**options)
        self.exponent = drawn_temperature / judged_temperature

    def forward(  # type: ignore[override]
        self,
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        seeds: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        judged = draft_probs.float().pow(self.exponent)
        judged = judged / judged.sum(dim=-1, keepdim=True)
        return super().forward(target_probs, bonus_token_ids, judged, draft_token_ids, seeds=seeds, offsets=offsets)


class AcceptAllSampler(RejectionSampler):
    """Emits every draft and the bonus token, whatever the target says."""

    lossless: ClassVar[bool] = False

    def forward(  # type: ignore[override]
        self,
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        draft_token_ids: torch.Tensor,
        seeds: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        bonus = bonus_token_ids.reshape(-1, 1).to(torch.int64)
        return torch.cat([draft_token_ids.to(torch.int64), bonus], dim=1)


def siblings_against_target_walk(tb: TreeBatch) -> TreeOutput:
    """The tree walk with the slip: at node u, child c_i is accepted with probability
    min(1, q_u(c_i) / p_u(c_i)) for every i; a rejection leaves q_u as it was. When every child of
    the stop node was rejected the final token is drawn from (q_u - p_u)+, the chain's residual;
    at a leaf, from q_u. Independent siblings only (``draft_sampling="independent"``)."""
    tb = as_probabilities(tb)
    if tb.draft is None or tb.policy != "independent":
        raise ValueError("siblings_against_target_walk needs independent siblings with draft probabilities")
    N, V = tb.num_nodes, tb.vocab_size
    seeds, offsets = _seeds(tb)
    u = accept_uniforms(seeds, offsets, N)
    cur = torch.where(tb.target_rows[:, 0] >= 0, 0, -1)
    q = gather_rows(tb.target, tb.target_rows[:, 0])
    p = gather_rows(tb.draft, tb.draft_rows[:, 0])
    tried_here = torch.zeros_like(cur, dtype=torch.bool)
    for j in range(1, N + 1):
        tried = (tb.parents[:, j - 1] == cur) & (tb.depth[:, j] >= 1) & (tb.depth[:, j] <= tb.max_depth)
        valid, tok = valid_ids(tb.tokens[:, j - 1], V)
        q_c, p_c = _at(q, tok), _at(p, tok)
        ok = tried & valid & (p_c > 0)
        accept = ok & (u[:, j - 1] * p_c < q_c)
        tried_here = torch.where(accept, False, tried_here | ok)
        q = torch.where(accept[:, None], gather_rows(tb.target, tb.target_rows[:, j]), q)
        p = torch.where(accept[:, None], gather_rows(tb.draft, tb.draft_rows[:, j]), p)
        cur = torch.where(accept, j, cur)
    residual = (q - p).clamp_min(0.0)
    residual = torch.where(tried_here[:, None] & (residual.sum(dim=-1, keepdim=True) > 0), residual, q)
    return finish_walk(tb, cur, residual, q.amax(dim=-1) > 0, q.argmax(dim=-1))


class SiblingsAgainstTargetSampler(RejectionSampler):
    """Chains as :class:`RejectionSampler`; trees by :func:`siblings_against_target_walk`."""

    lossless: ClassVar[bool] = False
    tree_reference = staticmethod(siblings_against_target_walk)
    tree_kernel = None  # type: ignore[assignment]  # the reference walk, never the kernel


def uncapped_full_draft(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor
) -> torch.Tensor:
    """[B] min(1, prod_i q_i(x_i) / p_i(x_i)) over the k drafts (float64; 0 for a draft that could
    not have been drawn): the uncapped product, where block verification's rho_k caps every prefix
    at 1 (rho_k = R_k / max_{j<=k} R_j with R_j the product of the first j ratios)."""
    k = draft_token_ids.shape[1]
    ids = draft_token_ids.to(torch.int64).clamp(0, target_probs.shape[-1] - 1)[:, :, None]
    q_x = target_probs[:, :k].double().gather(2, ids).squeeze(2)
    p_x = draft_probs[:, :k].double().gather(2, ids).squeeze(2)
    ok = (
        (p_x > 0).all(dim=1) & (draft_token_ids >= 0).all(dim=1) & (draft_token_ids < target_probs.shape[-1]).all(dim=1)
    )
    ratio = (q_x / torch.where(p_x > 0, p_x, 1.0)).prod(dim=1)
    return torch.where(ok, ratio.clamp(max=1.0), 0.0)


class FullDraftProductSampler(BlockVerificationSampler):
    """Block verification whose last test, "the whole draft passes", uses min(1, prod q/p) over
    the k drafts instead of rho_k (the capped running ratio): the released code of Hierarchical
    Speculative Decoding (Zhou et al. 2026). Since rho_k <= min(1, prod q/p), it accepts the whole
    draft whenever block verification does and more often: lossy (docs/multipath.md)."""

    lossless: ClassVar[bool] = False

    def forward(  # type: ignore[override]
        self,
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        seeded_seqs: dict[int, torch.Generator] | None = None,
        *,
        seeds: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        is_greedy: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, k = draft_token_ids.shape
        device = target_probs.device
        if seeds is None:
            seeds = torch.randint(0, 2**62, (B,), device=device)
        offsets = torch.zeros_like(seeds) if offsets is None else offsets
        out = super().forward(
            target_probs,
            bonus_token_ids,
            draft_probs,
            draft_token_ids,
            seeds=seeds,
            offsets=offsets,
            is_greedy=is_greedy,
        )
        if k == 0:
            return out
        # the test of "all k drafts pass" reads the accept uniform of position k - 1, as block verification's
        full = accept_uniforms(seeds, offsets, k)[:, k - 1].double() < uncapped_full_draft(
            target_probs, draft_probs, draft_token_ids
        )
        if is_greedy is not None:
            full = full & ~is_greedy
        whole = torch.cat([draft_token_ids.to(torch.int64), bonus_token_ids.reshape(-1, 1).to(torch.int64)], dim=1)
        return torch.where(full[:, None], whole, out)


#: --plant name -> (what it plants, needs a tree)
PLANTS: dict[str, str] = {
    "draft-temperature": "drafts drawn at the request's temperature, judged at another",
    "accept-all": "every draft accepted",
    "tree-siblings": "tree siblings each tested against the unmodified target",
    "hsd-full-draft": "block verification accepting the whole draft with min(1, prod q/p) (released HSD code)",
}


def planted_sampler(name: str, temperature: float) -> RejectionSampler | BlockVerificationSampler:
    """The sampler of plant ``name`` for requests at ``temperature`` (draft-temperature judges the
    drafts at half the temperature they were drawn at)."""
    if name == "draft-temperature":
        return DraftTemperatureSlip(drawn_temperature=temperature, judged_temperature=temperature / 2)
    if name == "accept-all":
        return AcceptAllSampler()
    if name == "tree-siblings":
        return SiblingsAgainstTargetSampler()
    if name == "hsd-full-draft":
        return FullDraftProductSampler()
    raise ValueError(f"plant: expected one of {', '.join(PLANTS)}, got {name!r}")
