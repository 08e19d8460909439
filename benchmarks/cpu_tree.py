"""Tree verification on CPU: the PyTorch references (``backend="torch"``) against the compiled
twins (``backend="auto"``, spec_samplers.cpu._tree_kernels), one thread, interleaved call by call
in one process, timed by the calling thread's CPU time (``time.thread_time``: a loaded machine does
not stretch it).

Tree: 2 levels x 3 children (N = 12 nodes: 3 children of the root, 3 under each), fp32
probabilities [B, N+1, V]; draft rows near the target (softmax of the target's logits plus noise
0.3: deep acceptance) or far from it (independent logits: sibling rejections, residual passes).
Tokens are drawn from each node's parent's draft row (typical acceptance: from the target's).
Samplers: RejectionSampler (recursive rejection sampling), BlockVerificationSampler (Traversal
Verification), TypicalAcceptanceSampler (Medusa's tree rule).

    PYTHONPATH=. python benchmarks/cpu_tree.py [--batch 1 --batch 8 ...] [--vocab 32000 ...] [--json F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from spec_samplers import BlockVerificationSampler, RejectionSampler, TypicalAcceptanceSampler

CLOCK = time.thread_time
#: parents of the 2-levels-x-3-children tree
PARENTS = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
#: the walk samplers: recursive rejection sampling, Traversal Verification (block verification's tree rule)
WALKS: dict[str, type] = {"rejection": RejectionSampler, "block": BlockVerificationSampler}
#: (sampler, drafts) of each table row
ROWS = (("rejection", "near"), ("rejection", "far"), ("block", "near"), ("block", "far"), ("typical", "target"))


def interleaved(fns: dict[str, Callable[[], object]], budget_s: float) -> tuple[dict[str, float], int]:
    """(median thread CPU seconds of each function called in turn, rounds): one warm call each,
    then rounds until ``budget_s`` of CPU time is spent (3 to 50 rounds)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    spent = 0.0
    rounds = 0
    while rounds < 3 or (spent < budget_s and rounds < 50):
        for name, fn in fns.items():
            t0 = CLOCK()
            fn()
            dt = CLOCK() - t0
            times[name].append(dt)
            spent += dt
        rounds += 1
    return {name: statistics.median(ts) for name, ts in times.items()}, rounds


def workload(B: int, V: int, draft: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(target, draft, tokens, seeds): [B, N+1, V] fp32 rows, [B, N] tokens, [B] seeds."""
    g = torch.Generator().manual_seed(seed)
    N = len(PARENTS)
    x = torch.randn(B, N + 1, V, generator=g) * 2.0
    q = torch.softmax(x, -1)
    if draft == "near":
        p = torch.softmax(x + 0.3 * torch.randn(B, N + 1, V, generator=g), -1)
    else:
        p = torch.softmax(torch.randn(B, N + 1, V, generator=g) * 2.0, -1)
    rows = (q if draft == "target" else p)[:, PARENTS]  # [B, N, V]: each node's parent's row
    tokens = torch.multinomial(rows.reshape(B * N, V), 1, generator=g).reshape(B, N)
    seeds = torch.randint(0, 2**62, (B,), generator=g)
    return q, p, tokens, seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, action="append", help="B (default 1, 8, 32)")
    parser.add_argument("--vocab", type=int, action="append", help="V (default 32000, 128256)")
    parser.add_argument("--budget", type=float, default=1.5, help="CPU seconds per row (default 1.5)")
    parser.add_argument("--json", help="write the rows and the machine here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    print("| sampler | drafts | B | V | torch ms | auto ms | ratio | rounds |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for V in args.vocab or [32000, 128256]:
        for B in args.batch or [1, 8, 32]:
            for sampler, drafts in ROWS:
                q, p, tokens, seeds = workload(B, V, drafts)
                fns: dict[str, Callable[[], object]] = {}
                for backend in ("torch", "auto"):
                    if sampler in WALKS:
                        s: Any = WALKS[sampler](backend=backend)
                        fns[backend] = lambda s=s, q=q, p=p, t=tokens, r=seeds: s.forward_tree(
                            q, p, t, PARENTS, seeds=r
                        )
                    else:
                        s = TypicalAcceptanceSampler(backend=backend, posterior_threshold=0.09, posterior_alpha=0.3)
                        fns[backend] = lambda s=s, q=q, t=tokens: s.forward_tree(q, None, t, PARENTS)
                a, b = fns["torch"](), fns["auto"]()
                assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.node_ids, b.node_ids)
                med, rounds = interleaved(fns, args.budget)
                row = {
                    "sampler": sampler,
                    "drafts": drafts,
                    "B": B,
                    "V": V,
                    "torch_ms": med["torch"] * 1e3,
                    "auto_ms": med["auto"] * 1e3,
                    "ratio": med["torch"] / med["auto"],
                    "rounds": rounds,
                    "mean_accepted": float((a.node_ids >= 1).sum(1).double().mean()),
                }
                rows.append(row)
                print(
                    f"| {sampler} | {drafts} | {B} | {V} | {row['torch_ms']:.3f} | {row['auto_ms']:.3f} "
                    f"| {row['ratio']:.1f}x | {rounds} |",
                    flush=True,
                )
    if args.json:
        machine = {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "loadavg": os.getloadavg(),
        }
        with open(args.json, "w") as f:
            out = {"command": " ".join(sys.argv), "tree_parents": PARENTS, "clock": "thread_time", "machine": machine}
            json.dump({**out, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
