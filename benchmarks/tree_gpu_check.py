"""GPU check of the tree kernels (no GPU was lent when they were written): on CUDA, the Triton
tree kernels give the PyTorch references' tokens at realistic shapes (every policy, probabilities
and logits, bf16, the typical rule), and one timing line per case (reference vs kernel, CUDA
events, median of repeats).

    python benchmarks/tree_gpu_check.py [--vocab 32000 --vocab 128256] [--batch 64]

Exit status 1 if any case disagrees."""

from __future__ import annotations

import argparse
import functools
import statistics
import sys

import torch

from spec_samplers import RejectionSampler, TypicalAcceptanceSampler
from spec_samplers.decoding.tree_drafting import as_tree_shape, static_parents

SHAPES = {"2,2,1": [2, 2, 1], "4,2,1": [4, 2, 1]}


def inputs(B: int, parents: list[int], V: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    N = len(parents)
    logits = torch.randn(B, N + 1, V, device="cuda", generator=gen) * 3
    draft_logits = logits + torch.randn(B, N + 1, V, device="cuda", generator=gen)
    p = torch.softmax(draft_logits, -1)
    tokens = torch.multinomial(p[:, torch.tensor(parents, device="cuda")].reshape(-1, V), 1, generator=gen)
    seeds = torch.randint(0, 2**62, (B,), device="cuda", generator=gen)
    return logits.to(dtype), draft_logits.to(dtype), tokens.view(B, N), seeds


def _ms(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def check_shape(V: int, name: str, parents: list[int], dtype: torch.dtype, B: int) -> int:
    """All cases of one (V, tree, dtype); prints a line each; returns how many differ."""
    logits, draft_logits, tokens, seeds = inputs(B, parents, V, dtype, seed=V + len(parents))
    q, p = torch.softmax(logits.float(), -1), torch.softmax(draft_logits.float(), -1)
    t = torch.rand(B, device="cuda") + 0.5
    t[::7] = 0.0
    failures = 0
    for policy in ("independent", "without_replacement", "deterministic"):
        for kind in ("probs", "logits"):

            def call(s: RejectionSampler, kind: str = kind, policy: str = policy) -> object:
                if kind == "probs":
                    return s.forward_tree(q, p, tokens, parents, policy, seeds=seeds, max_depth=3)
                return s.forward_tree_from_logits(
                    logits, draft_logits, tokens, parents, t, policy, seeds=seeds, max_depth=3
                )

            ref_s, ker_s = RejectionSampler(backend="torch"), RejectionSampler(backend="triton")
            ref, ker = call(ref_s), call(ker_s)
            same = all(torch.equal(a, b) for a, b in zip(ref, ker))  # type: ignore[call-overload]
            failures += not same
            print(
                f"V={V} tree {name} {str(dtype)[6:]} {policy} {kind}: {'equal' if same else 'DIFFERENT'}; "
                f"reference {_ms(functools.partial(call, ref_s)):.2f} ms, "
                f"kernel {_ms(functools.partial(call, ker_s)):.2f} ms"
            )
    ref = TypicalAcceptanceSampler(backend="torch").forward_tree(q, None, tokens, parents, max_depth=3)
    ker = TypicalAcceptanceSampler(backend="triton").forward_tree(q, None, tokens, parents, max_depth=3)
    same = torch.equal(ref.token_ids, ker.token_ids)
    print(f"V={V} tree {name} {str(dtype)[6:]} typical: {'equal' if same else 'DIFFERENT'}")
    return failures + (not same)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, action="append")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("tree_gpu_check: needs a CUDA device", file=sys.stderr)
        return 2
    failures = 0
    for V in args.vocab or [32000, 128256]:
        for name, branching in SHAPES.items():
            parents = static_parents(as_tree_shape(branching))
            for dtype in (torch.float32, torch.bfloat16):
                failures += check_shape(V, name, parents, dtype, args.batch)
    print(f"{failures} case(s) differ")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
