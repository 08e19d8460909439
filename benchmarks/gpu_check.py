#!/usr/bin/env python
"""GPU check of the Triton kernels (issue 3): equality at real sizes, CUDA-graph replay, timings.

Usage::

    python benchmarks/gpu_check.py [--out benchmarks/results] [--quick] [--vocabs 32000 ...]

(--vocabs/--batches/--ks split the full sweep into shorter runs, one result file per V set.)

On a CUDA machine this one script

1. checks kernel == PyTorch reference token for token (``torch.equal``) at real sizes:
   V in {32000, 128256, 152064}, B in {1, 8, 64, 256}, k in {1, 4, 8}, fp32 and bf16, for
   rejection sampling (padded, mixed greedy/random rows, draft probs and point-mass drafts,
   ragged with some k_b = 0, logits inputs) and typical acceptance;
2. captures each kernel path in a CUDA graph once and replays it with new inputs and new seeds,
   checking the replayed tokens against the reference;
3. times the kernels with CUDA events (median of many runs, warm L2 and cold L2, the latter after
   overwriting a buffer larger than L2), graph replay at B = 1, next to the memory floor and,
   when importable, FlashInfer's ``chain_speculative_sampling`` and vLLM's Triton
   ``rejection_sample`` on the same inputs;
4. writes ``gpu_check_<gpu>_<date>.json`` and ``.md`` (GPU name, date, versions, tables) to --out.

It exits with status 1 when an equality or graph check fails on a probabilities input, and with
a "CUDA required" error on machines without CUDA.

5. runs the documentation snippets that start a vLLM engine with ``LLM(...)`` (the ones
   tests/test_readme_snippets.py skips without CUDA), through that test in a child process: it
   swaps the model paths for the tiny test pair and starts the engine (:func:`check_engine_snippets`).

Memory floor (docs/design.md, performance model): time >= bytes that must be read / measured bandwidth, where the
bandwidth is that of a device-to-device copy (2 * bytes / time) measured in the same run.
Bytes that must be read, per call (b = bytes per element of the input dtype):

* rejection, probs with draft probs: the accept test reads O(B * k) gathered scalars; only the
  first rejected position of each request needs its vocabulary rows, q_j and p_j:
  worst case (every request rejects) 2 * B * V * b, independent of k. The timed inputs are that
  worst case (every draft id is a zero-probability token, so position 0 rejects);
* rejection, point-mass drafts (draft_probs=None): B * V * b;
* rejection, greedy requests: their argmax at every position, (k + 1) * B * V * b at worst;
* rejection, logits input: normalising a row needs all of it, and the accept test needs every
  position's normaliser: (2k + 1) * B * V * b (target and draft logits), read once;
  (the kernels read the rejected rows a second time: the floor is not reachable there);
* typical acceptance: every position's entropy, (k + 1) * B * V * b.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import importlib
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from spec_samplers.bench import baselines
from spec_samplers.bench.timing import time_call
from spec_samplers.layout import VerifyBatch

# the input factory of the CPU kernel tests (tests/kernel_cases.py), so both check the same cases
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kernel_cases import Case, make_case, ragged_view  # noqa: E402

VOCABS = (32000, 128256, 152064)
BATCHES = (1, 8, 64, 256)
KS = (1, 4, 8)
DTYPES = (torch.float32, torch.bfloat16)
#: where inputs live; the CPU test of this script swaps in "cpu" (kernels through TRITON_INTERPRET=1)
DEVICE = "cuda"


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise SystemExit(
            "gpu_check: CUDA required: no CUDA device is visible (torch.cuda.is_available() is False). "
            "Run this script on a GPU machine; the CPU test suite covers the kernels through TRITON_INTERPRET=1."
        )


def _version(name: str) -> str | None:
    try:
        mod = importlib.import_module(name)
    except Exception:
        return None
    return getattr(mod, "__version__", "unknown")


# ---------------------------------------------------------------------------------------------
# Inputs: the factory the CPU kernel tests use (tests/kernel_cases.py), on DEVICE.


def make_inputs(B: int, k: int, V: int, dtype: torch.dtype, seed: int, *, worst_case: bool = False) -> Case:
    """Drafts close to the target (long accepted prefixes, some greedy rows), or with
    ``worst_case`` a zero-probability draft at position 0 of every request and no greedy rows
    (every request reads its rows)."""
    return make_case(
        B,
        k,
        V,
        seed,
        dtype=dtype,
        closeness=0.3,
        greedy="none" if worst_case else "mixed",
        worst_case=worst_case,
        device=DEVICE,
    )


def _ragged(inp: Case, k_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target [T, V], draft [T, V], ids [T], cu [B]) keeping the first k_b positions of each request."""
    return ragged_view(inp.target, inp.draft, inp.draft_ids, k_b)


