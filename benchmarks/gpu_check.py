#!/usr/bin/env python
"""GPU check of the Triton kernels (issue 3): equality at real sizes, CUDA-graph replay, timings.

Usage::

    python benchmarks/gpu_check.py [--out benchmarks/results] [--vocabs 32000 ...]
    python benchmarks/gpu_check.py --quick [--vllm-src DIR] [--out FILE.json]   # about a minute
    python benchmarks/gpu_check.py --export-vllm-src DIR   # where vLLM is installed: DIR for --vllm-src

``--quick`` (issue 29) times ours (the logits entry), our Model Runner V2 seam (its plain-chunk
fast path) and vLLM's Model Runner V2 (its glue and ``rejection_sample``) at V = 128256, k = 4,
bf16 logits, B = 1 and 64, with the cost model's own workload builders, eager and CUDA-graph
replay, L2 warm and cold, interleaved, next to the modeled values of the newest committed
``benchmarks/results/*-cost-model.json``; it also measures one tiny kernel's eager and per-graph-node
cost and the read bandwidth (the model's constants). vLLM need not be installed: ``--vllm-src``
imports its kernel files from a copy (``spec_samplers.bench.vllm_source``). One JSON file.

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
import importlib.util
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
    from spec_samplers.kernels.verify_launch import block_triton, rejection_triton, typical_triton
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
    from spec_samplers.kernels import backend

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
            counters = sum(int(buf.count_nonzero()) for key, buf in backend._ARRIVALS.items() if key[0] == DEVICE)
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
    without CUDA, all in docs/vllm.md): that test run with CUDA in a child process, -k vllm.
    Without vLLM installed they cannot start an engine: reported as not run (returncode None),
    not as a failure (the first H200 run had no vLLM)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    test = "tests/test_readme_snippets.py"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test, "-k", "vllm"]
    if importlib.util.find_spec("vllm") is None:
        return {"command": " ".join(cmd[2:]), "returncode": None, "summary": "not run: vLLM is not installed"}
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


# ---------------------------------------------------------------------------------------------
# --quick (issue 29): ours, our Model Runner V2 seam and vLLM's Model Runner V2, measured next to
# the cost model's values, in about a minute. vLLM need not be installed: with --vllm-src DIR its
# kernel files are imported from DIR (spec_samplers.bench.vllm_source), else vLLM's row is left out.

QUICK_V, QUICK_K, QUICK_DTYPE, QUICK_BATCHES = 128256, 4, "bfloat16", (1, 64)
#: interleaved rounds (each impl timed once per round, in turn) and CUDA-event repeats per timing
QUICK_ROUNDS, QUICK_WARM_ITERS, QUICK_COLD_ITERS = 3, 50, 20
QUICK_READ_BYTES = 2**30
#: quick impl -> the cost model's workload (spec_samplers.bench.cost.workloads)
QUICK_IMPLS = ("ours", "ours-v2-seam", "vllm-mrv2")


def quick_vllm_modules(vllm_src: str | None, notes: list[str]) -> dict | None:
    """vLLM's Model Runner V2 modules: from ``vllm_src`` when given, else the installed vLLM's;
    None (with a note) when neither imports."""
    from spec_samplers.bench import vllm_source

    try:
        if vllm_src:
            return vllm_source.load(vllm_src)
        return {name: importlib.import_module(name) for name in vllm_source.MRV2_MODULES}
    except Exception as exc:  # vLLM absent or its files not importable here: time ours only
        notes.append(f"vllm-mrv2 not timed: {type(exc).__name__}: {exc}")
        return None


def quick_calls(
    B: int, k: int, V: int, dtype: str, vllm_modules: dict | None
) -> dict[str, Callable[[], Callable[[], object]]]:
    """Builders of the three calls of the cost model's workloads at one shape, inputs on DEVICE
    (the same builders: what is timed is what is modeled). Our MRv2 seam is its plain-chunk fast
    path. Each builder makes its inputs when called (:func:`time_quick`: one failing is noted)."""
    from spec_samplers.bench.cost import workloads as wl

    shape, device = wl.Shape(B, k, V, dtype), torch.device(DEVICE)
    calls: dict[str, Callable[[], Callable[[], object]]] = {
        "ours": lambda: wl.ours(shape, device),
        "ours-v2-seam": lambda: wl.ours_v2_plain_chunk(shape, device),
    }
    if vllm_modules is not None:
        calls["vllm-mrv2"] = lambda: wl.vllm_mrv2(shape, device, vllm_modules)
    return calls


def _tokens_ok(out: object, V: int) -> bool:
    """The first token of every request (each call's first 2-D integer output, [R, k+1]; every
    request samples at least one) is in [0, V): a cheap sanity check. Later columns are not
    checked: vLLM leaves the entries past a request's count unwritten."""
    tensors = out if isinstance(out, tuple) else (out,)
    sampled = next(
        (t for t in tensors if isinstance(t, torch.Tensor) and t.dim() == 2 and not t.is_floating_point()), None
    )
    return sampled is not None and bool(((sampled[:, 0] >= 0) & (sampled[:, 0] < V)).all())


