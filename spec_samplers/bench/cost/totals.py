"""A call's totals (kernels, eager ops, launch latency) on each modeled GPU: one function that the
report and the FlashInfer peer share, kept apart so neither imports the other."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

from spec_samplers.bench.cost import model
from spec_samplers.bench.cost.workloads import DTYPES, Shape


def eager_time(device_s: float, nodes: int, host_s: float | None, latency: model.Latency) -> float:
    """An eager call: the larger of the GPU's work and the host's (the measured host time plus
    ``driver_launch`` per node; unmeasured, ``launch_eager`` per node)."""
    issue_s = host_s + nodes * latency.driver_launch if host_s is not None else nodes * latency.launch_eager
    return max(device_s, issue_s)


def summarize(
    workload: str,
    shape: Shape,
    launches: list[dict[str, Any]],
    eager: list[dict[str, Any]],
    host: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Totals of one call: its launches (with ``modeled`` kernel times) and eager ops at full
    shape, traced on the device path (``worker.compiled``).

    * Nodes: every Triton launch (a request tail measured on its own runs inside the launch
      before it: :mod:`.tails`) and every eager op that launches a kernel (``launches``: the ops
      ``trace.OpCounter`` counts). An eager op's kernel moves its bytes at the bandwidth its grid
      draws, at least the minimum kernel time (:func:`model.eager_op_time`).
    * CUDA graph: one replay (``graph_replay``) plus, per node, ``launch_graph`` and its kernel
      time (both measured on the H200: docs/cost-model.md).
    * Eager: the larger of the GPU's work (kernels, eager ops, ``launch_graph`` per node) and the
      host's: with ``host`` (benchmarks/host_overhead.py's row for this call, **measured** on a
      CPU: Python, planning and dispatch with launches recorded, plus Triton's binder) that time
      plus ``driver_launch`` per node; without it, ``launch_eager`` per node (assumed).

    Each total comes with its low and high ends (``graph_low_s``, ``graph_high_s``...: the
    constants at the ends of their ranges)."""
    kernels_ops = [op for op in eager if op.get("launches", op["bytes_read"] + op["bytes_written"] > 0)]
    itemsize = DTYPES[shape.dtype].itemsize
    design_bytes = (
        model.design_traffic(shape.batch_size, shape.k, shape.vocab_size, itemsize, shape.entry, shape.drafts)
        if workload == "ours"
        else None
    )
    count = sum(not r.get("tail") for r in launches) + len(kernels_ops)
    host_s = (host["host_us"] + host["binder_us"]) * 1e-6 if host else None
    totals: dict[str, Any] = {}
    for name, hw in model.HARDWARE.items():
        floor = model.byte_floor(hw, shape.batch_size, shape.vocab_size, itemsize)
        for end, latency in model.LATENCIES.items():
            key = "kernel_s" if end == "central" else f"kernel_{end}_s"
            kernel_s = sum(
                r["modeled"][name].get(key, r["modeled"][name]["kernel_s"]) for r in launches if "modeled" in r
            )
            eager_s = sum(model.eager_op_time(hw, op, latency) for op in kernels_ops)
            device_s = kernel_s + eager_s + count * latency.launch_graph
            suffix = "" if end == "central" else f"_{end}"
            t = totals.setdefault(name, {})
            t[f"graph{suffix}_s"] = latency.graph_replay + device_s
            t[f"eager{suffix}_s"] = eager_time(device_s, count, host_s, latency)
            t[f"device{suffix}_s"] = device_s
            if end == "central":
                t.update(kernels_s=kernel_s, eager_ops_s=eager_s, floor_s=floor)
        totals[name]["graph_over_floor"] = totals[name]["graph_s"] / floor
        if design_bytes:
            # the bytes the design must move (model.design_traffic) at the bandwidth: for the
            # logits entry every row's softmax statistics need that row, so 2 * B * V does not bound it
            totals[name]["traffic_floor_s"] = design_bytes / hw.bandwidth
            totals[name]["graph_over_traffic_floor"] = totals[name]["graph_s"] / totals[name]["traffic_floor_s"]
    kernel_bytes = sum(r.get("bytes", 0.0) for r in launches)
    vocab_kernel_bytes = sum(r.get("vocab_bytes_loaded", 0.0) for r in launches)
    return {
        "workload": workload,
        "shape": asdict(shape),
        "launches": launches,
        "nodes": count,
        "host": host,
        "eager_ops": {
            "count": len(kernels_ops),
            "vocab_sized": sum(op["vocab_sized"] for op in eager),
            "vocab_tensors_created": sum(op["creates_vocab_tensor"] for op in eager),
            "bytes": sum(op["bytes_read"] + op["bytes_written"] for op in kernels_ops),
            "by_op": dict(Counter(op["name"] for op in eager if op["vocab_sized"])),
            "launching": dict(Counter(op["name"] for op in kernels_ops)),
        },
        "kernel_bytes": kernel_bytes,
        "design_vocab_bytes": design_bytes,
        "counted_vocab_bytes_loaded": vocab_kernel_bytes,
        "modeled": totals,
    }
