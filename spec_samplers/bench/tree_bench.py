"""Tokens per target pass, chain vs tree at equal node budgets, on synthetic workloads.

Workload: a target q over V tokens and a draft p = softmax(log q + sigma * noise), the same at
every depth (rows depend only on depth, so acceptance at one level does not depend on the path).
Theory (exact, for these workloads): one round emits 1 + L tokens per target pass, with
E[L] = sum_{d=1..D} prod_{d' <= d} a_d' where a_d is the probability that some child is accepted
at a node with b_d children:

* chain (b_d = 1): a = sum_x min(p, q), so E[1 + L] = (1 - a^(k+1)) / (1 - a);
* independent siblings: a = 1 - prod_{i=1..b} (1 - sum_x min(r_{i-1}, p)), r_0 = q,
  r_i = norm((r_{i-1} - p)+) (each rejection removes min(r, p) from the residual);
* deterministic top-b siblings: a = sum of q over the b most likely tokens of p;
* without replacement: no closed form here; Monte Carlo only.

Monte Carlo: the package's own ``RejectionSampler.forward_tree`` on drawn trees (B rounds at once).
Run ``python -m spec_samplers.bench.tree_bench`` (prints a table; ``--json PATH`` writes it).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import torch

from spec_samplers.decoding.tree_drafting import as_tree_shape, static_parents
from spec_samplers.rejection import RejectionSampler

#: (name, nodes) pairs compared at equal node budgets: a chain of N nodes and a tree of N nodes
COMPARISONS: tuple[tuple[Sequence[int], int], ...] = (((2, 2), 6), ((2, 2, 1), 10), ((4, 2, 1), 20), ((4,), 4))
#: the smallest vocabulary the comparisons run on: drafting without replacement needs as many
#: distinct tokens as the widest level has children
MIN_VOCAB = max(max(branching) for branching, _ in COMPARISONS)


def workload(vocab_size: int, sigma: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [V], p [V]) float64: a peaked target and a noisy draft of it."""
    gen = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(vocab_size, generator=gen, dtype=torch.float64)
    q = torch.softmax(logits, 0)
    p = torch.softmax(logits + sigma * torch.randn(vocab_size, generator=gen, dtype=torch.float64), 0)
    return q, p


def level_acceptance(q: torch.Tensor, p: torch.Tensor, siblings: int, policy: str) -> float:
    """a: probability that one of ``siblings`` children is accepted (module docstring)."""
    if policy == "deterministic":
        return float(q[torch.argsort(p, descending=True)[:siblings]].sum())
    if policy != "independent":
        raise ValueError(f"no closed form for {policy!r}")
    r, reject = q.clone(), 1.0
    for _ in range(siblings):
        overlap = float(torch.minimum(r, p).sum())
        reject *= 1.0 - overlap
        rest = (r - p).clamp_min(0)
        if float(rest.sum()) <= 0:
            break
        r = rest / rest.sum()
    return 1.0 - reject


def theory(q: torch.Tensor, p: torch.Tensor, branching: Sequence[int], policy: str = "independent") -> float:
    """E[tokens per target pass] = 1 + E[L] of a static tree (a chain: branching = [1] * k)."""
    total, reach = 1.0, 1.0
    for b in branching:
        reach *= level_acceptance(q, p, b, policy)
        total += reach
    return total


def monte_carlo(
    q: torch.Tensor, p: torch.Tensor, branching: Sequence[int], policy: str, rounds: int, seed: int = 0
) -> tuple[float, float]:
    """(mean, standard error) of tokens per target pass over ``rounds`` verified trees."""
    parents = static_parents(as_tree_shape(list(branching)))
    N, V = len(parents), q.shape[0]
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(rounds, N, dtype=torch.int64)
    for j, par in enumerate(parents):
        weights = p.float().expand(rounds, V).clone()
        siblings = [s for s in range(j) if parents[s] == par]
        if policy == "deterministic":
            tokens[:, j] = torch.argsort(p, descending=True)[len(siblings)]
            continue
        if policy == "without_replacement" and siblings:
            weights.scatter_(1, tokens[:, siblings], 0.0)
        tokens[:, j] = torch.multinomial(weights, 1, generator=gen).squeeze(1)
    rows = q.float().expand(rounds, N + 1, V)
    drafts = p.float().expand(rounds, N + 1, V)
    seeds = torch.randint(0, 2**62, (rounds,), generator=gen)
    out = RejectionSampler(backend="torch").forward_tree(rows, drafts, tokens, parents, policy, seeds=seeds)
    emitted = ((out.node_ids >= 0).sum(1) + 1).double()
    return float(emitted.mean()), float(emitted.std() / rounds**0.5)


def chain_vs_tree(vocab_size: int = 64, sigma: float = 1.0, rounds: int = 20000, seed: int = 0) -> list[dict]:
    """One row per (shape, policy): theory (where computable) and Monte Carlo tokens per pass."""
    q, p = workload(vocab_size, sigma, seed)
    rows = []
    for branching, nodes in COMPARISONS:
        shapes = [("chain", [1] * nodes, "independent"), ("tree", list(branching), "independent")]
        shapes += [("tree", list(branching), "without_replacement"), ("tree", list(branching), "deterministic")]
        for kind, shape, policy in shapes:
            try:
                exact: float | None = theory(q, p, shape, policy)
            except ValueError:
                exact = None
            mean, se = monte_carlo(q, p, shape, policy, rounds, seed + 1)
            rows.append(
                dict(nodes=nodes, kind=kind, shape=shape, policy=policy, sigma=sigma, vocab=vocab_size,
                     alpha=float(torch.minimum(p, q).sum()), theory=exact, measured=mean, stderr=se)
            )  # fmt: skip
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'nodes':>5} {'shape':<22} {'policy':<20} {'theory':>7} {'measured':>14}"]
    for r in rows:
        shape = f"chain {r['nodes']}" if r["kind"] == "chain" else "tree " + ",".join(map(str, r["shape"]))
        theory_text = "-" if r["theory"] is None else f"{r['theory']:.3f}"
        measured = f"{r['measured']:.3f} +- {r['stderr']:.3f}"
        lines.append(f"{r['nodes']:>5} {shape:<22} {r['policy']:<20} {theory_text:>7} {measured:>14}")
    return "\n".join(lines)


def argv_from_bench(args: argparse.Namespace) -> list[str]:
    """``spec-samplers bench trees``'s options as this module's command line."""
    argv = ["--vocab", str(args.vocab or 64), "--seed", str(args.seed)]
    argv += ["--rounds", "2000", "--sigma", "1.0"] if args.quick else []
    return argv + (["--json", args.json] if args.json else [])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--sigma", type=float, action="append", help="draft noise (repeatable; default 0.5, 1, 2)")
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.vocab < MIN_VOCAB:
        raise ValueError(f"--vocab: expected an integer >= {MIN_VOCAB} (the widest tree level), got {args.vocab}")
    if args.rounds < 2:
        raise ValueError(f"--rounds: expected an integer >= 2, got {args.rounds}")
    all_rows = []
    for sigma in args.sigma or [0.5, 1.0, 2.0]:
        rows = chain_vs_tree(args.vocab, sigma, args.rounds, args.seed)
        alpha = rows[0]["alpha"]
        print(f"V = {args.vocab}, sigma = {sigma}: per-token acceptance sum min(p, q) = {alpha:.3f}")
        print(format_rows(rows))
        print()
        all_rows += rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