def _capture(fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph | None, str | None]:
    """(graph, None), or (None, why) where fn cannot be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm outside the capture (allocator, per-stream buffers)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        return graph, None
    except Exception as exc:  # a call that syncs or allocates on the host: eager timings only
        torch.cuda.synchronize()
        return None, f"{type(exc).__name__}: {exc}"[:300]


def _median_us(fn: Callable[[], object], *, cold: bool, iters: int) -> float:
    t = time_call(fn, torch.device(DEVICE), min_repeats=iters, max_repeats=iters, warmup=1, cold_l2=cold)
    return float(t["time_s"]) * 1e6


def time_quick(
    builders: dict[str, Callable[[], Callable[[], object]]], V: int, rounds: int, iters: tuple[int, int]
) -> dict[str, dict]:
    """Per call (built by ``builders``): eager and graph-replay medians (us), L2 warm and cold
    (flushed before each call), each the median over ``rounds`` rounds that take the calls in
    turn (interleaved), with the rounds' [min, max]. A call that fails to build or run is
    reported with its error; the others go on."""
    results: dict[str, dict] = {}
    graphs: dict[str, Callable[[], object]] = {}
    calls: dict[str, Callable[[], object]] = {}
    for name, build in builders.items():
        try:
            fn = build()
            results[name] = {"tokens_in_range": _tokens_ok(fn(), V)}  # compiles the kernels too
        except Exception as exc:  # e.g. a peer's kernel this Triton cannot compile
            results[name] = {"tokens_in_range": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
            print("quick", name, results[name]["error"], flush=True)
            continue
        calls[name] = fn
        if DEVICE == "cuda":
            graph, why = _capture(fn)
            if graph is not None:
                graphs[name] = graph.replay
                results[name]["_graph"] = graph  # kept alive while timed
            else:
                results[name]["graph_error"] = why
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for name, fn in calls.items():
            timed = {"eager": fn, **({"graph": graphs[name]} if name in graphs else {})}
            for mode, f in timed.items():
                for cache, cold, n in (("warm", False, iters[0]), ("cold", True, iters[1])):
                    samples.setdefault((name, f"{mode}_{cache}"), []).append(_median_us(f, cold=cold, iters=n))
    for (name, key), values in samples.items():
        results[name][f"{key}_us"] = sorted(values)[len(values) // 2]
        results[name][f"{key}_range_us"] = [min(values), max(values)]
    for r in results.values():
        r.pop("_graph", None)
    return results


def launch_costs(nodes: int = 20, iters: int = 200) -> dict:
    """What one tiny kernel costs: eager (a 1-element ``add_`` between CUDA events: dispatch
    included) and per node of a CUDA graph of ``nodes`` such kernels (graph of ``nodes`` minus
    graph of 1, over ``nodes - 1``): the cost model's per-launch constants, measured."""
    x = torch.zeros(1, device=DEVICE)
    eager = _median_us(lambda: x.add_(1), cold=False, iters=iters)
    if DEVICE != "cuda":
        return {"eager_tiny_kernel_us": eager}
    replay = {}
    for n in (1, nodes):
        graph, why = _capture(lambda n=n: [x.add_(1) for _ in range(n)])
        if graph is None:
            return {"eager_tiny_kernel_us": eager, "graph_error": why}
        replay[n] = _median_us(graph.replay, cold=False, iters=iters)
    return {
        "eager_tiny_kernel_us": eager,
        "graph_1_node_us": replay[1],
        f"graph_{nodes}_nodes_us": replay[nodes],
        "graph_per_node_us": (replay[nodes] - replay[1]) / (nodes - 1),
    }


