"""Presets of the bench: ``demo``, a small acceptance demo on synthetic distributions (no model
needed), run by ``spec-samplers demo``."""

from __future__ import annotations

import torch

from spec_samplers.bench.workloads import synthetic_pair
from spec_samplers.rejection import RejectionSampler

#: the most rows per setting ``demo`` runs: at 10^7 the acceptance's standard error is below 2e-4,
#: under the 4 printed digits, and the time (linear in the rows) is already tens of seconds
MAX_DEMO_TRIALS = 10_000_000


def check_demo(trials: int, k: int) -> None:
    """Refuse, before allocating, a demo past MAX_DEMO_TRIALS or one whose rows do not fit in
    memory (the estimate of ``bench``'s quality runs)."""
    from spec_samplers.bench.cli import drawn_rows_bytes
    from spec_samplers.memory_budget import check_fits

    if trials > MAX_DEMO_TRIALS:
        raise ValueError(
            f"--trials: expected at most {MAX_DEMO_TRIALS} (more rows change no printed digit and only take "
            f"longer), got {trials}"
        )
    # one setting at a time: its output [rows, k + 1] int64 with its masks, and per-row seeds
    outputs = trials * ((k + 1) * (8 + 4 + 1) + 8)
    check_fits(drawn_rows_bytes(trials, k) + outputs, f"the demo at --trials {trials}, k = {k}", "--trials / --k")


def run_demo(trials: int = 4000, vocab_size: int = 1000, k: int = 4, seed: int = 0) -> list[dict[str, float]]:
    """Measured acceptance of RejectionSampler vs theory 1 - TV(p, q), per divergence setting.

    Each setting uses one (p, q) pair repeated over ``trials`` rows and k positions, so the
    per-position acceptance is i.i.d. with rate a = sum min(p, q).
    """
    rows = []
    sampler = RejectionSampler()
    for sigma in (0.25, 0.5, 1.0, 2.0, 4.0):
        q, p = synthetic_pair(1, vocab_size, sigma, 1.0, seed)
        theory = float(torch.minimum(p, q).sum())
        target = q.expand(trials, k + 1, vocab_size)
        draft = p.expand(trials, k, vocab_size)
        gen = torch.Generator().manual_seed(seed + 1)
        draft_ids = torch.multinomial(p[0], trials * k, replacement=True, generator=gen).view(trials, k)
        bonus = torch.multinomial(q[0], trials, replacement=True, generator=gen).view(trials, 1)
        seeds = torch.randint(0, 2**62, (trials,), generator=gen)
        out = sampler(target, bonus, draft, draft_ids, seeds=seeds)
        accepted = (out[:, 1:] != -1).float()
        rows.append(
            {
                "sigma": sigma,
                "theory_acceptance": theory,
                "measured_acceptance": float(accepted[:, 0].mean()),
                "mean_emitted": float((out != -1).sum(1).float().mean()),
                "theory_emitted": (1 - theory ** (k + 1)) / (1 - theory) if theory < 1 else k + 1.0,
            }
        )
    return rows


def print_demo(rows: list[dict[str, float]], trials: int, k: int) -> None:
    print(f"RejectionSampler on synthetic pairs (V=1000, k={k}, {trials} rows; draft = target logits + sigma*noise)")
    print(f"{'sigma':>6} {'1-TV(p,q)':>10} {'measured':>9} {'emitted':>8} {'theory':>7}")
    for r in rows:
        print(
            f"{r['sigma']:>6.2f} {r['theory_acceptance']:>10.4f} {r['measured_acceptance']:>9.4f} "
            f"{r['mean_emitted']:>8.3f} {r['theory_emitted']:>7.3f}"
        )
