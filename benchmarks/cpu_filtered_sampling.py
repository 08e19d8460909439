"""The filtered sampling operations on CPU fp32 rows: ``backend="torch"`` (the PyTorch reference)
against ``backend="auto"`` (the compiled path, ``cpu._filter_kernels``), one thread, timed
interleaved call by call in one process by the thread's CPU time (``time.thread_time``), which a
loaded machine does not stretch.

    python benchmarks/cpu_filtered_sampling.py --json out.json

Each point times ``--calls`` pairs (torch, auto, alternating which goes first) after a warm-up
(the kernels' compilation, cached on disk, is excluded) and reports the median of each; the rows
are softmax(randn * 2) ("peaked": softmax(randn * 8), whose nucleus is small); the tokens
of the two backends are compared once per point (``equal``). A benchmark, never a test.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

import spec_samplers.sampling as S  # noqa: E402


def _ops(B: int, V: int) -> dict[str, Callable[[str], Any]]:
    gen = torch.Generator().manual_seed(B * 7 + V)
    logits = torch.randn(B, V, generator=gen) * 2
    probs = torch.softmax(logits, -1)
    peaked = torch.softmax(logits * 4, -1)  # a sharper row: a small nucleus
    kw: dict[str, Any] = dict(seed=torch.arange(B), offset=torch.zeros(B, dtype=torch.int64))
    return {
        "top_k_sampling_from_probs(k=50)": lambda be: S.top_k_sampling_from_probs(probs, 50, **kw, backend=be),
        "top_p_sampling_from_probs(p=0.9)": lambda be: S.top_p_sampling_from_probs(probs, 0.9, **kw, backend=be),
        "top_p_sampling_from_probs(p=0.9, peaked)": lambda be: S.top_p_sampling_from_probs(
            peaked, 0.9, **kw, backend=be
        ),
        "min_p_sampling_from_probs(p=0.1)": lambda be: S.min_p_sampling_from_probs(probs, 0.1, **kw, backend=be),
        "top_k_top_p_sampling_from_logits(50, 0.9)": lambda be: S.top_k_top_p_sampling_from_logits(
            logits, 50, 0.9, **kw, backend=be
        ),
        "top_k_renorm_probs(k=50)": lambda be: S.top_k_renorm_probs(probs, 50, backend=be),
        "top_p_renorm_probs(p=0.9)": lambda be: S.top_p_renorm_probs(probs, 0.9, backend=be),
        "top_k_mask_logits(k=50)": lambda be: S.top_k_mask_logits(logits, 50, backend=be),
    }


def _cpu_ms(f: Callable[[], Any]) -> float:
    t0 = time.thread_time()
    f()
    return (time.thread_time() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--vocabs", default="32000,128256")
    ap.add_argument("--calls", type=int, default=15, help="timed (torch, auto) pairs per point")
    ap.add_argument("--json", help="write the entries here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    entries = []
    print(f"{'op':46s} {'B':>3s} {'V':>7s} {'torch ms':>9s} {'auto ms':>9s} {'ratio':>6s} equal")
    for V in map(int, args.vocabs.split(",")):
        for B in map(int, args.batch_sizes.split(",")):
            for name, op in _ops(B, V).items():
                equal = torch.equal(op("torch"), op("auto"))  # also the warm-up
                op("auto")
                ref, ours = [], []
                for i in range(args.calls):
                    order = ("torch", "auto") if i % 2 == 0 else ("auto", "torch")
                    for be in order:
                        (ref if be == "torch" else ours).append(_cpu_ms(lambda be=be, op=op: op(be)))
                t_ref, t_ours = statistics.median(ref), statistics.median(ours)
                entries.append(
                    dict(op=name, B=B, V=V, torch_ms=t_ref, auto_ms=t_ours, ratio=t_ref / t_ours, equal=equal)
                )
                print(f"{name:46s} {B:3d} {V:7d} {t_ref:9.3f} {t_ours:9.3f} {t_ref / t_ours:6.1f} {equal}", flush=True)
    if args.json:
        meta = dict(
            machine=platform.platform(),
            processor=platform.processor(),
            cpu_count=os.cpu_count(),
            torch=torch.__version__,
            clock="thread CPU time (time.thread_time), median of --calls interleaved pairs",
            threads=1,
            calls=args.calls,
        )
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, entries=entries), f, indent=1)


if __name__ == "__main__":
    main()
