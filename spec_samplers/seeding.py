"""Per-row seeds for the counter-based generator (docs/design.md section 4)."""

from __future__ import annotations

import torch

from spec_samplers.constants import input_error
from spec_samplers.rng import SEED_HIGH
from spec_samplers.validation import check_seed_tensor


def row_seeds(
    batch_size: int,
    device: torch.device,
    seeded_seqs: dict[int, torch.Generator] | None = None,
    seeds: torch.Tensor | None = None,  # [B] int64 on device
) -> torch.Tensor:
    """[B] int64 seeds: ``seeds`` if given, else drawn from torch's default generator; rows in
    ``seeded_seqs`` draw theirs from their own generator, so re-seeding it reproduces the row.
    No host synchronisation (the loop runs over the seeded rows, not the batch)."""
    check_seed_tensor("seeds", seeds, batch_size, device)
    if seeds is None:
        out = torch.randint(0, SEED_HIGH, (batch_size,), dtype=torch.int64, device=device)
    else:
        out = seeds.to(torch.int64)
    if not seeded_seqs:
        return out
    if seeds is not None:
        out = out.clone()
    rows, drawn = [], []
    for row, gen in seeded_seqs.items():
        if not isinstance(row, int) or not 0 <= row < batch_size:
            raise input_error("seeded_seqs", f"row indices in [0, {batch_size})", repr(row))
        if not isinstance(gen, torch.Generator):
            raise input_error(f"seeded_seqs[{row}]", "a torch.Generator", type(gen).__name__)
        rows.append(row)
        drawn.append(torch.randint(0, SEED_HIGH, (1,), dtype=torch.int64, generator=gen, device=gen.device))
    out[torch.tensor(rows, device=device)] = torch.cat([d.to(device) for d in drawn])
    return out
