"""Measured: a CPU LM-head product as ``F.linear``, as the streamed form ``weight @ rows.T`` (one
row padded to two) and by the compiled kernel (``spec_samplers.cpu.head_rows``, numba), the
choices behind ``integrations.transformers.HEAD_KERNEL_ROWS`` and ``HEAD_STREAM_ROWS``.

For each head [V, H] (random fp32) and row count, the three are timed in turns (thread CPU time,
``--threads`` torch threads, median of ``--calls``); printed as "F.linear's time / the streamed
form's, the faster of those / the kernel's" (above 1: the second is faster). A benchmark: nothing
is asserted.

    python benchmarks/head_product.py --shapes 32000x512 32000x1024 --rows 1 2 4 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def streamed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    if rows == 1:
        x = torch.cat([x, x.new_zeros(1, x.shape[1])])
    return (weight @ x.T).T[:rows].contiguous()


def kernel(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    from spec_samplers import cpu

    return cpu.head_rows(weight, x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["32000x512", "32000x768", "32000x1024", "32000x2048"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 8, 16])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from spec_samplers import cpu
    from spec_samplers.cpu import _warm as cpu_warm

    assert cpu._import_kernels() is not None, "the kernel column needs numba"
    cpu_warm.compile_ahead()
    print(f"torch {torch.__version__}, {args.threads} thread(s), load {os.getloadavg()[0]:.1f}")
    print("| head [V, H] | " + " | ".join(f"{r} rows" for r in args.rows) + " |")
    print("|---|" + "---|" * len(args.rows))
    for shape in args.shapes:
        V, H = map(int, shape.split("x"))
        weight = torch.randn(V, H)
        cells = []
        for rows in args.rows:
            x = torch.randn(rows, H)
            times: dict[str, list[float]] = {"linear": [], "streamed": [], "kernel": []}
            forms = (("linear", torch.nn.functional.linear), ("streamed", streamed), ("kernel", kernel))
            for call in range(args.calls + 1):
                for name, fn in forms:
                    start = time.thread_time()
                    fn(x, weight)
                    if call:  # (the first call of each warms up)
                        times[name].append(time.thread_time() - start)
            med = {name: statistics.median(ts) for name, ts in times.items()}
            cells.append(
                f"{med['linear'] / med['streamed']:.2f}, {min(med['linear'], med['streamed']) / med['kernel']:.2f}"
            )
        print(f"| {V} x {H} | " + " | ".join(cells) + " |", flush=True)
    print(f"load after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
