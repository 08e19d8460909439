"""The recovery draw against the memory floor (issue 23), CPU, PyTorch path, one thread.

RejectionSampler(backend="torch") at B = 64, k = 4, V = 32000, fp32 probabilities; the drafts put
their mass where the target has none, so every request rejects its first draft and recovers a
token from a full vocabulary row. Each measurement runs in its own process, which reports:

* ``first_call_s``: the first sampler call of the process (any one-off compilation shows here);
* ``per_call_ms``: the median of ``--calls`` further calls;
* ``floor_ms``: the read floor, one target row and one draft row per request (2 * B * V * 4
  bytes) at the copy bandwidth the same process measures (a 128 MiB tensor copy, bandwidth =
  bytes copied / time), and the ratio per_call / floor.

``--before PATH`` / ``--after PATH`` name source trees (PATH/spec_samplers is imported); their
processes alternate (before, after, before, ...) for ``--rounds`` rounds so both see the same
machine load. A benchmark, never a test: nothing is asserted.

    python benchmarks/recovery_floor.py --before /tmp/rng/before --after . --rounds 3 --json out.json
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


def _worker(calls: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(1)
    from spec_samplers import RejectionSampler

    g = torch.Generator().manual_seed(0)
    half = V // 2
    target = torch.zeros(B, K + 1, V)
    target[..., :half] = torch.softmax(torch.randn(B, K + 1, half, generator=g), -1)
    draft = torch.zeros(B, K, V)
    draft[..., half:] = torch.softmax(4 * torch.randn(B, K, V - half, generator=g), -1)
    ids = draft.argmax(-1)  # where the target has no mass: every request rejects position 0
    bonus = torch.zeros(B, 1, dtype=torch.int64)
    seeds = torch.randint(0, 2**62, (B,), generator=g)
    sampler = RejectionSampler(backend="torch")

    t0 = time.perf_counter()
    out = sampler(target, bonus, draft, ids, seeds=seeds)
    first = time.perf_counter() - t0
    assert bool((out[:, 1] == -1).all()), "every request should recover at position 0"
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sampler(target, bonus, draft, ids, seeds=seeds)
        times.append(time.perf_counter() - t0)

    src = torch.ones(32 * 2**20)
    dst = torch.empty_like(src)
    copies = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - t0)
    bandwidth = src.numel() * 4 / min(copies)  # bytes/s
    floor = 2 * B * V * 4 / bandwidth
    per_call = statistics.median(times)
    return dict(
        first_call_s=first,
        per_call_ms=per_call * 1e3,
        floor_ms=floor * 1e3,
        copy_gb_s=bandwidth / 1e9,
        x_floor=per_call / floor,
    )


def _run(tree: str, calls: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--calls", str(calls)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=os.path.abspath(tree))
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="source tree measured first in each round")
    ap.add_argument("--after", default=".", help="source tree measured second in each round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.calls)))
        return
    trees = [("before", args.before)] if args.before else []
    trees.append(("after", args.after))
    rows = []
    print(f"RejectionSampler(backend='torch'), B={B}, k={K}, V={V}, fp32, every request recovers; 1 thread")
    header = ("round", "first call s", "per call ms", "floor ms", "copy GB/s", "x floor")
    print(f"{'tree':7} " + " ".join(f"{h:>{max(5, len(h))}}" for h in header))
    for r in range(args.rounds):
        for name, tree in trees:
            res = _run(tree, args.calls)
            rows.append(dict(tree=name, path=tree, round=r, **res))
            print(
                f"{name:7} {r:5d} {res['first_call_s']:12.3f} {res['per_call_ms']:11.2f} {res['floor_ms']:8.2f} "
                f"{res['copy_gb_s']:9.1f} {res['x_floor']:7.1f}"
            )
    for name, _ in trees:
        mine = [row for row in rows if row["tree"] == name]
        print(
            f"{name}: median per call {statistics.median(r['per_call_ms'] for r in mine):.2f} ms, "
            f"median x floor {statistics.median(r['x_floor'] for r in mine):.1f}, "
            f"max first call {max(r['first_call_s'] for r in mine):.3f} s"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(shape=dict(B=B, k=K, V=V, dtype="float32"), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