def verify_batches(inp: Case) -> dict[str, VerifyBatch]:
    """The verification batches every check runs, by name (all from the same data)."""
    seeds = dict(seeds=inp.seeds, offsets=inp.offsets)
    B, k = inp.draft_ids.shape
    k_b = torch.randint(0, k + 1, (B,), device=DEVICE, generator=torch.Generator(device=DEVICE).manual_seed(B + k))
    t, d, ids, cu = _ragged(inp, k_b)
    return {
        "rejection": VerifyBatch.padded(
            inp.target, inp.bonus, inp.draft, inp.draft_ids, is_greedy=inp.is_greedy, **seeds
        ),
        "rejection_point_mass": VerifyBatch.padded(
            inp.target, inp.bonus, None, inp.draft_ids, is_greedy=inp.is_greedy, **seeds
        ),
        "rejection_ragged": VerifyBatch.ragged(t, inp.bonus, d, ids, cu, k, is_greedy=inp.is_greedy, **seeds),
        "rejection_logits": VerifyBatch.padded(
            inp.target_logits.to(inp.target.dtype),
            inp.bonus,
            inp.draft_logits.to(inp.target.dtype),
            inp.draft_ids,
            temperature=inp.temperature,
            **seeds,
        ),
        "block": VerifyBatch.padded(inp.target, inp.bonus, inp.draft, inp.draft_ids, is_greedy=inp.is_greedy, **seeds),
        "block_ragged": VerifyBatch.ragged(t, inp.bonus, d, ids, cu, k, is_greedy=inp.is_greedy, **seeds),
        "typical": VerifyBatch.padded(inp.target, inp.bonus, None, inp.draft_ids),
        "typical_logits": VerifyBatch.padded(
            inp.target_logits.to(inp.target.dtype), inp.bonus, None, inp.draft_ids, temperature=inp.temperature
        ),
        # SamplingParams applied by the kernels while they read logits (issue 12)
        "rejection_filtered": VerifyBatch.padded(
            inp.target_logits.to(inp.target.dtype),
            inp.bonus,
            inp.draft_logits.to(inp.target.dtype),
            inp.draft_ids,
            **seeds,
            **filtered_params(B),
        ),
        "block_filtered": VerifyBatch.padded(
            inp.target_logits.to(inp.target.dtype),
            inp.bonus,
            inp.draft_logits.to(inp.target.dtype),
            inp.draft_ids,
            **seeds,
            **filtered_params(B),
        ),
    }


#: the settings of spec-samplers bench params, cycled over the requests (one greedy)
FILTER_SETTINGS = (
    dict(temperature=0.8, top_p=0.95),
    dict(temperature=1.0, top_k=50),
    dict(temperature=1.0, min_p=0.05),
    dict(temperature=0.0),
)


def filtered_params(B: int) -> dict[str, torch.Tensor]:
    """temperature / top_k / top_p / min_p [B] of a VerifyBatch with per-request filters."""
    from spec_samplers import SamplingParams
    from spec_samplers.sampling_params import sampling_tensors

    st = sampling_tensors([SamplingParams(**FILTER_SETTINGS[b % 4]) for b in range(B)], B, DEVICE)
    temperature = torch.where(st.is_greedy, 0.0, st.temperature)
    return dict(temperature=temperature, top_k=st.top_k, top_p=st.top_p, min_p=st.min_p)


