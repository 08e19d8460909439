"""``spec-samplers profile``: the modeled cost of one verification call, without a GPU.

Prints the per-call table and the per-launch table (grid, bytes, registers, spills, occupancy,
SASS instructions per vocabulary element by class, modeled memory / issue time) and writes JSON.
Every time printed is **modeled** (docs/cost-model.md), never measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spec_samplers.bench.cost.workloads import DTYPES, WORKLOADS

    p.add_argument("--batch-size", type=int, default=64, help="requests per call (default 64)")
    p.add_argument("--k", type=int, default=4, help="drafts per request (default 4)")
    p.add_argument("--vocab-size", type=int, default=128256, help="vocabulary size (default 128256)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="dtype of the logits (default bfloat16)")
    p.add_argument("--sampler", default="rejection_sampler", help="registered sampler name (default rejection_sampler)")
    p.add_argument("--entry", choices=("logits", "probs"), default="logits", help="ours: logits or probabilities entry")
    p.add_argument(
        "--drafts", choices=("probs", "point"), default="probs", help="probabilistic drafts or point-mass drafts"
    )
    p.add_argument(
        "--workload",
        action="append",
        choices=WORKLOADS,
        help="what to profile (repeatable; default ours): our sampler, our vLLM seams, vLLM's own verification, "
        "or FlashInfer's chain_speculative_sampling with its softmax",
    )
    p.add_argument("--no-sass", action="store_true", help="skip the sm_90 compile (no instruction counts)")
    p.add_argument("--json", metavar="PATH", help="write the full profile (every launch and constant) as JSON")


def _error(message: str) -> int:
    print(f"spec-samplers profile: error: {message}", file=sys.stderr)
    return 2


def cmd_profile(args: argparse.Namespace) -> int:
    from spec_samplers.bench.cost import model, report
    from spec_samplers.bench.cost.workloads import Shape
    from spec_samplers.registry import available_samplers

    for name in ("batch_size", "k", "vocab_size"):
        if getattr(args, name) < 1:
            return _error(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(args, name)}")
    samplers = available_samplers()
    if args.sampler not in samplers:
        return _error(f"--sampler: unknown sampler {args.sampler!r}; available: {', '.join(samplers)}")
    shape = Shape(args.batch_size, args.k, args.vocab_size, args.dtype, args.sampler, args.entry, args.drafts)
    results: list[dict[str, Any]] = []
    for workload in args.workload or ["ours"]:
        try:
            results.append(report.profile(workload, shape, sass=not args.no_sass))
        except (ValueError, NotImplementedError) as exc:  # e.g. an entry the sampler does not have
            return _error(f"{workload}: {exc}")
    print("All times are MODELED (docs/cost-model.md), not measured.\n")
    print(report.table(results))
    for r in results:
        print(f"\n{r['workload']}: launches (modeled)")
        print(report.launch_table(r))
        e = r["eager_ops"]
        print(f"eager ops outside kernels: {e['count']} moving data, {e['vocab_sized']} vocabulary-sized {e['by_op']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"constants": model.constants(), "results": results}, f, indent=1)
        print(f"\nwrote {args.json}")
    return 0
