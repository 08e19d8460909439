"""The cost model's measuring parts (spec_samplers.bench.cost) and ``spec-samplers profile``.

Exact on known kernels: the interpreter's byte counter on a copy kernel with a masked tail (and its
scaling to another vocabulary size), the SASS reader on hand-written SASS and on a tiny kernel
compiled for sm_90. Structural: the vocabulary-sized eager tensors each vLLM seam creates per call
(a dispatch mode; the counts below document today's seams). The CLI runs at a small shape.
No timing is asserted anywhere: the model's times are modeled, not measured.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from spec_samplers.bench.cost import counting, model, report, sass, trace
from spec_samplers.bench.cost import workloads as wl

#: the byte counter hooks Triton's interpreter. conftest sets TRITON_INTERPRET=1 where there is no
#: GPU (CI); on a GPU machine, where this process compiles kernels, the test reruns itself in a child
#: with TRITON_INTERPRET=1, so it runs (never skips) everywhere
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _rerun_interpreted(test: str) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{__file__}::{test}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@triton.jit
def copy_rows_kernel(x, y, V, BLOCK: tl.constexpr):
    """Program (r, c): copies block c of row r of [R, V] x into y (a masked tail when BLOCK does not divide V)."""
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < V
    row = tl.program_id(0) * V
    tl.store(y + row + offs, tl.load(x + row + offs, mask=m) * 2.0, mask=m)


def _count_copy(rows: int, V: int, block: int = 128) -> dict:
    x, y = torch.randn(rows, V), torch.empty(rows, V)
    with counting.counting() as counts, trace.recording(execute=True) as launches:
        copy_rows_kernel[(rows, triton.cdiv(V, block))](x, y, V, BLOCK=block)
    assert torch.equal(y, x * 2.0)  # the counted launch really ran
    assert [launch.name for launch in launches] == ["copy_rows_kernel"]
    return counts[0].as_dict()


def test_byte_counter_exact_on_a_copy_kernel_with_a_masked_tail():
    if not INTERPRETING:
        return _rerun_interpreted("test_byte_counter_exact_on_a_copy_kernel_with_a_masked_tail")
    rows, V, block = 3, 300, 128  # 3 blocks per row, the last one 44 of 128 lanes
    count = _count_copy(rows, V, block)
    x, y = count["tensors"]
    assert (x["path"], y["path"]) == ("x", "y")
    assert x["load_unique"] == x["load_lanes"] == rows * V * 4 and x["store_lanes"] == 0
    assert y["store_unique"] == y["store_lanes"] == rows * V * 4 and y["load_lanes"] == 0
    load, store = (next(s for s in count["sites"] if s["kind"] == kind) for kind in ("load", "store"))
    assert load["calls"] == store["calls"] == rows * 3
    assert load["lanes"] == rows * 3 * block  # every lane of the loop width, masked ones included
    assert load["active"] == rows * V
    assert load["line"] == store["line"] and load["file"] == __file__


def test_byte_counter_scales_to_another_vocabulary_exactly():
    if not INTERPRETING:
        return _rerun_interpreted("test_byte_counter_scales_to_another_vocabulary_exactly")
    rows = 2
    small = (_count_copy(rows, 256), _count_copy(rows, 384))
    full = _count_copy(2 * rows, 640)
    scaled = counting.scale(small, (256, 384, 640), (rows, 2 * rows), {"x": [2 * rows, 640], "y": [2 * rows, 640]})
    assert scaled["bytes_loaded"] == sum(t["load_unique"] for t in full["tensors"]) == 2 * rows * 640 * 4
    assert scaled["bytes_stored"] == sum(t["store_unique"] for t in full["tensors"])


SASS = """
copy_kernel:
\t//## File "/src/k.py", line 8
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_0:
\t//## File "/src/k.py", line 13
        /*0010*/                   IMAD.WIDE R12, R23, 0x4, R2 ;
        /*0020*/              @!P6 LDG.E.128 R4, desc[UR6][R12.64] ;
        /*0030*/                   IMAD.MOV.U32 R9, RZ, RZ, RZ ;