def ops() -> tuple[dict[str, Callable[[VerifyBatch], torch.Tensor]], dict[str, Callable[[VerifyBatch], torch.Tensor]]]:
    """(kernel op, reference op) per batch name."""
    from spec_samplers.kernels.block_launch import block_triton
    from spec_samplers.kernels.rejection_launch import rejection_triton
    from spec_samplers.kernels.typical_launch import typical_triton
    from spec_samplers.reference import block_reference, rejection_reference, typical_reference

    def typical_k(b: VerifyBatch) -> torch.Tensor:
        return typical_triton(b, 0.09, 0.3)

    def typical_r(b: VerifyBatch) -> torch.Tensor:
        return typical_reference(b, 0.09, 0.3)

    kernel = {name: typical_k if name.startswith("typical") else rejection_triton for name in BATCH_NAMES}
    ref = {name: typical_r if name.startswith("typical") else rejection_reference for name in BATCH_NAMES}
    for name in ("block", "block_ragged", "block_filtered"):
        kernel[name], ref[name] = block_triton, block_reference
    return kernel, ref


BATCH_NAMES = (
    "rejection",
    "rejection_point_mass",
    "rejection_ragged",
    "rejection_logits",
    "block",
    "block_ragged",
    "typical",
    "typical_logits",
    "rejection_filtered",
    "block_filtered",
)
#: logits paths: the fused softmax may differ from torch.softmax in the last bit, so a near-tie can
#: flip; differing rows are reported rather than required to be zero
EXACT = ("rejection", "rejection_point_mass", "rejection_ragged", "block", "block_ragged", "typical")


# ---------------------------------------------------------------------------------------------
# Equality


def _fits(B: int, k: int, V: int) -> bool:
    """Inputs plus the reference's temporaries stay well inside device memory."""
    if DEVICE != "cuda":
        return True
    return B * (k + 1) * V * 4 * 6 < 0.6 * torch.cuda.get_device_properties(0).total_memory


def check_equality(vocabs=VOCABS, batches=BATCHES, ks=KS) -> list[dict]:
    kernel, ref = ops()
    rows = []
    for V in vocabs:
        for B in batches:
            for k in ks:
                for dtype in DTYPES:
                    if not _fits(B, k, V):
                        continue
                    inp = make_inputs(B, k, V, dtype, seed=V + B + k)
                    res: dict[str, object] = {"V": V, "B": B, "k": k, "dtype": str(dtype).replace("torch.", "")}
                    for name, batch in verify_batches(inp).items():
                        differing = int((kernel[name](batch) != ref[name](batch)).any(dim=1).sum())
                        if name in EXACT:
                            res[name] = differing == 0
                        else:  # (report keys of earlier runs: logits_rows_differing, typical_logits_rows_differing)
                            res[name.replace("rejection_", "") + "_rows_differing"] = differing
                    out = rejection_reference_of(verify_batches(inp)["rejection"])
                    res["accepted_per_request"] = float((out[:, 1:] != -1).sum(1).float().mean())
                    rows.append(res)
                    print("equality", res, flush=True)
                    del inp
                    if DEVICE == "cuda":
                        torch.cuda.empty_cache()
    return rows


def rejection_reference_of(batch: VerifyBatch) -> torch.Tensor:
    from spec_samplers.reference import rejection_reference

    return rejection_reference(batch)


# ---------------------------------------------------------------------------------------------
# CUDA graphs


