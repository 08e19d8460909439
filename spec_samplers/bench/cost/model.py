"""The time model: per launch max(bytes / bandwidth, issue cycles / issue rate) + launch latency.

Every constant is stated with its source; all results are **modeled**, never measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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
    #: host cost of one eager launch (a PyTorch op or a Triton kernel call from Python): assumed,
    #: the usual 4-6 us of PyTorch eager dispatch plus the driver; a lead to measure on a GPU
    launch_eager: float = 5e-6
    #: per kernel node of a CUDA graph replay (back-to-back dependent kernels): assumed; a lead
    launch_graph: float = 1e-6


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
    hw: Hardware, bytes_moved: float, warp_cycles: float, programs: int, num_warps: int
) -> dict[str, float]:
    """Seconds of one kernel launch without its launch latency.

    Memory: a grid of fewer programs than SMs draws that fraction of the bandwidth (one CTA per
    SM). Issue: the warp cycles spread over the SMs the grid occupies and the sub-partitions its
    warps fill (at most 4)."""
    used_sms = max(1, min(hw.sms, programs))
    memory = bytes_moved / (hw.bandwidth * used_sms / hw.sms)
    warps_per_sm = max(1, -(-programs // used_sms) * num_warps)
    partitions = min(hw.issue_per_sm, warps_per_sm)
    issue = warp_cycles / (used_sms * partitions * hw.clock)
    return {"memory_s": memory, "issue_s": issue, "kernel_s": max(memory, issue)}


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
    return {name: asdict(hw) for name, hw in HARDWARE.items()}