\t//## File "/src/k.py", line 14
        /*0040*/                   FFMA R17, R4, R5, R6 ;
        /*0050*/                   MUFU.EX2 R18, R17 ;
        /*0060*/                   DADD R20, R20, R22 ;
        /*0070*/              @!P0 STG.E desc[UR6][R6.64], R17 ;
        /*0080*/              @!P0 BRA `(.L_x_0) ;
        /*0090*/                   EXIT ;
.L_x_1:
        /*00a0*/                   BRA `(.L_x_1);
"""


def test_sass_reader_on_known_sass():
    instructions, loops = sass.parse_sass(SASS)
    assert len(instructions) == 11
    (loop,) = sass.vocabulary_loops(loops)  # the self-loop at 0xa0 holds no load
    assert (loop.start, loop.end) == (0x10, 0x80)
    assert loop.classes() == {
        "total": 8,
        "int_mul": 1,
        "fp32": 1,
        "fp64": 1,
        "mufu": 1,
        "ldg": 1,
        "stg": 1,
        "ldg_128bit": 1,
    }
    (load,) = loop.loads()
    assert (load.file, load.line, sass.load_width(load.opcode)) == ("/src/k.py", 13, 16)
    assert sass.issue_cycles(loop.classes()) == 8  # one MUFU: 8 cycles of its pipe, as many as the 8 issues
    assert sass.occupancy(registers=64, shared=0, num_warps=4) == {
        "ctas_per_sm": 8,
        "warps_per_sm": 32,
        "occupancy": 0.5,
    }


TAILED_SASS = """
fused_kernel:
\t//## File "/src/k.py", line 5
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/              @!P6 LDG.E.128 R4, desc[UR6][R12.64] ;
        /*0020*/              @!P0 BRA `(.L_x_0) ;
\t//## File "/src/common.py", line 238
        /*0030*/               @P1 ATOMG.E.ADD.STRONG.GPU PT, R5, desc[UR20][R2.64], R5 ;
\t//## File "/src/k.py", line 9
        /*0040*/               @P1 EXIT ;
.L_x_1:
        /*0050*/                   LDG.E R8, desc[UR6][R10.64] ;
        /*0060*/              @!P0 BRA `(.L_x_1) ;
        /*0070*/                   EXIT ;
"""


def test_sass_reader_splits_a_tail_at_the_exit_after_its_arrival():
    """A kernel whose last program per request runs a tail: every program runs the code up to the
    first EXIT after the arrival atomic, so the loops read for every program end there."""
    instructions, loops = sass.parse_sass(TAILED_SASS)
    assert sass.body_end(instructions, ("common.py", 238)) == 0x40
    assert sass.body_end(instructions, ("common.py", 237)) is None  # no atomic on that line: no split
    body = [lp for lp in sass.vocabulary_loops(loops) if lp.end <= 0x40]
    assert [(lp.start, lp.end) for lp in body] == [(0x10, 0x20)]


def test_tracing_plans_our_launches_without_patching_triton():
    """Our launchers append their planned launches to the LaunchConfig's list (meta tensors, a
    modeled H100's split): Triton's launch path is untouched, the launches come by name."""
    from triton.runtime.jit import JITFunction

    from spec_samplers.kernels import backend

    run = JITFunction.run
    call = wl.build("ours", wl.Shape(8, 4, VOCAB), META)
    with trace.tracing(132) as launches:
        assert JITFunction.run is run and backend.launch_config().launches is launches
        call()
    assert [launch.name for launch in launches] == ["softmax_partials_kernel", "residual_partials_kernel"]
    partials = launches[-1]
    assert partials.grid == (8, partials.grid[1]) and partials.grid[1] > 1  # split over the vocabulary
    assert partials.tensors() and "num_warps" not in partials.args  # the kernel's parameters by name


_COMPILE = """
import json, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from spec_samplers.bench.cost import sass

@triton.jit
def scale_loop(x, y, n, BLOCK: tl.constexpr):
    for s in range(0, n, BLOCK):  # aligned steps: the loads vectorise
        offs = s + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x + offs, mask=m)  # the load line
        tl.store(y + offs, v * 2.0, mask=m)

