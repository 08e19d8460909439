"""The CPU samplers against their read floor (issues 23 and 29), PyTorch path, one thread.

Each registered sampler (``--sampler``, repeatable: rejection_sampler, block_verification,
typical_acceptance_sampler) with backend="torch" at B = 64, k = 4, V = 32000, fp32 probabilities;
the drafts put their mass where the target has none, so every request rejects its first draft
(rejection sampling and block verification then recover a token from a full vocabulary row).
Each measurement runs in its own process, which reports:

* ``first_call_s``: the first sampler call of the process (any one-off compilation shows here);
* ``per_call_ms``: the median of ``--calls`` further calls;
* ``read_gb_s``: the read bandwidth the same process measures (``sum`` of a 128 MiB fp32 tensor,
  bytes read / time, best of 5; one thread), and ``copy_gb_s`` (a copy's bytes over its time: it
  reads and writes them, so a floor from it is about twice the read floor, issue 29);
* ``floor_ms``: the rows the sampler must read, at the read bandwidth: rejection sampling one
  target and one draft row per request (2 * B * V * 4 bytes); block verification all 2k rows
  (2 * k * B * V * 4); typical acceptance the k target rows, for their entropies (k * B * V * 4);
  and ``x_floor`` = per_call / floor.

``--before PATH`` / ``--after PATH`` name source trees (PATH/spec_samplers is imported); their
processes alternate (before, after, before, ...) for ``--rounds`` rounds so both see the same
machine load. A benchmark, never a test: nothing is asserted.

    python benchmarks/recovery_floor.py --sampler block_verification --before /tmp/before --after . --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

B, K, V = 64, 4, 32000


#: vocabulary rows per request each sampler must read (see the module docstring)
ROWS_READ = {"rejection_sampler": 2, "block_verification": 2 * K, "typical_acceptance_sampler": K}


def _bandwidths() -> tuple[float, float]:
    """(read, copy) bytes per second on a 128 MiB fp32 tensor, best of 5 each."""
    import torch

    src = torch.ones(32 * 2**20)
    dst = torch.empty_like(src)
    nbytes = src.numel() * 4
    reads, copies = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        src.sum()
        reads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - t0)
    return nbytes / min(reads), nbytes / min(copies)


def _worker(calls: int, name: str) -> dict[str, float]:
    import torch

    torch.set_num_threads(1)
    from spec_samplers.registry import get_sampler

    g = torch.Generator().manual_seed(0)
    half = V // 2
    target = torch.zeros(B, K + 1, V)
    target[..., :half] = torch.softmax(torch.randn(B, K + 1, half, generator=g), -1)
    draft = torch.zeros(B, K, V)
    draft[..., half:] = torch.softmax(4 * torch.randn(B, K, V - half, generator=g), -1)
    ids = draft.argmax(-1)  # where the target has no mass: every request rejects position 0
    bonus = torch.zeros(B, 1, dtype=torch.int64)
    seeds = torch.randint(0, 2**62, (B,), generator=g)
    sampler = get_sampler(name, backend="torch")
    extra = {"seeds": seeds} if name != "typical_acceptance_sampler" else {}

    t0 = time.perf_counter()
    out = sampler(target, bonus, draft, ids, **extra)
    first = time.perf_counter() - t0
    if name == "rejection_sampler":
        assert bool((out[:, 1] == -1).all()), "every request should recover at position 0"
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sampler(target, bonus, draft, ids, **extra)
        times.append(time.perf_counter() - t0)
    read_bw, copy_bw = _bandwidths()
    floor = ROWS_READ[name] * B * V * 4 / read_bw
    per_call = statistics.median(times)
    return dict(
        first_call_s=first,
        per_call_ms=per_call * 1e3,
        floor_ms=floor * 1e3,
        read_gb_s=read_bw / 1e9,
        copy_gb_s=copy_bw / 1e9,
        x_floor=per_call / floor,
    )


def _run(tree: str, calls: int, name: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--calls", str(calls), "--sampler", name]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=os.path.abspath(tree))
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="source tree measured first in each round")
    ap.add_argument("--after", default=".", help="source tree measured second in each round")
    ap.add_argument("--sampler", action="append", choices=sorted(ROWS_READ), help="default: all three")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    samplers = args.sampler or sorted(ROWS_READ)
    if args.worker:
        print(json.dumps(_worker(args.calls, samplers[0])))
        return
    trees = [("before", args.before)] if args.before else []
    trees.append(("after", args.after))
    rows = []
    print(f"backend='torch', B={B}, k={K}, V={V}, fp32, every request rejects its first draft; 1 thread")
    header = ("round", "first call s", "per call ms", "floor ms", "read GB/s", "copy GB/s", "x floor")
    print(f"{'sampler':27} {'tree':7} " + " ".join(f"{h:>{max(5, len(h))}}" for h in header))
    for r in range(args.rounds):
        for name in samplers:
            for tree_name, tree in trees:
                res = _run(tree, args.calls, name)
                rows.append(dict(sampler=name, tree=tree_name, path=tree, round=r, **res))
                print(
                    f"{name:27} {tree_name:7} {r:5d} {res['first_call_s']:12.3f} {res['per_call_ms']:11.2f} "
                    f"{res['floor_ms']:8.2f} {res['read_gb_s']:9.1f} {res['copy_gb_s']:9.1f} {res['x_floor']:7.1f}"
                )
    for name in samplers:
        for tree_name, _ in trees:
            mine = [row for row in rows if row["tree"] == tree_name and row["sampler"] == name]
            print(
                f"{name} {tree_name}: median per call {statistics.median(r['per_call_ms'] for r in mine):.2f} ms, "
                f"median x read floor {statistics.median(r['x_floor'] for r in mine):.1f}, "
                f"max first call {max(r['first_call_s'] for r in mine):.3f} s"
            )
    if args.json:
        with open(args.json, "w") as f:
            shape = dict(B=B, k=K, V=V, dtype="float32", rows_read=ROWS_READ)
            json.dump(dict(shape=shape, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