def check_graphs() -> list[dict]:
    from spec_samplers import RejectionSampler

    kernel, ref = ops()
    rows = []
    for B, k, V in ((1, 4, 128256), (64, 4, 32000)):
        for dtype in DTYPES:
            static = make_inputs(B, k, V, dtype, seed=1)
            static_batches = verify_batches(static)
            sampler = RejectionSampler()  # backend "auto": the kernels on CUDA
            fns: dict[str, Callable[[], torch.Tensor]] = {
                name: (lambda n=name, sb=static_batches: kernel[n](sb[n]))
                for name in ("rejection", "typical", "rejection_logits")
            }
            fns["sampler_forward"] = lambda s=static, sampler=sampler: sampler(
                s.target, s.bonus, s.draft, s.draft_ids, seeds=s.seeds, offsets=s.offsets, is_greedy=s.is_greedy
            )
            for name, fn in fns.items():
                ref_name = "rejection" if name == "sampler_forward" else name
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    fn()  # compile and warm up outside the capture
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = fn()
                differing = 0
                for trial in range(3):
                    new = make_inputs(B, k, V, dtype, seed=100 + trial)
                    for f in dataclasses.fields(Case):
                        getattr(static, f.name).copy_(getattr(new, f.name))
                    static_batches = verify_batches(static)  # same storage, refreshed ragged views
                    graph.replay()
                    torch.cuda.synchronize()
                    differing += int((out != ref[ref_name](static_batches[ref_name])).any(dim=1).sum())
                replay_us = _time_graph(graph)
                # Logits: ulp-level softmax differences may flip a near-tie (reported, not failed).
                ok = differing == 0 or name == "rejection_logits"
                rows.append(
                    {
                        "kernel": name,
                        "B": B,
                        "k": k,
                        "V": V,
                        "dtype": str(dtype).replace("torch.", ""),
                        "replays_equal": ok,
                        "rows_differing": differing,
                        "replay_us": replay_us,
                    }
                )
                print("graph", rows[-1], flush=True)
    return rows


def check_arrivals(shapes=((1, 4, 128256), (64, 4, 128256), (256, 4, 32000)), repeats: int = 50) -> list[dict]:
    """The launches whose last program per request (statistics: per (request, position)) combines
    what the others stored (``kernels.common.last_to_arrive``): a memory-ordering fault would
    show as tokens that change between identical calls or differ from the reference, and a
    counter left non-zero as every later call going wrong. Repeated calls, and two streams at
    once (each stream has its own counters), at shapes with many vocabulary blocks per request."""
    from spec_samplers.kernels import launch_common as lc

    kernel, ref = ops()
    rows = []
    for B, k, V in shapes:
        inp = make_inputs(B, k, V, DTYPES[-1], seed=7)
        batches = verify_batches(inp)
        for name in ("rejection", "rejection_logits", "block"):
            if name not in batches:
                continue
            batch = batches[name]
            expected = ref[name](batch)
            first = kernel[name](batch)
            changed = sum(int((kernel[name](batch) != first).any(dim=1).sum()) for _ in range(repeats))
            outs = []
            if DEVICE == "cuda":  # (the CPU test of this script has no streams)
                for stream in (torch.cuda.Stream(), torch.cuda.Stream()):
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        outs.append([kernel[name](batch) for _ in range(5)])
                torch.cuda.synchronize()
            concurrent = sum(int((o != first).any(dim=1).sum()) for run in outs for o in run)
            counters = sum(int(buf.count_nonzero()) for buf in lc._ARRIVALS.values())
            row = {
                "kernel": name,
                "B": B,
                "k": k,
                "V": V,
                "rows_changed_on_repeat": changed,
                "rows_changed_on_two_streams": concurrent,
                "rows_differing_from_reference": int((first != expected).any(dim=1).sum()),
                "counters_left_nonzero": counters,
            }
            # logits: ulp-level softmax differences may flip a near-tie against the reference
            row["ok"] = changed == 0 and concurrent == 0 and counters == 0
            row["ok"] &= name == "rejection_logits" or row["rows_differing_from_reference"] == 0
            rows.append(row)
            print("arrivals", row, flush=True)
        del inp, batches
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return rows