sig = {"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"}
attrs = {(i,): [["tt.divisibility", 16]] for i in range(3)}  # as the runtime for aligned x, y and n
k = triton.compile(ASTSource(fn=scale_loop, signature=sig, constexprs={(3,): 512}, attrs=attrs),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print(json.dumps(sass.read_cubin(k.asm["cubin"], 4, k.metadata.shared)))
"""


def test_sass_reader_on_a_compiled_kernel(tmp_path):
    script = tmp_path / "compile_tiny.py"  # a file: Triton reads a kernel's source
    script.write_text(_COMPILE)
    load_line = next(i for i, text in enumerate(_COMPILE.splitlines(), 1) if "# the load line" in text)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, check=True)
    read = json.loads(done.stdout.splitlines()[-1])
    assert 8 <= read["registers"] <= 255 and read["spill_instructions"] == 0 and read["stack_bytes"] == 0
    (loop,) = read["loops"]
    c = loop["classes"]
    # each thread loads 512 / 128 = 4 fp32 per tile, aligned: 128-bit loads, 4 FADD/FMUL and a store each
    # (the loop may be unrolled; a vector load's line drifts a few lines past its tl.load: the
    # inline PTX of a predicated load advances the line table, see report.LINE_DRIFT)
    assert {ld["width"] for ld in loop["loads"]} == {16}
    assert all(load_line <= ld["line"] <= load_line + report.LINE_DRIFT for ld in loop["loads"])
    assert c["ldg"] == c["stg"] and c["fp32"] == 4 * c["ldg"] and c["mufu"] == c["fp64"] == 0


def test_eager_op_counter_reads_an_out_argument_as_written():
    """An ``out=`` tensor is written, not read: softmax over itself moves one read and one write."""
    x, y = torch.empty(4, 1024, device=META), torch.empty(4, 1024, device=META)
    ops = trace.EagerOps(1024)
    with trace.recording(execute=False, ops=ops), ops:
        torch.softmax(x, -1, out=x)
        torch.neg(x, out=y)
        x.exp_()
    nbytes = x.numel() * 4
    assert [(op.bytes_read, op.bytes_written) for op in ops.records] == [(nbytes, nbytes)] * 3
    assert not any(op.creates_vocab_tensor for op in ops.records)


def _seam_vocab_tensors(call) -> int:
    ops = trace.EagerOps(VOCAB)
    with trace.tracing(132, ops=ops, peers=True), ops:  # our launches planned; vLLM's, if any, caught
        call()
    return sum(op.creates_vocab_tensor for op in ops.records)


VOCAB, REQUESTS, STEPS = 4096, 8, 3  # issue 19 counted "about 265" at V = 4096, R = 8, S = 3
META = torch.device("meta")


@pytest.mark.vllm  # vLLM's own seams: the full tier
def test_engine_seams_vocabulary_sized_eager_tensors():
    """Structural: vocabulary-sized tensors created by eager ops per seam call (meta tensors: our
    kernels planned, not run). Issue 19 wants at most 2 per call on either seam. Model Runner V2's
    seam verifies the logits in place, bonus rows included (it drew the bonus with eager ops over
    the vocabulary before: 263 tensors, 261 without draft logits) and reads the drafter's cached
    logits in place (the sampler's ``draft_rows`` and ``draft_temperature``; before: their gather
    and its fp32 quotient by T, 2 tensors), so it creates none. V1's plain steps (the plugin's
    wrapper of ``RejectionSampler.forward``) verify the model's logits in place too, and the
    drafter's probabilities by index: none with either drafting."""
    from spec_samplers.integrations.vllm import v1_runner, v2_runner
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier
    from spec_samplers.registry import get_sampler

    shape = wl.Shape(REQUESTS, STEPS, VOCAB)
    x = wl.Inputs(META)
    logits = x.normal(REQUESTS * (STEPS + 1), VOCAB)
    v2 = wl.v2_arguments(shape, x, logits)
    for name in ("rejection_sampler", "block_verification"):
        seam = functools.partial(v2_runner.verify, RaggedVerifier(get_sampler(name, backend="triton")), logits)
        probabilistic = _seam_vocab_tensors(functools.partial(seam, **v2))
        point_mass = _seam_vocab_tensors(functools.partial(seam, **{**v2, "draft_logits": None}))
        assert (probabilistic, point_mass) == (0, 0)  # the drafter's cache read in place by the kernels
        assert max(probabilistic, point_mass) <= 2  # issue 19's bound

    verifier = RaggedVerifier(get_sampler("rejection_sampler", backend="triton"))
    a = wl.v1_inputs(shape, x)
    target = a.logits[a.target_index].float()

    def v1(draft_probs):
        return lambda: v1_runner.verify(
            verifier, a.ids, a.num_draft, STEPS, a.cu, draft_probs, target, a.bonus, a.metadata
        )

    assert _seam_vocab_tensors(v1(None)) == 0  # n-gram drafts: the logits entry
    assert _seam_vocab_tensors(v1(a.draft_probs)) == 1  # draft probabilities: vLLM's fp32 softmax

    # V1's RejectionSampler.forward as the plugin wraps it, on a plain step (temperature only):
    # the model's [T + B, V] logits verified in place, bonus rows included (before: vLLM's glue
    # and our seam, 4 tensors with draft probabilities: gather, fp32 copy, clone, softmax; vLLM's
    # Sampler drew the bonus on top). Allocations count too (q's new_empty moves no data).
    plain = functools.partial(
        v1_runner.verify_plain_step, verifier, a.spec, logits=a.logits, sampling_metadata=a.metadata
    )
    assert v1_runner.plain_step(SimpleNamespace(synthetic_mode=False), verifier, a.spec, None, a.logits, a.metadata)
    assert _allocated_vocab_tensors(functools.partial(plain, draft_probs=None)) == 0  # point-mass drafts
    # draft probabilities, verified against exactly q, read in place by index (the logits entry's
    # draft_probs and draft_rows; before: p in fp32 and q laid out on the rows, 2 tensors)
    assert _allocated_vocab_tensors(functools.partial(plain, draft_probs=a.draft_probs)) == 0


