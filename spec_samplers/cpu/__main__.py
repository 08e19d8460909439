"""``python -m spec_samplers.cpu``: compile the CPU path's kernels into numba's on-disk cache now
(an install step, or a container build), so that no process pays the compilation on its first
sampler call (tens of seconds on a loaded machine; loading the cache afterwards takes well under
one). Prints the seconds each twin took."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from spec_samplers import cpu
from spec_samplers.layout import VerifyBatch


def main() -> None:
    if cpu.kernels() is None:
        raise SystemExit("numba is not installed: pip install 'spec-samplers[cpu]'")
    B, K, V = 2, 2, 300
    q = torch.softmax(torch.randn(B, K + 1, V), -1)
    p = torch.softmax(torch.randn(B, K, V), -1)
    ids = torch.randint(0, V, (B, K))
    bonus = torch.zeros(B, 1, dtype=torch.int64)
    batch = VerifyBatch.padded(q, bonus, p, ids, seeds=torch.arange(B))
    twins: tuple[tuple[str, Callable[..., torch.Tensor], dict[str, float]], ...] = (
        ("rejection", cpu.rejection_cpu, {}),
        ("block", cpu.block_cpu, {}),
        ("typical", cpu.typical_cpu, {"posterior_threshold": 0.09, "posterior_alpha": 0.3}),
    )
    for name, twin, options in twins:
        t0 = time.perf_counter()
        twin(batch, **options)
        print(f"{name}: {time.perf_counter() - t0:.2f} s")
    # the tree twins (spec_samplers.cpu._tree_kernels), through the samplers' tree entries
    from spec_samplers import BlockVerificationSampler, RejectionSampler, TypicalAcceptanceSampler

    tq = torch.softmax(torch.randn(B, 4, V), -1)
    tids = torch.randint(0, V, (B, 3))
    typical = TypicalAcceptanceSampler(posterior_threshold=0.09, posterior_alpha=0.3)
    trees: tuple[tuple[str, Callable[[], object]], ...] = (
        ("rejection tree", lambda: RejectionSampler().forward_tree(tq, tq, tids, [0, 0, 1], seeds=torch.arange(B))),
        (
            "traversal tree",
            lambda: BlockVerificationSampler().forward_tree(tq, tq, tids, [0, 0, 1], seeds=torch.arange(B)),
        ),
        ("typical tree", lambda: typical.forward_tree(tq, None, tids, [0, 0, 1])),
    )
    for name, run in trees:
        t0 = time.perf_counter()
        run()
        print(f"{name}: {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
