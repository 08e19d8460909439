"""FlashInfer's ``chain_speculative_sampling`` modeled from its own CUDA source, from bf16 logits.

The kernel (``ChainSpeculativeSampling`` in the flashinfer-python wheel's
``data/include/flashinfer/sampling.cuh``) is compiled with nvcc for sm_90 into a temporary folder
(never into the repository), in the variant its launcher picks on sm_90 for fp32 probabilities
(1024 threads, 4-wide vectors when V % 4 == 0, not deterministic), and read like ours
(:func:`spec_samplers.bench.cost.sass.read_cubin`).

CUDA cannot run in Triton's interpreter, so its traffic is read off the source, per request
(grid (B,), one CTA of 1024 threads each), worst case (first draft rejected): the gathered
accept scalars; pass 1 reads the rejected position's target and draft rows (fp32) to sum
relu(q - p); pass 2 re-reads them up to the sampled token, half the rows on average. The op
takes probabilities, so the softmax it needs is counted too, FlashInfer's own
(``flashinfer.sampling.softmax`` with per-request temperatures: :func:`softmax_launches`) on the
fp32 casts of the target [B(k+1), V] and draft [Bk, V] logits (its softmax takes fp32 only).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from typing import Any

import torch

from spec_samplers.bench.cost import model, sass, trace
from spec_samplers.bench.cost.totals import summarize
from spec_samplers.bench.cost.workloads import DTYPES, Inputs, Shape

THREADS = 1024  # DISPATCH_COMPUTE_CAP_NUM_THREADS for compute capability >= 8
INSTANCE = """#include <flashinfer/sampling.cuh>
using namespace flashinfer::sampling;
void* chain_kernel() {
  return (void*)&ChainSpeculativeSampling<1024, SCAN_ALGO, REDUCE_ALGO, %(vec)d, false, float, int>;
}
"""


def _include_dirs() -> list[str]:
    import flashinfer

    data = os.path.join(os.path.dirname(flashinfer.__file__ or ""), "data")
    dirs = [os.path.join(data, "include")] + [
        os.path.join(data, "cccl", sub) for sub in ("cub", "libcudacxx/include", "thrust")
    ]
    import nvidia  # the CUDA headers pip installs (curand) beside the wheel

    for root in getattr(nvidia, "__path__", []):
        for sub in sorted(os.listdir(root)):
            if os.path.isfile(os.path.join(root, sub, "include", "curand_kernel.h")):
                dirs.append(os.path.join(root, sub, "include"))
    return dirs


@functools.cache
def compile_chain(vec: int) -> bytes:
    """The sm_90 cubin of the kernel variant with ``vec``-wide loads (nvcc, in a temp folder)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("flashinfer-chain: nvcc is not on PATH")
    with tempfile.TemporaryDirectory(prefix="spec-samplers-fi-") as tmp:
        source, cubin = os.path.join(tmp, "chain.cu"), os.path.join(tmp, "chain.cubin")
        with open(source, "w") as f:
            f.write(INSTANCE % {"vec": vec})
        flags = ["-arch=sm_90", "-cubin", "-lineinfo", "-std=c++17", "-w"]
        cmd = [nvcc, *flags, *(f"-I{d}" for d in _include_dirs()), "-o", cubin, source]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"flashinfer-chain: nvcc failed:\n{done.stderr[-3000:]}")
        with open(cubin, "rb") as f:
            return f.read()


#: FlashInfer's ``OnlineSoftmax`` (data/include/flashinfer/sampling.cuh): the vocabulary-split
#: path for at most this many rows at a vocabulary of at least LARGE_VOCAB, in slices of SLICE
SMALL_BATCH_ROWS, LARGE_VOCAB, SLICE = 128, 24576, 8192


def _cast_ops(shape: Shape) -> list[dict[str, Any]]:
    """The eager casts of the engine's logits to the fp32 that FlashInfer's softmax takes (its
    launcher reads ``float*`` only: csrc/sampling.cu ``softmax``), target and draft."""
    B, k, V = shape.batch_size, shape.k, shape.vocab_size
    x = Inputs(torch.device("meta"))
    dtype = DTYPES[shape.dtype]
    ops = trace.EagerOps(V)
    with ops:
        for logits in (x.normal(B * (k + 1), V, dtype=dtype), x.normal(B * k, V, dtype=dtype)):
            logits.float()
    return [vars(op) for op in ops.records]