def _time_graph(graph: torch.cuda.CUDAGraph) -> float:
    return float(time_call(graph.replay, torch.device("cuda"), min_repeats=200, max_repeats=200)["time_s"]) * 1e6


# ---------------------------------------------------------------------------------------------
# Timing (spec_samplers.bench.timing and .baselines, as the CPU benchmarks)


def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy (read + write), median of 20."""
    x = torch.empty(2**28, dtype=torch.float32, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    t = time_call(lambda: y.copy_(x), torch.device("cuda"), min_repeats=20, max_repeats=20)
    return 2 * 2**30 / float(t["time_s"])


def _us(fn: Callable[[], object], *, cold: bool, iters: int) -> float:
    """Median microseconds of fn() by CUDA events; cold: L2 flushed before each call."""
    t = time_call(fn, torch.device(DEVICE), min_repeats=iters, max_repeats=iters, cold_l2=cold)
    return float(t["time_s"]) * 1e6


def _timed(
    impl: str, kernel: str, fn: Callable[[], object], floor_us: float, shape: dict, iters: tuple[int, int]
) -> dict:
    """One timing row: warm and L2-cold medians of fn() against the byte floor."""
    warm = _us(fn, cold=False, iters=iters[0])
    cold = _us(fn, cold=True, iters=iters[1])
    row = {"impl": impl, "kernel": kernel, **shape, "warm_us": warm, "cold_us": cold, "floor_us": floor_us}
    row["cold_over_floor"] = cold / floor_us
    print("time", row, flush=True)
    return row


def run_timings(
    bw: float, vocabs=VOCABS, batches=BATCHES, ks=KS, warm_iters: int = 100, cold_iters: int = 30
) -> tuple[list[dict], list[str]]:
    kernel, _ = ops()
    rows, notes = [], []
    for V in vocabs:
        for B in batches:
            for k in ks:
                for dtype in DTYPES:
                    if not _fits(B, k, V):
                        continue
                    inp = make_inputs(B, k, V, dtype, seed=7, worst_case=True)
                    bt = verify_batches(inp)
                    b = inp.target.element_size()
                    shape = {"V": V, "B": B, "k": k, "dtype": str(dtype).replace("torch.", "")}
                    iters = (warm_iters, cold_iters)
                    floors = {
                        "rejection": 2 * B * V * b,
                        "rejection_point_mass": B * V * b,
                        "typical": (k + 1) * B * V * b,
                        "rejection_logits": (2 * k + 1) * B * V * b,
                    }
                    for name, floor_bytes in floors.items():

                        def fn(n: str = name, bt: dict[str, VerifyBatch] = bt) -> torch.Tensor:
                            return kernel[n](bt[n])

                        rows.append(_timed("spec_samplers", name, fn, floor_bytes / bw * 1e6, shape, iters))
                    for impl, prepare in (
                        ("flashinfer", baselines.prepare_flashinfer),
                        ("vllm", baselines.prepare_vllm_v1),
                    ):
                        try:
                            call = prepare(inp.target, inp.bonus, inp.draft, inp.draft_ids)
                        except baselines.BaselineUnavailable as exc:
                            if str(exc) not in notes:
                                notes.append(str(exc))
                            continue
                        rows.append(_timed(impl, "rejection", call, 2 * B * V * b / bw * 1e6, shape, iters))
                    del inp, bt
                    torch.cuda.empty_cache()
    return rows, notes


def _fused_and_unfused(inp: Case, B: int, k: int, V: int) -> dict[str, Callable[[], torch.Tensor]]:
    """The two ways to verify SamplingParams from logits, as closures over one input case."""
    from spec_samplers import RejectionSampler, SamplingParams
    from spec_samplers.sampling_params import process_logits

    sampler = RejectionSampler(backend="triton")
    params = [SamplingParams(**FILTER_SETTINGS[b % 4]) for b in range(B)]
    target, draft = inp.target_logits.to(torch.bfloat16), inp.draft_logits.to(torch.bfloat16)
    greedy = torch.tensor([p.is_greedy for p in params], device=DEVICE)

    def fused() -> torch.Tensor:
        return sampler.forward_from_logits(
            target, inp.bonus, draft, inp.draft_ids, sampling_params=params, seeds=inp.seeds
        )

    def process_then_verify() -> torch.Tensor:
        q = process_logits(target.reshape(-1, V), [p for p in params for _ in range(k + 1)], backend="triton")
        pd = process_logits(draft.reshape(-1, V), [p for p in params for _ in range(k)], backend="triton")
        return sampler(
            q.view(B, k + 1, V), inp.bonus, pd.view(B, k, V), inp.draft_ids, seeds=inp.seeds, is_greedy=greedy
        )

    return {"fused": fused, "process_then_verify": process_then_verify}


def fused_params_timings(vocabs=VOCABS, batches=(1, 16, 64, 256), k: int = 4, iters: int = 50) -> list[dict]:
    """SamplingParams verification from logits: fused (the kernels apply the filters while they
    read logits) vs process-then-verify (process_logits on the Triton sampling kernels writes q'
    and p', then the rejection kernels verify them); warm and L2-cold medians, bf16 logits."""
    rows = []
    for V in vocabs:
        for B in batches:
            if not _fits(B, k, V):
                continue
            row: dict[str, object] = {"V": V, "B": B, "k": k, "dtype": "bfloat16"}
            for name, fn in _fused_and_unfused(
                make_inputs(B, k, V, torch.bfloat16, seed=11, worst_case=True), B, k, V
            ).items():
                row[f"{name}_warm_us"] = _us(fn, cold=False, iters=iters)
                row[f"{name}_cold_us"] = _us(fn, cold=True, iters=max(10, iters // 3))
            row["speedup_cold"] = row["process_then_verify_cold_us"] / row["fused_cold_us"]  # type: ignore[operator]
            rows.append(row)
            print("fused params", row, flush=True)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------
# Report


def _markdown(
    meta: dict,
    equality: list[dict],
    graphs: list[dict],
    timings: list[dict],
    notes: list[str],
    fused: list[dict] | None = None,
) -> str:
    lines = [
        f"# GPU check: {meta['gpu']}",
        "",
        f"Date {meta['date']}; " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"; copy bandwidth {meta['copy_bandwidth_GBps']:.0f} GB/s.",
        "",
    ]
    bad = [r for r in equality if not all(r[c] for c in EXACT)]
    lines += [
        f"Equality (kernel == reference, torch.equal): {len(equality) - len(bad)}/{len(equality)} shapes equal "
        "on every probs path.",
        f"Logits paths, rows differing from the reference (ulp-level softmax differences): "
        f"{sum(r['logits_rows_differing'] for r in equality)} rejection, "
        f"{sum(r['typical_logits_rows_differing'] for r in equality)} typical.",
        "",
    ]
    lines += [
        "| graph-captured call | B | k | V | dtype | replays equal | rows differing | replay us |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {g['kernel']} | {g['B']} | {g['k']} | {g['V']} | {g['dtype']} | {g['replays_equal']} | "
        f"{g.get('rows_differing', 0)} | "
        f"{g['replay_us']:.1f} |"
        for g in graphs
    ]
    lines += [
        "",
        "Timings (median us, CUDA events; cold = L2 flushed before each call; "
        "floor = bytes that must be read / copy bandwidth):",
        "",
        "| impl | kernel | V | B | k | dtype | warm us | cold us | floor us | cold / floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {t['impl']} | {t['kernel']} | {t['V']} | {t['B']} | {t['k']} | {t['dtype']} | {t['warm_us']:.1f} | "
        f"{t['cold_us']:.1f} | "
        f"{t['floor_us']:.1f} | {t['cold_over_floor']:.2f} |"
        for t in timings
    ]
    if fused:
        lines += [
            "",
            "SamplingParams from logits (bf16, settings cycled per request), median us: fused vs process-then-verify:",
            "",
            "| V | B | k | fused warm | fused cold | process+verify warm | process+verify cold | speedup cold |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['V']} | {r['B']} | {r['k']} | {r['fused_warm_us']:.1f} | {r['fused_cold_us']:.1f} | "
            f"{r['process_then_verify_warm_us']:.1f} | {r['process_then_verify_cold_us']:.1f} | "
            f"{r['speedup_cold']:.2f} |"
            for r in fused
        ]
    if notes:
        lines += ["", "Not measured:"] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Sampling operations (spec_samplers.sampling): kernels vs reference at real sizes, and timings
# next to FlashInfer when it imports (the CPU benchmarks skip both: they need CUDA)


def check_sampling_ops(vocabs=VOCABS, batches=BATCHES) -> list[dict]:
    from spec_samplers.bench.sampling_ops import check_backends_agree

    rows = []
    for V in vocabs:
        for B in batches:
            differing = check_backends_agree(torch.device(DEVICE), B, V)
            rows.append({"V": V, "B": B, "ops_differing": differing})
            print("sampling ops", rows[-1], flush=True)
    return rows


def sampling_timings(vocabs=VOCABS) -> dict:
    """{"bandwidth_gbps", "entries"}: each op ours vs PyTorch's sort-based way vs FlashInfer."""
    from spec_samplers.bench import sampling_ops

    return sampling_ops.run(torch.device(DEVICE), batch_sizes=(1, 16, 128, 512), vocabs=tuple(vocabs), flashinfer=True)


def check_engine_snippets() -> dict:
    """The ``LLM(...)`` snippets of README.md and docs/ (tests/test_readme_snippets.py skips them
    without CUDA, all in docs/vllm.md): that test run with CUDA in a child process, -k vllm."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    test = "tests/test_readme_snippets.py"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test, "-k", "vllm"]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
    return {"command": " ".join(cmd[2:]), "returncode": done.returncode, "summary": tail[0]}


def check_v1_plain_step(vocab: int = 128256) -> dict:
    """vLLM V1's plain-step fast path (v1_runner.verify_plain_step) on CUDA with the kernels: its
    greedy rows (draft probabilities read in place by index, mixed batch, bf16 logits) are vLLM's
    greedy verification of the logits' argmax, and its tokens are the reference backend's."""
    from types import SimpleNamespace

    from spec_samplers.integrations.vllm import v1_runner
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier, greedy_verify_ragged
    from spec_samplers.registry import get_sampler

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    B, k = 8, 4
    T = B * k
    rows = torch.arange(T + B, device=DEVICE).view(B, k + 1)
    logits = torch.randn(T + B, vocab, device=DEVICE, generator=gen).to(torch.bfloat16)
    target_rows = rows[:, :k].reshape(-1)
    argmax = logits.argmax(-1)
    ids = torch.where(torch.rand(T, device=DEVICE, generator=gen) < 0.7, argmax[target_rows], 0).to(torch.int32)
    spec = SimpleNamespace(
        draft_token_ids=ids,
        num_draft_tokens=[k] * B,
        cu_num_draft_tokens=(torch.arange(B, device=DEVICE, dtype=torch.int32) + 1) * k,
        cu_num_sampled_tokens=(torch.arange(B, device=DEVICE, dtype=torch.int32) + 1) * (k + 1),
        target_logits_indices=target_rows,
        bonus_logits_indices=rows[:, k],
        max_spec_len=k,
    )
    temperature = torch.tensor([0.0, 0.8] * (B // 2), device=DEVICE)
    metadata = SimpleNamespace(all_greedy=False, all_random=False, temperature=temperature, generators={})
    draft_probs = torch.softmax(torch.randn(T, vocab, device=DEVICE, generator=gen), -1)
    verifier = RaggedVerifier(get_sampler("rejection_sampler"))
    out = v1_runner.verify_plain_step(verifier, spec, draft_probs, logits, metadata)
    bonus = argmax[rows[:, k]]
    greedy = greedy_verify_ragged(argmax[target_rows], ids, bonus, spec.cu_num_draft_tokens, k, vocab).to(torch.int32)
    greedy_rows_equal = torch.equal(out[0::2], greedy[0::2])
    reference = v1_runner.verify_plain_step(
        RaggedVerifier(get_sampler("rejection_sampler", backend="torch")), spec, draft_probs, logits, metadata
    )
    # random rows: the logits rule's sums differ in rounding between the kernels and PyTorch, so a
    # near-tie may flip (reported); greedy rows must agree
    return {
        "greedy_rows_equal": greedy_rows_equal,
        "rows_differing_from_reference": int((out != reference).any(1).sum()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"), help="output directory")
    parser.add_argument("--quick", action="store_true", help="a few shapes only (smoke run)")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS), help="subset of V (to split long runs)")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--ks", type=int, nargs="+", default=list(KS))
    args = parser.parse_args(argv)
    _require_cuda()
    import triton

    meta = {
        "gpu": torch.cuda.get_device_name(0),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": triton.__version__,
            "flashinfer": _version("flashinfer"),
            "vllm": _version("vllm"),
        },
    }
    bw = copy_bandwidth()
    meta["copy_bandwidth_GBps"] = bw / 1e9
    from spec_samplers.kernels.backend import use_triton

    meta["auto_backend_uses_kernels_on_cuda"] = use_triton("auto", torch.device("cuda"))
    print("meta", meta, flush=True)
    shapes = dict(vocabs=args.vocabs, batches=args.batches, ks=args.ks)
    if args.quick:
        shapes = dict(vocabs=args.vocabs[:1], batches=(1, 64), ks=(4,))
    equality = check_equality(**shapes)
    sampling = check_sampling_ops(shapes["vocabs"], shapes["batches"])
    graphs = check_graphs()
    arrivals = check_arrivals()
    engine_snippets = check_engine_snippets()
    print("engine snippets", engine_snippets, flush=True)
    v1_plain_step = check_v1_plain_step()
    print("vLLM V1 plain step", v1_plain_step, flush=True)
    sampling_t: dict = {}
    fused_t: list[dict] = []
    if args.skip_timing:
        timings, notes = [], ["timings skipped (--skip-timing)"]
    else:
        iters = dict(warm_iters=20, cold_iters=10) if args.quick else {}
        timings, notes = run_timings(bw, **shapes, **iters)
        sampling_t = sampling_timings(shapes["vocabs"])
        fused_t = fused_params_timings(shapes["vocabs"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "" if shapes["vocabs"] == list(VOCABS) else "_V" + "-".join(map(str, shapes["vocabs"]))
    stem = f"gpu_check_{meta['gpu'].replace(' ', '_')}_{meta['date'][:10]}{tag}"
    (out / f"{stem}.json").write_text(
        json.dumps(
            {
                "meta": meta,
                "equality": equality,
                "sampling_ops": sampling,
                "sampling_timings": sampling_t,
                "fused_params_timings": fused_t,
                "graphs": graphs,
                "arrivals": arrivals,
                "engine_snippets": engine_snippets,
                "v1_plain_step": v1_plain_step,
                "timings": timings,
                "notes": notes,
            },
            indent=1,
        )
    )
    (out / f"{stem}.md").write_text(_markdown(meta, equality, graphs, timings, notes, fused_t))
    print(f"wrote {out / stem}.json and .md")
    failed = [r for r in equality if not all(r[c] for c in EXACT)]
    failed += [r for r in sampling if r["ops_differing"]]
    failed += [g for g in graphs if not g["replays_equal"]]
    failed += [a for a in arrivals if not a["ok"]]
    failed += [engine_snippets] if engine_snippets["returncode"] != 0 else []
    failed += [v1_plain_step] if not v1_plain_step["greedy_rows_equal"] else []
    if failed:
        print(f"FAILED: {len(failed)} equality/graph checks", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