@pytest.mark.vllm  # vLLM's own seams: the full tier
def test_v2_plain_chunk_creates_no_vocabulary_sized_eager_tensor():
    """Structural: Model Runner V2's ``_verify`` as the plugin wraps it, on a plain chunk
    (temperature only): vLLM's glue (the chunk's fp32 copy and its division by T) is skipped and
    the raw logits verified in place at each request's temperature, the drafter's cache read in
    place: no vocabulary-sized tensor created or allocated, with either drafting (before: the
    glue's fp32 copy, 1)."""
    import numpy as np
    import vllm_support  # noqa: F401  (vLLM's platform: CPU; the plugin tests' requirements)

    from spec_samplers.integrations.vllm import v2_runner
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier
    from spec_samplers.registry import get_sampler

    shape = wl.Shape(REQUESTS, STEPS, VOCAB)
    x = wl.Inputs(META)
    logits = x.normal(REQUESTS * (STEPS + 1), VOCAB, dtype=torch.bfloat16)
    a = wl.v2_arguments(shape, x, logits)
    rs = wl.v2_rejection_sampler(a)
    for name in ("rejection_sampler", "block_verification"):
        verifier = RaggedVerifier(get_sampler(name, backend="triton"))
        assert v2_runner.plain_chunk(rs, verifier, logits, np.arange(REQUESTS))  # the fast path
        chunk = {k: a[k] for k in v2_runner.CHUNK_ARGUMENTS}
        for drafts in (a["draft_logits"], None):  # probabilistic, point-mass drafts
            call = functools.partial(
                v2_runner.verify_plain_chunk, rs, verifier, logits, **{**chunk, "draft_logits": drafts}
            )
            assert _allocated_vocab_tensors(call) == 0