def read_bandwidth(nbytes: int = 2**30) -> float:
    """Bytes per second of an fp32 ``sum`` over ``nbytes`` (read only), median of 20."""
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=DEVICE)
    t = time_call(lambda: x.sum(), torch.device(DEVICE), min_repeats=20, max_repeats=20)
    return nbytes / float(t["time_s"])


def modeled_costs(gpu: str, results_dir: Path = Path(__file__).resolve().parent / "results") -> dict:
    """{"file", "gpu", "rows": {"workload/B": {graph_us, eager_us[, *_low_us, *_high_us]}}} from
    the newest committed cost-model results (benchmarks/cost_model.py), for the H200 when the GPU's
    name says so, else the H100; {} when there is none."""
    files = sorted(results_dir.glob("*-cost-model.json"))
    if not files:
        return {}
    data = json.loads(files[-1].read_text())
    kind = "H200" if "H200" in gpu else "H100"
    rows = {}
    for r in data["results"]:
        m = r.get("modeled", {}).get(kind)
        if m is None or r["shape"]["vocab_size"] != QUICK_V or r["shape"]["k"] != QUICK_K:
            continue
        row = {f"{key[:-2]}_us": v * 1e6 for key, v in m.items() if key.endswith("_s")}
        rows[f"{r['workload']}/{r['shape']['batch_size']}"] = row
    return {"file": str(files[-1].relative_to(results_dir.parent.parent)), "gpu": kind, "rows": rows}


def quick_rows(measured: dict[int, dict[str, dict]], modeled: dict) -> list[dict]:
    """One row per (impl, B): measured beside modeled, and measured graph replay (L2 cold: the
    model reads DRAM) over modeled graph time."""
    rows = []
    for B, by_impl in measured.items():
        for impl, m in by_impl.items():
            model = modeled.get("rows", {}).get(f"{impl}/{B}", {})
            row = {"impl": impl, "B": B, "k": QUICK_K, "V": QUICK_V, "dtype": QUICK_DTYPE, **m}
            row.update({f"modeled_{key}": v for key, v in model.items()})
            measured_graph = m.get("graph_cold_us")
            if measured_graph is not None and model.get("graph_us"):
                row["measured_over_modeled_graph"] = measured_graph / model["graph_us"]
            if model.get("eager_us") and "eager_cold_us" in m:
                row["measured_over_modeled_eager"] = m["eager_cold_us"] / model["eager_us"]
            rows.append(row)
    return rows


def _fmt(v: object) -> str:
    return f"{v:.1f}" if isinstance(v, float) else ("-" if v is None else str(v))


