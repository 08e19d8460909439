"""A call's totals (kernels, eager ops, launch latency) on each modeled GPU: one function that the
report and the FlashInfer peer share, kept apart so neither imports the other."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

from spec_samplers.bench.cost import model
from spec_samplers.bench.cost.workloads import DTYPES, Shape


def summarize(
    workload: str, shape: Shape, launches: list[dict[str, Any]], eager: list[dict[str, Any]]
) -> dict[str, Any]:
    """Totals of one call: its launches (with ``modeled`` kernel times) and eager ops at full
    shape; eager ops move their bytes at the bandwidth their grid draws
    (:func:`model.eager_op_time`), every launch and data-moving op pays the launch latency (eager
    or CUDA-graph), except a request tail measured on its own (it runs inside the launch before
    it: :mod:`.tails`). Each total comes with its low and high ends (``graph_low_s``,
    ``graph_high_s``...: the assumed latency constants at the ends of their ranges)."""
    moving = [op for op in eager if op["bytes_read"] + op["bytes_written"] > 0]
    itemsize = DTYPES[shape.dtype].itemsize
    design_bytes = (
        model.design_traffic(shape.batch_size, shape.k, shape.vocab_size, itemsize, shape.entry, shape.drafts)
        if workload == "ours"
        else None
    )
    totals: dict[str, Any] = {}
    for name, hw in model.HARDWARE.items():
        count = sum(not r.get("tail") for r in launches) + len(moving)
        floor = model.byte_floor(hw, shape.batch_size, shape.vocab_size, itemsize)
        ends = {}
        for end, latency in model.LATENCIES.items():
            key = "kernel_s" if end == "central" else f"kernel_{end}_s"
            kernel_s = sum(
                r["modeled"][name].get(key, r["modeled"][name]["kernel_s"]) for r in launches if "modeled" in r
            )
            eager_s = sum(model.eager_op_time(hw, op, latency) for op in moving)
            ends[end] = (kernel_s, eager_s, latency)
        kernel_s, eager_s, latency = ends["central"]
        totals[name] = {
            "eager_s": kernel_s + eager_s + count * latency.launch_eager,
            "graph_s": kernel_s + eager_s + count * latency.launch_graph,
            "kernels_s": kernel_s,
            "eager_ops_s": eager_s,
            "floor_s": floor,
        }
        for end in ("low", "high"):
            k_s, e_s, lat = ends[end]
            totals[name][f"graph_{end}_s"] = k_s + e_s + count * lat.launch_graph
            totals[name][f"eager_{end}_s"] = k_s + e_s + count * lat.launch_eager
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
        "eager_ops": {
            "count": len(moving),
            "vocab_sized": sum(op["vocab_sized"] for op in eager),
            "vocab_tensors_created": sum(op["creates_vocab_tensor"] for op in eager),
            "bytes": sum(op["bytes_read"] + op["bytes_written"] for op in moving),
            "by_op": dict(Counter(op["name"] for op in eager if op["vocab_sized"])),
        },
        "kernel_bytes": kernel_bytes,
        "design_vocab_bytes": design_bytes,
        "counted_vocab_bytes_loaded": vocab_kernel_bytes,
        "modeled": totals,
    }
