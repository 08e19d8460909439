"""The time model: per launch max(bytes / bandwidth, issue cycles / issue rate, dependent latency,
minimum duration) + launch latency, with a low-high range from the assumed latency constants.

Every constant is stated with its source; all results are **modeled**, never measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Latency:
    """The model's latency constants, at one end of their range (:data:`LATENCIES`)."""

    #: host cost of one eager launch (a PyTorch op or a Triton kernel call from Python) where the
    #: call's host time was not measured (:func:`eager_host`): assumed, the usual 4-6 us of
    #: PyTorch eager dispatch plus the driver
    launch_eager: float
    #: per kernel node of a CUDA graph replay (back-to-back dependent kernels), on top of the
    #: kernel's own time: measured, 0.73 us on the H200 (benchmarks/gpu_check.py --quick,
    #: ``launch.graph_per_node_us``, 2026-11-28: 20 tiny nodes 24.3 us, 1 node 10.4 us); the
    #: range +-25% (one measurement, one GPU)
    launch_graph: float
    #: fixed cost of one CUDA-graph replay (launch of the graph, the first node's start):
    #: measured, 10.4 us for a one-node graph less its node, 9.7 us (same run); range +-15%
    graph_replay: float
    #: driver cost of one launch on the host (``cudaLaunchKernel``), added to the measured host
    #: time of a call whose launches were recorded, not run (benchmarks/host_overhead.py):
    #: assumed, 2-4 us (public microbenchmarks of cudaLaunchKernel on x86 hosts)
    driver_launch: float
    #: the least time a kernel occupies the GPU however little it does (block scheduling, the
    #: drain at its end): assumed, what profilers show for one-block kernels on Hopper; a lead
    min_kernel: float
    #: cycles of one dependent round trip to L2 (atomics resolve there; a tail's loads of the
    #: partials other programs stored hit there): about 200-260 cycles on H100 (public
    #: microbenchmarks: Chips and Cheese, "Nvidia's H100: Funny L2, and Tons of Bandwidth", 2023)
    l2_cycles: float
    #: cycles of a DRAM load: about 600 on H100 (same sources); with Little's law it bounds the
    #: bandwidth a few warps can draw (:func:`launch_time`)
    dram_cycles: float


#: (low, central, high): the ends of each assumed constant's plausible range and its middle
LATENCIES = {
    "low": Latency(
        launch_eager=4e-6,
        launch_graph=0.55e-6,
        graph_replay=8.2e-6,
        driver_launch=2e-6,
        min_kernel=1.0e-6,
        l2_cycles=200,
        dram_cycles=500,
    ),
    "central": Latency(
        launch_eager=5e-6,
        launch_graph=0.73e-6,
        graph_replay=9.7e-6,
        driver_launch=2.5e-6,
        min_kernel=1.5e-6,
        l2_cycles=260,
        dram_cycles=600,
    ),
    "high": Latency(
        launch_eager=6e-6,
        launch_graph=0.91e-6,
        graph_replay=11.2e-6,
        driver_launch=4e-6,
        min_kernel=2.5e-6,
        l2_cycles=400,
        dram_cycles=800,
    ),
}


@dataclass(frozen=True)
class Hardware:
    name: str
    bandwidth: float  # bytes/s, DRAM, reads + writes
    bandwidth_source: str
    sms: int
    sms_source: str
    clock: float  # Hz, SM clock
    clock_source: str
    #: warp instructions issued per cycle per SM (4 sub-partitions, one scheduler each issuing
    #: one instruction a cycle: CUDA C++ Programming Guide, compute capability 9.0)
    issue_per_sm: int = 4
    #: cycles before a warp's next dependent FP32/integer instruction may issue (4 on Volta to
    #: Hopper: Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking",
    #: 2018; Luo et al., "Benchmarking and Dissecting the Nvidia Hopper GPU Architecture", 2024)
    dependent_issue_cycles: int = 4
    #: independent instructions a warp has ready per cycle in our unrolled loop bodies: assumed
    ilp: int = 2
    #: L1 data cache and shared memory per SM (cc 9.0: 256 KB; Programming Guide): spills that fit
    #: stay there, the rest go to L2/DRAM
    l1_bytes: int = 256 * 1024
    #: how much more than its even share (bandwidth / SMs) of DRAM bandwidth one SM draws when
    #: few SMs stream: fitted to one published point, vLLM PR #34974's recovered-token kernel
    #: after the PR (48 programs, about 29 us measured; the even share gives 53 us): so that
    #: point is no independent check of it (benchmarks/results/*-cost-calibration.json); a lead
    #: for gpu_check --quick at B = 1
    sm_bandwidth_factor: float = 1.8


H100 = Hardware(
    "H100",
    3.0e12,
    "device-to-device copy measured on this workplace's H100 80GB HBM3, 2026-11-13 "
    "(/work/.library/device/KINDS.md); datasheet 3.35e12",
    132,
    "PyTorch multi_processor_count on that H100 (KINDS.md)",
    1.98e9,
    "SM clock read by nvidia-smi under load on the same chip (H200, KINDS.md 2026-10-28); H100 SXM "
    "datasheet max boost 1.98 GHz",
)
H200 = Hardware(
    "H200",
    4.3e12,
    "device-to-device copy measured on this workplace's H200, 2026-10-28 and 2026-11-04 (KINDS.md); datasheet 4.8e12",
    132,
    "PyTorch multi_processor_count on the H200 (KINDS.md)",
    1.98e9,
    "SM clock read by nvidia-smi under load (KINDS.md 2026-10-28)",
)
HARDWARE = {"H100": H100, "H200": H200}