def softmax_launches(rows: int, vocab: int) -> list[dict[str, Any]]:
    """``flashinfer.sampling.softmax`` of [rows, V] fp32 logits with per-request temperatures,
    its kernels as its launcher picks them (``OnlineSoftmax``): up to 128 rows at a large
    vocabulary, a map kernel over (row, 8192-entry slice) reading the logits once and a reduce
    kernel per row reading them again and writing the probabilities; otherwise one fused kernel
    per row (two reads: the row is not cached in shared memory at this V, one write). Traffic
    read off the source, time memory-bound (no SASS read: CUDA, not compiled here)."""
    row = 4 * vocab
    if rows <= SMALL_BATCH_ROWS and vocab >= LARGE_VOCAB:
        slices = -(-vocab // SLICE)
        parts = [
            ("OnlineSoftmaxMapKernel", [rows, slices], rows * row, 0),
            ("OnlineSoftmaxReduceKernel", [rows], rows * row, rows * row),
        ]
    else:
        parts = [("OnlineSoftmaxFusedKernel", [rows], 2 * rows * row, rows * row)]
    launches = []
    for name, grid, loaded, stored in parts:
        programs = 1
        for g in grid:
            programs *= g
        launch: dict[str, Any] = {
            "name": name,
            "module": "flashinfer (data/include/flashinfer/sampling.cuh, OnlineSoftmax)",
            "grid": grid,
            "programs": programs,
            "num_warps": THREADS // 32,
            "bytes_loaded": float(loaded),
            "bytes_stored": float(stored),
            "vocab_bytes_loaded": float(loaded),
            "vocab_bytes_stored": float(stored),
            "bytes": float(loaded + stored),
            "bytes_source": "read off the CUDA source",
        }
        launch["modeled"] = {
            hw_name: model.launch_range(hw, launch["bytes"], 0.0, programs, THREADS // 32)
            for hw_name, hw in model.HARDWARE.items()
        }
        launches.append(launch)
    return launches


def profile_chain(shape: Shape) -> dict[str, Any]:
    B, k, V = shape.batch_size, shape.k, shape.vocab_size
    vec = next(v for v in (4, 2, 1) if V % v == 0)  # std::gcd(16 / sizeof(float), d)
    read = sass.read_cubin(compile_chain(vec), THREADS // 32, 0)
    row = 4 * V  # one fp32 row
    gathers = B * k * (4 + 4 + 4)  # draft id, q and p per position
    bytes_loaded = gathers + B * 2 * row + B * row  # pass 1: two rows; pass 2: half of two rows
    stored = B * (k + 1) * 4 + 2 * B * 4
    # vocabulary loops in address order: pass 1 (full rows), pass 2 (half); lanes over both tensors
    vocab_loops = [lp for lp in read["loops"] if any(ld["width"] == 4 * vec for ld in lp["loads"])]
    cycles = B * (THREADS // 32) * read["straight"]["issue_cycles"]
    classes: dict[str, float] = {}
    for lp, lanes in zip(vocab_loops, (2 * B * V, B * V)):
        per_thread = sum(ld["width"] for ld in lp["loads"]) / 4
        iterations = lanes / (32 * per_thread)
        cycles += iterations * lp["issue_cycles"]
        for name, n in lp["classes"].items():
            classes[name] = classes.get(name, 0.0) + n * iterations * 32
    launch = {
        "name": "ChainSpeculativeSampling",
        "module": "flashinfer (data/include/flashinfer/sampling.cuh)",
        "grid": [B],
        "programs": B,
        "num_warps": THREADS // 32,
        "bytes_loaded": float(bytes_loaded),
        "bytes_stored": float(stored),
        "vocab_bytes_loaded": float(3 * B * row),
        "vocab_bytes_stored": 0.0,
        "bytes": float(bytes_loaded + stored),
        "bytes_source": "read off the CUDA source (worst case: first draft rejected; pass 2 half the rows)",
        "sass": {k: v for k, v in read.items() if k != "loops"},
        "loops": read["loops"],
        "straight_classes": read["straight"]["classes"],
        "warp_cycles": cycles,
        "vocab_elements": 2 * B * V,
        "per_element": {name: v / (3 * B * V) for name, v in classes.items()},
    }
    launch["modeled"] = {
        name: model.launch_range(hw, launch["bytes"], cycles, B, THREADS // 32, ctas_per_sm=read.get("ctas_per_sm"))
        for name, hw in model.HARDWARE.items()
    }
    softmaxes = softmax_launches(B * (k + 1), V) + softmax_launches(B * k, V)
    return summarize("flashinfer-chain", shape, [*softmaxes, launch], _cast_ops(shape))