def quick_table(rows: list[dict]) -> str:
    cols = (
        ("impl", "impl"),
        ("B", "B"),
        ("graph_warm_us", "graph warm"),
        ("graph_cold_us", "graph cold"),
        ("modeled_graph_us", "modeled graph"),
        ("measured_over_modeled_graph", "cold/modeled"),
        ("eager_warm_us", "eager warm"),
        ("eager_cold_us", "eager cold"),
        ("modeled_eager_us", "modeled eager"),
    )
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [_fmt(r.get(c[0])) for c in cols]
        for i, key in ((4, "modeled_graph"), (8, "modeled_eager")):  # the model's low-high range
            if f"{key}_low_us" in r:
                cells[i] += f" ({r[f'{key}_low_us']:.1f}-{r[f'{key}_high_us']:.1f})"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def quick_main(args: argparse.Namespace, meta: dict) -> int:
    """``--quick``: measured (us, CUDA events, medians) next to modeled; one JSON file."""
    notes: list[str] = []
    vllm_modules = quick_vllm_modules(args.vllm_src, notes)
    if args.vllm_src:
        version_file = Path(args.vllm_src) / "VLLM_VERSION"
        meta["vllm_src"] = {
            "dir": args.vllm_src,
            "version": version_file.read_text().strip() if version_file.exists() else None,
        }
    report: dict = {"meta": meta, "shape": {"V": QUICK_V, "k": QUICK_K, "dtype": QUICK_DTYPE}, "notes": notes}
    out = Path(args.out)
    if out.suffix != ".json":
        out = out / f"gpu_check_quick_{meta['gpu'].replace(' ', '_')}_{meta['date'][:10]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    measured: dict[int, dict[str, dict]] = {}
    report["modeled_from"] = modeled_costs(meta["gpu"])

    def save() -> None:  # after every stage: a crash later still leaves what was measured
        report["rows"] = quick_rows(measured, report["modeled_from"])
        out.write_text(json.dumps(report, indent=1))

    report["read_bandwidth_GBps"] = read_bandwidth(QUICK_READ_BYTES) / 1e9
    report["launch"] = launch_costs()
    print("launch", report["launch"], "read GB/s", round(report["read_bandwidth_GBps"]), flush=True)
    save()
    for B in args.quick_batches:
        builders = quick_calls(B, QUICK_K, QUICK_V, QUICK_DTYPE, vllm_modules)
        measured[B] = time_quick(builders, QUICK_V, QUICK_ROUNDS, (QUICK_WARM_ITERS, QUICK_COLD_ITERS))
        print("quick", B, measured[B], flush=True)
        save()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    print(quick_table(report["rows"]))
    modeled_from = report["modeled_from"]
    print(f"(measured on {meta['gpu']}; modeled from {modeled_from.get('file')}, {modeled_from.get('gpu')})")
    print(f"wrote {out}")
    failed = [r for r in report["rows"] if not r["tokens_in_range"]]
    if failed:
        print(f"FAILED: tokens out of range in {[(r['impl'], r['B']) for r in failed]}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"), help="output directory")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="about a minute: ours, our MRv2 seam and vLLM's MRv2 timed at B = 1 and 64 next to the "
        "cost model (one JSON file: --out DIR or --out FILE.json)",
    )
    parser.add_argument("--quick-batches", type=int, nargs="+", default=list(QUICK_BATCHES))
    parser.add_argument(
        "--vllm-src",
        default=None,
        help="--quick: a directory holding vllm/ (vLLM's Python files, e.g. from "
        "spec_samplers.bench.vllm_source.export) to import vLLM's MRv2 kernels from without vLLM",
    )
    parser.add_argument(
        "--export-vllm-src",
        metavar="DIR",
        help="copy the installed vLLM's MRv2 kernel files (and the vLLM modules they import) into DIR "
        "for --vllm-src on a machine without vLLM, then exit (no CUDA needed; never commit DIR)",
    )
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS), help="subset of V (to split long runs)")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--ks", type=int, nargs="+", default=list(KS))
    args = parser.parse_args(argv)
    if args.export_vllm_src:
        from spec_samplers.bench import vllm_source

        written = vllm_source.export(args.export_vllm_src)
        print(f"wrote {len(written)} files of vLLM's under {args.export_vllm_src}")
        return 0
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
    if args.quick:
        return quick_main(args, meta)
    shapes = dict(vocabs=args.vocabs, batches=args.batches, ks=args.ks)
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
        timings, notes = run_timings(bw, **shapes)
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
    failed += [engine_snippets] if engine_snippets["returncode"] not in (0, None) else []
    failed += [v1_plain_step] if not v1_plain_step["greedy_rows_equal"] else []
    if failed:
        print(f"FAILED: {len(failed)} equality/graph checks", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
