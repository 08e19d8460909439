"""Each launched kernel variant compiled for sm_90 and its SASS read, without a GPU.

:func:`variant` specialises a recorded launch exactly as Triton's runtime would (its own binder:
argument types, 16-byte alignment and divisibility, constexprs); :func:`compile_variant` runs
Triton's compiler for sm_90 and reads the cubin with the ``cuobjdump`` / ``nvdisasm`` that ship in
the triton wheel: registers, stack (spills), shared memory, occupancy, and the loops of the SASS.

The straight-line code (outside every loop) is counted once per warp of every program (an upper
bound: early exits and cold paths included). A *vocabulary loop* is an innermost loop (a backward
branch) holding a global load; its body's instructions are counted by class, and the source line
of each load (the SASS line table) ties the loop to the interpreter's per-line lane counts
(:mod:`.counting`).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

#: cc 9.0 SM limits (CUDA C++ Programming Guide, "Compute capabilities", table of technical specs)
REGISTERS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
MAX_CTAS_PER_SM = 32
SHARED_PER_SM = 228 * 1024
REGISTER_ALLOCATION_UNIT = 256  # registers per warp, allocated in units of 256

#: issue cycles of one warp instruction on one SM sub-partition, by pipe, for cc 9.0: 32 lanes over
#: the per-SM results per clock of the Programming Guide's arithmetic-throughput table divided by
#: the 4 sub-partitions (FP32 add/mul/fma 128 -> 1; 32-bit integer multiply 64 -> 2; FP64 64 -> 2;
#: MUFU (exp2, log2, rcp, rsqrt, sin, cos) 16 -> 8); every other instruction: 1 issue cycle.
PIPE_CYCLES = {"int_mul": 2, "fp64": 2, "mufu": 8}

_FP32 = {"FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "FSET", "FCHK", "FRND", "FSWZADD"}
_FP64 = {"DADD", "DMUL", "DFMA", "DSETP", "DMNMX"}


def triton_tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


@functools.cache
def sm90_binder(kernel: Any) -> tuple[Any, Any]:
    """(backend, binder) of a Triton kernel for an sm_90 target: what ``JITFunction.run`` builds
    per device (``create_binder``), without a driver (Triton 3.6 to 3.9)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(GPUTarget("cuda", 90, 32))
    return backend, create_function_from_signature(kernel.signature, kernel.params, backend)


def variant(launch: Any) -> tuple[Any, dict[str, Any], dict[Any, Any], dict[Any, Any], Any]:
    """(fn, signature, constexprs, attrs, options) of a recorded launch, specialised by Triton's
    own binder for an sm_90 target."""
    kernel = launch.kernel
    backend, binder = sm90_binder(kernel)
    kwargs = {**launch.args, "num_warps": launch.num_warps, **launch.options}
    bound, specialization, options = binder(**kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return kernel, signature, constexprs, attrs, options


def variant_key(launch: Any) -> str:
    _, signature, constexprs, attrs, options = variant(launch)
    return repr(
        (
            launch.module,
            launch.name,
            sorted(signature.items()),
            sorted(constexprs.items(), key=str),
            sorted(attrs.items(), key=str),
            options.num_warps,
            options.enable_fp_fusion,
        )
    )


@dataclass
class Instruction:
    address: int
    opcode: str  # with modifiers, e.g. LDG.E.128
    text: str
    file: str
    line: int


@dataclass
class Loop:
    start: int
    end: int
    body: list[Instruction] = field(default_factory=list)

    def classes(self) -> dict[str, int]:
        return instruction_classes(self.body)

    def loads(self) -> list[Instruction]:
        return [i for i in self.body if i.opcode.startswith("LDG")]


def load_width(opcode: str) -> int:
    """Bytes per thread of a global load or store opcode."""
    for bits, width in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2), (".U8", 1), (".S8", 1)):
        if bits in opcode:
            return width
    return 4


def instruction_classes(body: list[Instruction]) -> dict[str, int]:
    counts: dict[str, int] = {"total": len(body), "int_mul": 0, "fp32": 0, "fp64": 0, "mufu": 0, "ldg": 0, "stg": 0}
    for ins in body:
        base = ins.opcode.split(".")[0]
        if base in ("IMAD", "IMUL") and ".MOV" not in ins.opcode and ".IADD" not in ins.opcode:
            counts["int_mul"] += 1
        elif base in _FP32:
            counts["fp32"] += 1
        elif base in _FP64:
            counts["fp64"] += 1
        elif base == "MUFU":
            counts["mufu"] += 1
        elif base == "LDG":
            counts["ldg"] += 1
            key = f"ldg_{load_width(ins.opcode) * 8}bit"
            counts[key] = counts.get(key, 0) + 1
        elif base == "STG":
            counts["stg"] += 1
    return counts


def issue_cycles(classes: dict[str, int]) -> int:
    """Cycles one warp needs on its sub-partition for a body with these classes: issue-bound (one
    instruction a cycle) unless a slower pipe is busier."""
    return max([classes["total"]] + [classes[k] * c for k, c in PIPE_CYCLES.items()])


_LOC = re.compile(r'//## File "(?P<file>[^"]+)", line (?P<line>\d+)')
_INS = re.compile(r"/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?P<text>[^;]*);")
_LABEL = re.compile(r"^\s*(?P<label>\.L_x_\d+):")
_TARGET = re.compile(r"`\((?P<label>\.L_x_\d+)\)")