def launch_time(
    hw: Hardware,
    bytes_moved: float,
    warp_cycles: float,
    programs: int,
    num_warps: int,
    *,
    ctas_per_sm: int | None = None,
    inflight_per_warp: float | None = None,
    local_bytes_per_thread: int = 0,
    dependent_rounds: int = 0,
    latency: Latency = LATENCIES["central"],
    standalone: bool = True,
) -> dict[str, float]:
    """Seconds of one kernel launch without its launch latency, at least ``latency.min_kernel``
    when ``standalone`` (a tail measured on its own runs inside its launch: no minimum).

    * Memory: a grid of fewer programs than SMs draws that fraction of the bandwidth (one CTA per
      SM), times ``sm_bandwidth_factor`` (an SM alone draws more than its even share); and by
      Little's law no more than the bytes its resident warps keep in flight
      (``inflight_per_warp``: one iteration's loads of its vocabulary loop) per DRAM latency.
      Spills beyond L1 (``local_bytes_per_thread`` of every resident thread over the SM's L1) are
      stored and loaded once each through DRAM.
    * Issue: the warp cycles spread over the SMs the grid occupies and the sub-partitions its
      resident warps fill (at most 4), at an efficiency of min(1, warps per scheduler * ilp /
      dependent-issue cycles): one warp per scheduler issues every other cycle.
    * Dependent latency: ``dependent_rounds`` L2 round trips in a row (a tail: its arrival atomic,
      then each load of what the other programs stored)."""
    used_sms = max(1, min(hw.sms, programs))
    per_sm = -(-programs // used_sms)
    resident = max(1, min(per_sm, ctas_per_sm or per_sm) * num_warps)  # warps on one SM at once
    stack = local_bytes_per_thread * 32 * resident
    spill = 2 * local_bytes_per_thread * 32 * num_warps * programs if stack > hw.l1_bytes else 0.0
    bandwidth = hw.bandwidth * min(1.0, used_sms * hw.sm_bandwidth_factor / hw.sms)
    if inflight_per_warp:
        bandwidth = min(bandwidth, used_sms * resident * inflight_per_warp * hw.clock / latency.dram_cycles)
    memory = (bytes_moved + spill) / bandwidth
    partitions = min(hw.issue_per_sm, resident)
    efficiency = min(1.0, resident / partitions * hw.ilp / hw.dependent_issue_cycles)
    issue = warp_cycles / (used_sms * partitions * hw.clock * efficiency)
    dependent = dependent_rounds * latency.l2_cycles / hw.clock
    kernel = max(memory, issue, dependent, latency.min_kernel if standalone else 0.0)
    return {"memory_s": memory, "issue_s": issue, "latency_s": dependent, "spill_bytes": spill, "kernel_s": kernel}


def launch_range(hw: Hardware, *args: Any, **kwargs: Any) -> dict[str, float]:
    """:func:`launch_time` at the central latency constants, with ``kernel_low_s`` and
    ``kernel_high_s`` at the ends of their ranges (:data:`LATENCIES`)."""
    out = launch_time(hw, *args, **kwargs)
    for end in ("low", "high"):
        out[f"kernel_{end}_s"] = launch_time(hw, *args, **kwargs, latency=LATENCIES[end])["kernel_s"]
    return out


def eager_op_time(hw: Hardware, op: dict[str, Any], latency: Latency = LATENCIES["central"]) -> float:
    """Seconds of one eager PyTorch op on the GPU (launch latency apart): its bytes at the
    bandwidth its grid draws (``blocks``: fewer blocks than SMs draw that fraction; None: a full
    grid), at least ``latency.min_kernel``."""
    blocks = op.get("blocks")
    share = min(1.0, blocks * hw.sm_bandwidth_factor / hw.sms) if blocks else 1.0
    return max((op["bytes_read"] + op["bytes_written"]) / (hw.bandwidth * share), latency.min_kernel)


def byte_floor(hw: Hardware, batch_size: int, vocab_size: int, itemsize: int) -> float:
    """2 * B * V * itemsize / bandwidth (issue 19's floor: one target and one draft row per request)."""
    return 2 * batch_size * vocab_size * itemsize / hw.bandwidth


def design_traffic(batch_size: int, k: int, vocab_size: int, itemsize: int, entry: str, drafts: str) -> float:
    """Vocabulary bytes docs/design.md section 6 says a verification call must read (worst case:
    every request recovers): probabilities, the rejected position's target and draft rows
    (2 * B * V * itemsize); logits, every row once for its softmax statistics (B * k target rows
    and, with draft logits, B * k draft rows) plus the recovery pass re-reading the rejected rows."""
    rows = 2 if drafts == "probs" else 1
    recovery = rows * batch_size * vocab_size * itemsize
    if entry == "probs":
        return recovery
    return rows * batch_size * k * vocab_size * itemsize + recovery


def constants() -> dict[str, Any]:
    return {
        **{name: asdict(hw) for name, hw in HARDWARE.items()},
        "latency": {k: asdict(v) for k, v in LATENCIES.items()},
    }
