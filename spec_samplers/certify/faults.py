"""Planted faults: verification samplers with the slips users report, to show that certify catches them.

Each is a :class:`~spec_samplers.RejectionSampler` with one slip in the entry our decoding loop calls
(``forward`` for chains, ``forward_tree`` for trees); none is registered as a sampler.

* :class:`DraftTemperatureSlip`: drafts drawn from the draft at the request's temperature are judged
  against the draft's law at another temperature (EAGLE #329, transformers #47932 in kind).
* :class:`AcceptAllSampler`: accepts every draft.
* :class:`SiblingsAgainstTargetSampler`: the siblings of a draft tree are each tested against the
  unmodified target row instead of the residual left by the siblings rejected before them.

``spec-samplers certify --plant NAME`` runs our loop with one of them (``PLANTS``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from spec_samplers.rejection import RejectionSampler
from spec_samplers.rng import accept_uniforms
from spec_samplers.torch_ops import valid_ids
from spec_samplers.tree.layout import TreeBatch, as_probabilities
from spec_samplers.tree.output import TreeOutput, finish_walk
from spec_samplers.tree.output import at as _at
from spec_samplers.tree.output import seeds_of as _seeds
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


#: --plant name -> (what it plants, needs a tree)
PLANTS: dict[str, str] = {
    "draft-temperature": "drafts drawn at the request's temperature, judged at another",
    "accept-all": "every draft accepted",
    "tree-siblings": "tree siblings each tested against the unmodified target",
}


def planted_sampler(name: str, temperature: float) -> RejectionSampler:
    """The sampler of plant ``name`` for requests at ``temperature`` (draft-temperature judges the
    drafts at half the temperature they were drawn at)."""
    if name == "draft-temperature":
        return DraftTemperatureSlip(drawn_temperature=temperature, judged_temperature=temperature / 2)
    if name == "accept-all":
        return AcceptAllSampler()
    if name == "tree-siblings":
        return SiblingsAgainstTargetSampler()
    raise ValueError(f"plant: expected one of {', '.join(PLANTS)}, got {name!r}")
