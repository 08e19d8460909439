"""The FlashInfer-compatible sampling operations of two source trees, timed interleaved (issue 23's
"no slower than today at any shape"), CPU PyTorch path, one thread.

Two long-lived worker processes, one per tree (``PYTHONPATH=<tree>``), time the same grid as
``spec-samplers bench sampling --full`` (spec_samplers.bench.sampling_ops.run): for each
(B, V) both workers time every op, in the order before, after, then after, before for the next
point (ABBA), so both trees see the same machine load. Each worker keeps its process (one-off
compilation, if a tree has any, is paid once and excluded by the benchmark's warm-up). The
sort-based PyTorch baseline timed next to each op shows the load: ``torch after/before`` far
from 1 means the two timings saw different machines, so the ratio of ours is read against it.

    python benchmarks/sampling_ops_compare.py --before /tmp/t0 --after . --json out.json

A benchmark, never a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

FULL_BATCH_SIZES = (1, 16, 128, 512)
FULL_VOCABS = (32000, 128256, 152064)


def _worker() -> None:
    import torch

    torch.set_num_threads(1)
    from spec_samplers.bench.sampling_ops import OPS, run

    for line in sys.stdin:
        req = json.loads(line)
        ops = tuple(o for o in req["ops"] if o in OPS) if req.get("ops") else OPS
        res = run(torch.device("cpu"), (req["B"],), (req["V"],), ops, min_time_s=req["min_time"])
        print(json.dumps(res["entries"]), flush=True)


class _Worker:
    def __init__(self, tree: str):
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker"],
            env=env,
            cwd=os.path.abspath(tree),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def time(self, B: int, V: int, ops: list[str], min_time: float) -> list[dict[str, Any]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(dict(B=B, V=V, ops=ops, min_time=min_time)) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="source tree (its spec_samplers is imported)")
    ap.add_argument("--after", default=".", help="source tree")
    ap.add_argument("--batch-sizes", default=",".join(map(str, FULL_BATCH_SIZES)))
    ap.add_argument("--vocabs", default=",".join(map(str, FULL_VOCABS)))
    ap.add_argument("--op", action="append", default=[], help="one op (repeatable; default all)")
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds of repeats per timed point")
    ap.add_argument("--json", help="write every entry of both trees here")
    if "--worker" in sys.argv:
        _worker()
        return
    args = ap.parse_args()
    workers = {"before": _Worker(args.before), "after": _Worker(args.after)}
    points = [(B, V) for V in map(int, args.vocabs.split(",")) for B in map(int, args.batch_sizes.split(","))]
    rows = []
    start = time.perf_counter()
    print("op                                   B       V  before ms  after ms after/before  torch before/after ms")
    for n, (B, V) in enumerate(points):
        order = ["before", "after"] if n % 2 == 0 else ["after", "before"]
        got = {name: workers[name].time(B, V, args.op, args.min_time) for name in order}
        for old, new in zip(got["before"], got["after"], strict=True):
            row = dict(op=old["op"], B=B, V=V, before=old, after=new)
            rows.append(row)
            ratio = new["ours"]["time_s"] / old["ours"]["time_s"]
            base = f"{old['torch']['time_s'] * 1e3:.2f}/{new['torch']['time_s'] * 1e3:.2f}" if "torch" in old else "-"
            print(
                f"{old['op']:34} {B:4d} {V:7d} {old['ours']['time_s'] * 1e3:10.3f} {new['ours']['time_s'] * 1e3:9.3f}"
                f" {ratio:12.2f} {base:>22}",
                flush=True,
            )
    for w in workers.values():
        w.close()
    print(f"wall {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(before=args.before, after=args.after, min_time_s=args.min_time, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