def parse_sass(text: str) -> tuple[list[Instruction], list[Loop]]:
    """Instructions (with source lines) and loops of ``nvdisasm -g`` output."""
    instructions: list[Instruction] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    branches: list[tuple[int, str]] = []
    file, line = "?", 0
    for raw in text.splitlines():
        if m := _LOC.search(raw):
            file, line = m["file"], int(m["line"])
            continue
        if m := _LABEL.match(raw):
            pending.append(m["label"])
            continue
        if m := _INS.search(raw):
            address = int(m["addr"], 16)
            for label in pending:
                labels[label] = address
            pending = []
            text = re.sub(r"^@!?U?P\w+\s+", "", m["text"].strip())
            opcode = text.split()[0] if text else ""
            instructions.append(Instruction(address, opcode, text, file, line))
            if opcode.startswith("BRA") and (t := _TARGET.search(text)):
                branches.append((address, t["label"]))
    loops = []
    for address, label in branches:
        start = labels.get(label)
        if start is not None and start <= address:
            body = [i for i in instructions if start <= i.address <= address]
            loops.append(Loop(start, address, body))
    return instructions, loops


def vocabulary_loops(loops: list[Loop]) -> list[Loop]:
    """Innermost loops that hold a global load."""
    with_loads = [lp for lp in loops if lp.loads()]
    return [
        lp for lp in with_loads if not any(o is not lp and lp.start <= o.start and o.end <= lp.end for o in with_loads)
    ]


def occupancy(registers: int, shared: int, num_warps: int) -> dict[str, Any]:
    per_warp = -(-registers * 32 // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    by_regs = REGISTERS_PER_SM // max(per_warp * num_warps, 1)
    by_shared = SHARED_PER_SM // shared if shared else MAX_CTAS_PER_SM
    ctas = min(by_regs, by_shared, MAX_CTAS_PER_SM, MAX_WARPS_PER_SM // num_warps)
    return {"ctas_per_sm": ctas, "warps_per_sm": ctas * num_warps, "occupancy": ctas * num_warps / MAX_WARPS_PER_SM}


_RES = re.compile(r"REG:(?P<reg>\d+) STACK:(?P<stack>\d+) SHARED:(?P<shared>\d+) LOCAL:(?P<local>\d+)")


def body_end(instructions: list[Instruction], arrival: tuple[str, int]) -> int | None:
    """The address of the first ``EXIT`` after the arrival atomic at source ``arrival`` (file
    name, line): where every program but the last per request ends (a kernel whose last program
    runs a tail, :func:`spec_samplers.kernels.common.last_to_arrive`); None if there is none."""
    file, line = arrival
    atomic = next(
        (
            i.address
            for i in instructions
            if i.opcode.startswith("ATOM") and os.path.basename(i.file) == file and i.line == line
        ),
        None,
    )
    if atomic is None:
        return None
    return next((i.address for i in instructions if i.address > atomic and i.opcode == "EXIT"), None)


def read_cubin(cubin: bytes, num_warps: int, shared: int, arrival: tuple[str, int] | None = None) -> dict[str, Any]:
    """Resources, occupancy and loops of one compiled kernel. With ``arrival`` (the source line
    of a tail's arrival atomic, :func:`body_end`) the instructions and loops read are those of
    every program, up to the exit of all but the last: the tail's code after it is read from the
    tail compiled alone (:mod:`.tails`); registers and occupancy stay the whole kernel's."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        usage = subprocess.run(
            [triton_tool("cuobjdump"), "--dump-resource-usage", path], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run(
            [triton_tool("nvdisasm"), "-g", "-c", path], capture_output=True, text=True, check=True
        ).stdout
    m = _RES.search(usage)
    assert m is not None, f"no resource usage in cuobjdump output: {usage!r}"
    registers = int(m["reg"])
    instructions, loops = parse_sass(sass)
    spill_ops = sum(i.opcode.startswith(("STL", "LDL")) for i in instructions)
    end = body_end(instructions, arrival) if arrival is not None else None
    if end is not None:
        instructions = [i for i in instructions if i.address <= end]
        loops = [lp for lp in loops if lp.end <= end]
    # straight-line code: outside every loop, run once per warp of every program (cold paths too)
    straight = instruction_classes(
        [i for i in instructions if not any(lp.start <= i.address <= lp.end for lp in loops)]
    )
    return {
        "registers": registers,
        "stack_bytes": int(m["stack"]),
        "local_bytes": int(m["local"]),
        "spill_instructions": spill_ops,
        "shared_bytes": max(shared, int(m["shared"])),
        **occupancy(registers, max(shared, int(m["shared"])), num_warps),
        "instructions": len(instructions),
        "tail_split_at": end,
        "straight": {"classes": straight, "issue_cycles": issue_cycles(straight)},
        "loops": [
            {
                "start": lp.start,
                "end": lp.end,
                "classes": lp.classes(),
                "issue_cycles": issue_cycles(lp.classes()),
                "loads": [
                    {"file": i.file, "line": i.line, "width": load_width(i.opcode), "opcode": i.opcode}
                    for i in lp.loads()
                ],
            }
            for lp in vocabulary_loops(loops)
        ],
    }


def compile_variant(launch: Any, arrival: tuple[str, int] | None = None) -> dict[str, Any]:
    """Compile one recorded launch for sm_90 and read its SASS (``arrival``: :func:`read_cubin`)."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn, signature, constexprs, attrs, options = variant(launch)
    compiled = triton.compile(
        triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options=options.__dict__,
    )
    return read_cubin(compiled.asm["cubin"], options.num_warps, compiled.metadata.shared, arrival)
