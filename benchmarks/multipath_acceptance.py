"""Tokens per verification step with the same drafts for every method: recursive rejection sampling
(RRS) with and without replacement, Traversal Verification, block verification on one path and
greedy multi-path block verification (GBV) with K = 2, 3, 4, at L = 4 and 8, on synthetic
context-dependent pairs at several draft/target distances (measured: Monte Carlo over
``--requests`` rows, +- one standard error).

The pair: q(.|prefix) = softmax(2.5 z_q[h(prefix)]) and p(.|prefix) = softmax(log q + sigma
z_n[h(prefix)]) with z_q, z_n tables of standard normals indexed by a hash of the prefix (every
context its own rows). Drafts: 4 independent paths of length L from p per request; every
method with K paths reads the first K of the same 4 (block verification: path 0; RRS and
Traversal Verification: the K paths as a tree with K root children). RRS without replacement
needs other drafts (the K first tokens drawn without replacement, then each path independently):
the same generator state, its own draws.

    python benchmarks/multipath_acceptance.py [--requests 4000] [--vocab 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time

import torch

from spec_samplers import BlockVerificationSampler, MultipathBlockVerificationSampler, RejectionSampler
from spec_samplers.tree.multipath import path_parents

TABLE = 1 << 14
HASH_MUL = 0x9E3779B1


class SyntheticPair:
    def __init__(self, vocab: int, sigma: float, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.z_q = torch.randn(TABLE, vocab, generator=gen) * 2.5
        self.z_n = torch.randn(TABLE, vocab, generator=gen) * sigma

    def rows(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """prefix hashes [...] -> (q, p) [..., V] fp32."""
        idx = h % TABLE
        log_q = torch.log_softmax(self.z_q[idx], -1)
        return log_q.exp(), torch.softmax(log_q + self.z_n[idx], -1)


def extend(h: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    return (h * HASH_MUL + token + 1) % (1 << 31)


def draw_paths(pair: SyntheticPair, B: int, K: int, L: int, gen: torch.Generator, without_replacement: bool):
    """(target [B, K*L+1, V], draft [B, K*L+1, V], tokens [B, K*L]): K paths, node i*L + d."""
    V = pair.vocab
    root = torch.zeros(B, dtype=torch.int64)
    q0, p0 = pair.rows(root)
    target = torch.empty(B, K * L + 1, V)
    draft = torch.empty(B, K * L + 1, V)
    target[:, 0], draft[:, 0] = q0, p0
    tokens = torch.empty(B, K * L, dtype=torch.int64)
    first = torch.multinomial(p0, K, replacement=not without_replacement, generator=gen)  # [B, K]
    for i in range(K):
        h = root
        for d in range(1, L + 1):
            if d == 1:
                tok = first[:, i]
            else:
                tok = torch.multinomial(draft[:, i * L + d - 1], 1, generator=gen)[:, 0]
            tokens[:, i * L + d - 1] = tok
            h = extend(h, tok)
            target[:, i * L + d], draft[:, i * L + d] = pair.rows(h)
    return target, draft, tokens


def sub_paths(target, draft, tokens, K: int, L: int):
    """The first K of the paths (rows root + K*L nodes)."""
    return target[:, : K * L + 1], draft[:, : K * L + 1], tokens[:, : K * L]


def tokens_per_step(out) -> tuple[float, float]:
    emitted = (out.token_ids != -1).sum(1).double()
    return float(emitted.mean()), float(emitted.std() / math.sqrt(emitted.numel()))


def measure(sampler, drafts: tuple, K: int, L: int, seeds: torch.Tensor, policy: str = "independent") -> dict:
    """Tokens per step of ``sampler`` on the first K paths of ``drafts``."""
    start = time.perf_counter()
    out = sampler.forward_tree(*sub_paths(*drafts, K, L), path_parents(K, L), policy, seeds=seeds)
    mean, se = tokens_per_step(out)
    return {"tokens_per_step": mean, "se": se, "cpu_s": time.perf_counter() - start}


def run(requests: int, vocab: int, seed: int) -> list[dict]:
    rows = []
    for L in (4, 8):
        for sigma in (0.5, 1.0, 2.0, 3.0):
            pair = SyntheticPair(vocab, sigma, seed)
            gen = torch.Generator().manual_seed(seed + 1)
            target, draft, tokens = draw_paths(pair, requests, 4, L, gen, without_replacement=False)
            gen_wr = torch.Generator().manual_seed(seed + 1)
            target_wr, draft_wr, tokens_wr = draw_paths(pair, requests, 4, L, gen_wr, without_replacement=True)
            seeds = torch.randint(0, 2**62, (requests,), generator=torch.Generator().manual_seed(seed + 2))
            result: dict = {"L": L, "sigma": sigma}
            same, other = (target, draft, tokens), (target_wr, draft_wr, tokens_wr)
            result["block verification (1 path)"] = measure(BlockVerificationSampler(), same, 1, L, seeds)
            for K in (2, 3, 4):
                result[f"RRS K={K}"] = measure(RejectionSampler(), same, K, L, seeds)
                result[f"RRS w/o repl. K={K}"] = measure(RejectionSampler(), other, K, L, seeds, "without_replacement")
                result[f"Traversal K={K}"] = measure(BlockVerificationSampler(), same, K, L, seeds)
                result[f"GBV K={K}"] = measure(MultipathBlockVerificationSampler(), same, K, L, seeds)
            rows.append(result)
            print(
                f"L={L} sigma={sigma}: "
                + ", ".join(f"{k} {v['tokens_per_step']:.3f}" for k, v in result.items() if isinstance(v, dict)),
                flush=True,
            )
    return rows


METHODS = ["block verification (1 path)"] + [
    f"{m} K={K}" for K in (2, 3, 4) for m in ("RRS", "RRS w/o repl.", "Traversal", "GBV")
]


def markdown(rows: list[dict]) -> str:
    cols = [(r["L"], r["sigma"]) for r in rows]
    head = "| method | " + " | ".join(f"L={L}, sigma {s}" for L, s in cols) + " |"
    lines = [head, "|---|" + "---|" * len(cols)]
    for m in METHODS:
        cells = [f"{r[m]['tokens_per_step']:.3f} +- {r[m]['se']:.3f}" for r in rows]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = run(args.requests, args.vocab, args.seed)
    table = markdown(rows)
    print(table)
    if args.json:
        meta = {
            "command": "python benchmarks/multipath_acceptance.py "
            + f"--requests {args.requests} --vocab {args.vocab} --seed {args.seed}",
            "kind": "measured (Monte Carlo over requests; +- one standard error); cpu_s: wall time of the "
            "PyTorch reference on a shared CPU, one thread, not a performance number",
            "machine": platform.platform(),
            "torch": torch.__version__,
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "table": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
