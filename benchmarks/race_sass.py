"""Registers, spills and SASS instructions per vocabulary element of the rejection sampler's kernels,
compiled for sm_90 without a GPU (Triton's compiler and the cuobjdump in the triton wheel), and the
recovery pass's MODELED time on an H100 against its bytes' time (issue 23 / issue 19).

Run with PYTHONPATH at the tree to measure (TRITON_INTERPRET unset), e.g.

    PYTHONPATH=/tmp/before python benchmarks/race_sass.py --json before.json
    PYTHONPATH=. python benchmarks/race_sass.py --json after.json

Shape: padded, probabilities with a draft distribution, B = 64, k = 4, V = 128256, the launcher's
vocabulary split for an H100 (132 SMs). The vocabulary loop is the innermost backward branch of the
partials kernel with the most instructions; instructions per element = its body / elements per
thread per step (BLOCK_V / (32 * num_warps)). Modeled time (labelled so everywhere): per element,
max(bytes / 3.35 TB/s, instructions / 30.4e12 lane-instructions/s = 132 SMs x 4 schedulers x 32
lanes x 1.8 GHz); a benchmark, nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from kernel_compile_check import TARGET, signature  # noqa: E402

from spec_samplers.kernels.backend import plan_vocab_split  # noqa: E402
from spec_samplers.kernels.verify_launch import REJECTION, plan_verify  # noqa: E402
from spec_samplers.layout import VerifyBatch  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
LANE_ISSUE = 132 * 4 * 32 * 1.8e9  # lane-instructions/s, H100 SXM at 1.8 GHz
HBM = 3.35e12  # bytes/s, H100 SXM


def _batch(dtype: torch.dtype, logits: bool = False) -> VerifyBatch:
    B, K, V = 64, 4, 128256
    meta = dict(device="meta")
    i64 = dict(dtype=torch.int64, **meta)
    # logits inputs add the fused softmax's statistics launches (softmax_partials, softmax_combine)
    extra = dict(temperature=torch.empty(B, dtype=torch.float32, **meta)) if logits else {}
    return VerifyBatch.padded(
        torch.empty(B, K + 1, V, dtype=dtype, **meta),
        torch.empty(B, 1, **i64),
        torch.empty(B, K, V, dtype=dtype, **meta),
        torch.empty(B, K, **i64),
        seeds=torch.empty(B, **i64),
        offsets=torch.empty(B, **i64),
        **extra,
    )


def _divisibility(kernel, args) -> dict:
    """The ``tt.divisibility = 16`` hints Triton's launcher gives a real call: every tensor (torch
    allocations are 16-byte aligned) and every int argument that is a multiple of 16, except the
    ``do_not_specialize`` ones; nested tuples addressed by path."""
    skip = set(getattr(kernel, "do_not_specialize", ()))
    attrs = {}

    def walk(value, path):
        if isinstance(value, tuple):
            for k, v in enumerate(value):
                walk(v, path + (k,))
        elif isinstance(value, torch.Tensor) or (
            isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0
        ):
            attrs[path] = [["tt.divisibility", 16]]

    constexprs = set(kernel.constexprs)
    for i, name in enumerate(kernel.arg_names):
        if i in constexprs or name in skip or i in skip:
            continue
        walk(args[name], (i,))
    return attrs


def _loop_body(sass: str) -> int:
    """Instructions of the largest innermost loop: a backward BRA to a label, body = the lines
    between the label and the branch."""
    lines = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    addr = [int(re.search(r"/\*([0-9a-f]{4,})\*/", ln).group(1), 16) for ln in lines]
    best = 0
    for i, ln in enumerate(lines):
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", ln)
        if not m:
            continue
        label = re.search(r"\.L_x_(\d+)", ln)
        if label:
            target_line = next((k for k, s in enumerate(lines) if f".L_x_{label.group(1)}:" in s), None)
            target = addr[target_line] if target_line is not None else None
        else:
            target = int(m.group(1), 16)
        if target is not None and target < addr[i]:
            body = sum(1 for a in addr if target <= a <= addr[i])
            best = max(best, body)
    return best


def measure(dtype: torch.dtype, logits: bool = False) -> list[dict]:
    batch = _batch(dtype, logits)
    split = plan_vocab_split(batch.layout.vocab_size, batch.layout.batch_size, 4 * 132, 1024)
    rows = []
    for launch in plan_verify(batch, REJECTION, split)[0]:
        sig, consts = signature(launch.kernel, launch.args)
        opts = dict(launch.options or {}, num_warps=launch.num_warps)
        src = ASTSource(
            fn=launch.kernel, signature=sig, constexprs=consts, attrs=_divisibility(launch.kernel, launch.args)
        )
        kernel = triton.compile(src, target=TARGET, options=opts)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
            res = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        regs = re.search(r"REG:(\d+)", res)
        local = re.search(r"LOCAL:(\d+)", res)  # spill/stack bytes per thread
        row = dict(
            kernel=launch.name,
            dtype=str(dtype).split(".")[-1],
            registers=int(regs.group(1)) if regs else None,
            local_bytes=int(local.group(1)) if local else None,
        )
        row["sass_instructions"] = sum(1 for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln))
        if "partials" in launch.name and "argmax" not in launch.name:
            per_thread = launch.args["BLOCK_V"] // (32 * launch.num_warps)
            body = _loop_body(sass)
            per_elem = body / per_thread
            # a q and a p entry; the softmax statistics read one logits row per program
            rows_read = 1 if launch.name == "softmax_partials" else 2
            bytes_per_elem = rows_read * torch.empty(0, dtype=dtype).element_size()
            t_bytes = bytes_per_elem / HBM
            t_instr = per_elem / LANE_ISSUE
            row.update(
                loop_body=body,
                elements_per_thread_step=per_thread,
                instructions_per_element=round(per_elem, 2),
                modeled_x_bytes_time=round(max(t_bytes, t_instr) / t_bytes, 3),
            )
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--logits", action="store_true", help="logits inputs (adds the softmax statistics launches)")
    args = ap.parse_args()
    rows = measure(torch.bfloat16, args.logits) + measure(torch.float32, args.logits)
    for r in rows:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(tree=os.environ.get("PYTHONPATH", ""), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