def _allocated_vocab_tensors(call) -> int:
    """Vocabulary-sized tensors an eager call creates or allocates (``new_empty`` and the like
    move no data, so ``creates_vocab_tensor`` leaves them out)."""
    ops = trace.EagerOps(VOCAB)
    with trace.tracing(132, ops=ops, peers=True), ops:  # our launches planned; vLLM's, if any, caught
        call()
    allocations = ("aten::empty", "aten::empty_like", "aten::new_empty", "aten::empty_strided")
    allocated = [op.name in allocations and op.largest >= ops.vocab_bar for op in ops.records]
    return sum(op.creates_vocab_tensor or alloc for op, alloc in zip(ops.records, allocated))


@pytest.mark.not_quick  # the profile CLI end to end (15 s of CPU)
def test_profile_cli_runs_at_a_small_shape(tmp_path):
    out = tmp_path / "profile.json"
    cmd = [sys.executable, "-m", "spec_samplers.cli", "profile", "--batch-size", "2", "--k", "2"]
    cmd += ["--vocab-size", "2048", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "MODELED" in done.stdout
    (result,) = json.loads(out.read_text())["results"]
    names = [launch["name"] for launch in result["launches"]]
    assert "residual_partials_kernel" in names and len(names) >= 3
    for launch in result["launches"]:
        assert launch["bytes"] > 0 and launch["sass"]["registers"] > 0
    assert result["modeled"]["H100"]["graph_s"] > result["modeled"]["H100"]["floor_s"] > 0
    # the tails (the last program of each (request, position) combines its statistics, the last
    # of each request finishes it) are measured on their own, one program per tail, right after
    # their launch, and pay no launch latency of their own: 2 launches per logits call
    tails = {launch["name"]: launch["grid"] for launch in result["launches"] if launch["tail"]}
    assert tails == {"softmax_tail": [2, 3], "rejection_tail": [2]}
    assert names[names.index("softmax_tail") - 1] == "softmax_partials_kernel"
    assert names[names.index("rejection_tail") - 1] == "residual_partials_kernel"
    # a graph: one replay, then per node (our 2 launches and every eager op that launches a
    # kernel, traced on the device path) its node cost and its kernel
    h100, lat = result["modeled"]["H100"], model.LATENCIES["central"]
    nodes = 2 + result["eager_ops"]["count"]
    assert result["nodes"] == nodes
    expected = lat.graph_replay + nodes * lat.launch_graph + h100["kernels_s"] + h100["eager_ops_s"]
    assert h100["graph_s"] == pytest.approx(expected)


def _traffic(fn, vocab=1024):
    ops = trace.EagerOps(vocab)
    with trace.recording(execute=False, ops=ops), ops:
        fn()
    return [(op.name, op.bytes_read, op.bytes_written, op.blocks) for op in ops.records]


def test_eager_op_counter_overwriting_in_place_ops_do_not_read_their_destination():
    """``copy_`` reads its source only; in-place ``exponential_`` (and the other draws, fills)
    writes without reading; an in-place op that computes from its destination still reads it."""
    x, y = torch.empty(4, 1024, device=META), torch.empty(4, 1024, dtype=torch.bfloat16, device=META)
    n = x.numel()
    got = _traffic(lambda: (x.copy_(y), x.exponential_(), x.fill_(1.0), x.mul_(2.0)))
    assert got == [
        ("aten::copy_", 2 * n, 4 * n, None),
        ("aten::exponential_", 0, 4 * n, None),
        ("aten::fill_", 0, 4 * n, None),
        ("aten::mul_", 4 * n, 4 * n, None),
    ]


def test_eager_op_counter_gathers_read_the_gathered_rows_only():
    """``x[idx]`` of 3 rows out of 64 reads 3 rows and the indices, not the 64 rows."""
    x, idx = torch.empty(64, 1024, device=META), torch.empty(3, dtype=torch.int64, device=META)
    row = 1024 * 4
    got = _traffic(lambda: (x[idx], x.index_select(0, idx)))
    assert [g[:3] for g in got] == [
        ("aten::index", 3 * row + 24, 3 * row),
        ("aten::index_select", 3 * row + 24, 3 * row),
    ]


def test_eager_op_counter_softmax_cast_and_grid():
    """softmax(x, dtype=float32): of fp16 one pass reading fp16 (CUDA's half_to_float path), of
    bf16 a cast and a softmax (no such path for bf16); a last-dimension softmax is charged one
    block per row (PyTorch's host_softmax grid)."""
    half, bf16 = (torch.empty(5, 1024, dtype=d, device=META) for d in (torch.float16, torch.bfloat16))
    n = half.numel()
    assert _traffic(lambda: half.softmax(-1, dtype=torch.float32)) == [("aten::_softmax", 2 * n, 4 * n, 5)]
    assert _traffic(lambda: bf16.softmax(-1, dtype=torch.float32)) == [
        ("aten::_to_copy", 2 * n, 4 * n, None),
        ("aten::_softmax", 4 * n, 4 * n, 5),
    ]
    # a cast that is not the softmax's input stays a pass of its own
    other = torch.empty(5, 1024, device=META)
    got = _traffic(lambda: (half.float(), other.softmax(-1)))
    assert [g[0] for g in got] == ["aten::_to_copy", "aten::_softmax"]


def test_time_model_latency_terms():
    """Issue 29's latency terms, each on its own: a minimum duration per launch (not for a tail,
    which runs inside its launch), issue at half rate with one warp per scheduler, Little's law on
    the bytes a few warps keep in flight, spills beyond L1 through DRAM, a tail's dependent L2
    round trips, and an eager row softmax charged at the bandwidth its one block per row draws."""

    hw, lat = model.H100, model.LATENCIES["central"]
    tiny = model.launch_time(hw, 1e3, 10.0, 1, 1)
    assert tiny["kernel_s"] == lat.min_kernel
    assert model.launch_time(hw, 1e3, 10.0, 1, 1, standalone=False)["kernel_s"] < lat.min_kernel
    # issue: 4 warps on one SM fill the 4 schedulers at one warp each: half rate; 8 warps: full
    cycles = 1e6
    one_each = model.launch_time(hw, 0.0, cycles, 1, 4)["issue_s"]
    two_each = model.launch_time(hw, 0.0, cycles, 1, 8)["issue_s"]
    assert one_each == cycles / (4 * hw.clock * 0.5) and two_each == cycles / (4 * hw.clock)
    # Little's law: 1 warp with 512 B in flight per DRAM latency, far below the SM's share
    few = model.launch_time(hw, 1e6, 0.0, 1, 1, inflight_per_warp=512.0)
    assert few["memory_s"] == 1e6 / (512.0 * hw.clock / lat.dram_cycles)
    # spills: a stack that does not fit L1 is stored and loaded through DRAM
    spilled = model.launch_time(hw, 0.0, 0.0, 132, 4, ctas_per_sm=1, local_bytes_per_thread=4096)
    assert spilled["spill_bytes"] == 2 * 4096 * 128 * 132
    assert model.launch_time(hw, 0.0, 0.0, 132, 4, local_bytes_per_thread=64)["spill_bytes"] == 0.0
    # a tail's dependent round trips
    tail = model.launch_time(hw, 0.0, 0.0, 1, 4, dependent_rounds=10, standalone=False)
    assert tail["kernel_s"] == tail["latency_s"] == 10 * lat.l2_cycles / hw.clock
    # the range brackets the central value
    r = model.launch_range(hw, 1e5, 1e4, 4, 4, dependent_rounds=3)
    assert r["kernel_low_s"] <= r["kernel_s"] <= r["kernel_high_s"]
    # eager softmax of 5 rows: 5 blocks draw 5 * factor / 132 of the bandwidth
    op = {"bytes_read": 4e6, "bytes_written": 4e6, "blocks": 5}
    assert model.eager_op_time(hw, op) == pytest.approx(8e6 / (hw.bandwidth * 5 * hw.sm_bandwidth_factor / hw.sms))
    assert model.eager_op_time(hw, {**op, "blocks": None}) == 8e6 / hw.bandwidth
