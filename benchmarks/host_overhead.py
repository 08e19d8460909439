#!/usr/bin/env python
"""Host overhead per call, without a GPU: launches, host time and Triton's binder, ours and vLLM's.

    PYTHONPATH=$PWD python benchmarks/host_overhead.py --json FILE [--batch 1 64] [--vocab 128256]

One process; k = 4, bf16 logits (fp32 probabilities), every call on CPU tensors planned for a
132-SM GPU (``backend.planned_for(LaunchConfig(num_sms=132, kernels=True, launches=...))``: our
launchers append what they would launch and run nothing; vLLM's Triton kernels are caught where
Triton launches and not run, ``cost.trace.tracing``). Rows: the V1 seam and the MRv2 seam, ours
(vLLM's ``RejectionSampler`` with our plugin, its plain-step fast path) and vLLM 0.33's own path
from the same logits (loaded as the cost model loads it: ``cost.workloads``), then every sampler
entry and every sampling operation (ours only: vLLM has no entry of that interface). Per row:

* ``launches``: Triton launches plus eager ops that launch a kernel on a GPU
  (``cost.trace.OpCounter``, the counter of tests/test_host_syncs.py), second call of the row;
* ``host_us``: time of one call (one thread; ``--clock thread``, the default, counts the thread's
  CPU time, ``wall`` wall time), launches recorded, not run: the Python,
  planning and eager dispatch a CPU thread pays before the GPU sees anything. On a GPU an eager
  op's arithmetic runs on the device; on these CPU tensors it runs on the host, in proportion to
  the vocabulary (vLLM's fp32 copy of the logits, say). So the call is timed at a tiny vocabulary,
  ``--host-vocab`` (default 64: the arithmetic of B * (k + 1) rows of 64 entries is a few
  microseconds), median of ``--repeats``, the rows of a batch size timed in turns (one call of
  each per round, so ours and vLLM's see the same machine); the launch counts there are checked equal to the full
  shape's (a mismatch, a different path, is listed in ``notes``). (An extrapolation to no
  vocabulary from two small ones was tried: on a loaded machine it doubled the noise.)
* ``binder_us``: Triton's binder (argument specialisation) plus its cache key for every Triton
  launch of the call, built for an sm_90 target (``cost.sass.sm90_binder``), median: the part of
  ``kernel[grid](...)`` that runs on the host before the driver, which ``host_us`` does not
  include (launches are recorded, not run).

The JSON: ``{"meta": {...}, "rows": [{"entry", "impl", "B", "launches", "host_us", "binder_us"}],
"details": [...], "notes": [...]}``; ``details`` names each row's kernels and eager ops and counts
the Python and C functions a warm call runs (``functions_run``: host work the machine's speed does
not move). Every
number is **measured on this CPU** (its load in ``meta``), none on a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
NUM_SMS = 132  # an H100's or H200's multiprocessors
K = 4
SEAMS = {  # row entry -> (our workload, vLLM's own workload) in spec_samplers.bench.cost.workloads
    "v1_seam": ("ours-v1-seam", "vllm-v1"),
    "mrv2_seam": ("ours-v2-seam", "vllm-mrv2"),
}


def sampler_calls(B: int, V: int) -> dict[str, Callable[[], Any]]:
    """Every sampler entry (public methods of the three registered samplers), k = 4, each request
    with k drafts. Values are left uninitialised: nothing is run, the launches are planned."""
    from spec_samplers import BlockVerificationSampler, RejectionSampler, TypicalAcceptanceSampler

    T = B * K
    bf16, f32 = torch.bfloat16, torch.float32
    target_probs, draft_probs = torch.empty(B, K + 1, V, dtype=f32), torch.empty(B, K, V, dtype=f32)
    target_logits, draft_logits = torch.empty(B, K + 1, V, dtype=bf16), torch.empty(B, K, V, dtype=bf16)
    ragged_probs, ragged_draft_probs = torch.empty(T, V, dtype=f32), torch.empty(T, V, dtype=f32)
    ragged_logits, ragged_draft_logits = torch.empty(T, V, dtype=bf16), torch.empty(T, V, dtype=bf16)
    ids, ragged_ids = torch.zeros(B, K, dtype=torch.int64), torch.zeros(T, dtype=torch.int64)
    bonus, ragged_bonus = torch.zeros(B, 1, dtype=torch.int64), torch.zeros(B, dtype=torch.int64)
    cu = (torch.arange(B) + 1) * K
    temperature = torch.full((B,), 0.7)
    seeds = {"seeds": torch.arange(B, dtype=torch.int64)}
    calls: dict[str, Callable[[], Any]] = {}
    for cls in (RejectionSampler, TypicalAcceptanceSampler, BlockVerificationSampler):
        s, name = cls(), cls.__name__
        rnd = seeds if cls is not TypicalAcceptanceSampler else {}
        calls[f"{name}.forward"] = lambda s=s, rnd=rnd: s(target_probs, bonus, draft_probs, ids, **rnd)
        if cls is BlockVerificationSampler:
            continue  # (its other entries are its base class's: the same kernels as RejectionSampler's)
        calls[f"{name}.forward_ragged"] = lambda s=s, rnd=rnd: s.forward_ragged(
            ragged_probs, ragged_bonus, ragged_draft_probs, ragged_ids, cu, K, **rnd
        )
        calls[f"{name}.forward_from_logits"] = lambda s=s, rnd=rnd: s.forward_from_logits(
            target_logits, bonus, draft_logits, ids, temperature, **rnd
        )
        calls[f"{name}.forward_ragged_from_logits"] = lambda s=s, rnd=rnd: s.forward_ragged_from_logits(
            ragged_logits, ragged_bonus, ragged_draft_logits, ragged_ids, cu, K, temperature=temperature, **rnd
        )
    return calls


def sampling_calls(B: int, V: int) -> dict[str, Callable[[], Any]]:
    """Every sampling operation (``spec_samplers.sampling.__all__`` less its aliases) on [B, V]
    rows with per-row parameters and seeds."""
    import spec_samplers.sampling as sp

    probs, logits = torch.empty(B, V), torch.empty(B, V, dtype=torch.bfloat16)
    draft, target = torch.empty(B, K, V), torch.empty(B, K + 1, V)
    ids = torch.zeros(B, K, dtype=torch.int64)
    top_k, top_p, min_p = torch.full((B,), 50), torch.full((B,), 0.9), torch.full((B,), 0.05)
    rnd = {"seed": torch.arange(B, dtype=torch.int64)}
    args: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
        "sampling_from_probs": ((probs,), rnd),
        "sampling_from_logits": ((logits,), rnd),
        "top_k_sampling_from_probs": ((probs, top_k), rnd),
        "top_p_sampling_from_probs": ((probs, top_p), rnd),
        "min_p_sampling_from_probs": ((probs, min_p), rnd),
        "top_k_top_p_sampling_from_probs": ((probs, top_k, top_p), rnd),
        "top_k_top_p_sampling_from_logits": ((logits, top_k, top_p), rnd),
        "softmax": ((logits,), {"temperature": torch.full((B,), 0.7)}),
        "top_k_renorm_probs": ((probs, top_k), {}),
        "top_p_renorm_probs": ((probs, top_p), {}),
        "top_k_mask_logits": ((logits, top_k), {}),
        "chain_speculative_sampling": ((draft, ids, target), rnd),
    }
    missing = sorted(set(args) - set(sp.__all__))
    if missing:
        raise RuntimeError(f"host_overhead: sampling operations not in spec_samplers.sampling: {missing}")
    return {f"sampling.{name}": (lambda f=getattr(sp, name), a=a, kw=kw: f(*a, **kw)) for name, (a, kw) in args.items()}


def seam_call(workload: str, B: int, V: int) -> Callable[[], Any]:
    from spec_samplers.bench.cost.workloads import Shape, build, shapes_only

    with shapes_only():  # (values are never read: nothing is launched)
        return build(workload, Shape(B, K, V, "bfloat16"), torch.device("cpu"))


def rows_to_build(B: int, V: int, only: list[str] | None) -> list[tuple[str, str, Callable[[], Callable[[], Any]]]]:
    """(entry, impl, builder of the call) for every row at (B, V)."""
    out: list[tuple[str, str, Callable[[], Callable[[], Any]]]] = []
    for entry, (ours, theirs) in SEAMS.items():
        out.append((entry, "ours", lambda w=ours: seam_call(w, B, V)))
        out.append((entry, "vllm", lambda w=theirs: seam_call(w, B, V)))
    for group in (sampler_calls, sampling_calls):
        for name in group(1, 8):  # (names only: the calls are built at (B, V) when measured)
            out.append((name, "ours", lambda g=group, n=name: g(B, V)[n]))
    return [r for r in out if not only or any(text in r[0] for text in only)]


def calls_made(call: Callable[[], Any]) -> dict[str, int]:
    """Python functions and C functions one warm call runs (``sys.setprofile``), its launches
    recorded: a count of host work that the machine's speed does not move."""
    from spec_samplers.bench.cost import trace

    made = {"python": 0, "c": 0}

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            made["python"] += 1
        elif event == "c_call":
            made["c"] += 1

    with trace.tracing(NUM_SMS, peers=True):
        call()
        sys.setprofile(count)
        try:
            call()
        finally:
            sys.setprofile(None)
    made["c"] -= 1  # (sys.setprofile's own return into C)
    return made


def recorded(call: Callable[[], Any]) -> tuple[list[Any], Any]:
    """(the Triton launches, the eager-op counter) of the second call (the first allocates what a
    steady engine step has: arrival counters, a sampler's counters on the device)."""
    from spec_samplers.bench.cost import trace

    with trace.tracing(NUM_SMS, peers=True) as sink:
        call()
        sink.clear()
        counter = trace.OpCounter()
        with counter:
            call()
        return list(sink), counter


def in_turns(calls: list[Callable[[], Any]], repeats: int, clock: Callable[[], float]) -> list[float]:
    """Median time in us of one call of each of ``calls``. The calls take turns (one of each per
    round), so a change of the machine's state during the run (the shared machine's speed moves up
    to 2x between minutes) reaches ours and vLLM's rows alike: rows timed one after the other once
    showed a 1.5x "regression" of code that ran fewer functions."""
    for call in calls:
        call()  # (warm: fills the caches a steady process has)
    samples: list[list[float]] = [[] for _ in calls]
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            for call, own in zip(calls, samples):
                t0 = clock()
                call()
                own.append(clock() - t0)
    finally:
        gc.enable()
    return [statistics.median(own) * 1e6 for own in samples]


def host_us(calls: list[Callable[[], Any]], repeats: int, clock: Callable[[], float]) -> list[float]:
    """:func:`in_turns` of the calls with their launches recorded, not run."""
    from spec_samplers.bench.cost import trace

    with trace.tracing(NUM_SMS, peers=True) as sink:
        # (each call's recorded launches are dropped first: the sink grows otherwise)
        return in_turns([lambda c=call: (sink.clear(), c()) for call in calls], repeats, clock)


def binder_pass(launches: list[Any]) -> Callable[[], None]:
    """Triton's binder plus cache key over all ``launches`` (sm_90 target), as one call."""
    from triton.runtime import jit

    from spec_samplers.bench.cost import sass

    prepared = []
    for launch in launches:
        _, binder = sass.sm90_binder(launch.kernel)
        # the keywords JITFunction.run adds before binding (Triton 3.6 to 3.9 read them as options)
        kwargs = {**launch.args, "num_warps": launch.num_warps, **launch.options, "debug": False}
        prepared.append((binder, kwargs, {}))
    compute = getattr(jit, "compute_cache_key", None)

    def once() -> None:
        for binder, kwargs, key_cache in prepared:
            _, specialization, options = binder(**kwargs)
            if compute is not None:
                compute(key_cache, specialization, options)
            else:  # Triton before compute_cache_key: the key built inline in run()
                _ = str(specialization) + str(options)

    return once


def measure(
    entry: str, impl: str, B: int, V: int, host_vocab: int, build: Callable[..., Callable[[], Any]], repeats: int
) -> tuple[dict[str, Any], dict[str, Any], list[str], Callable[[], Any], Callable[[], None]]:
    """One row but its times (each row of a batch is timed in turns with the others: :func:`in_turns`),
    its details, notes, the call at ``host_vocab`` to time and its binder pass."""
    notes = []
    call = build()
    launches, counter = recorded(call)
    del call
    gc.collect()
    eager = sum(counter.eager.values())
    small = build_at(entry, impl, B, host_vocab)
    small_launches, small_counter = recorded(small)
    if (len(small_launches), sum(small_counter.eager.values())) != (len(launches), eager):
        notes.append(
            f"{entry}/{impl} B={B}: {len(small_launches)} Triton + {sum(small_counter.eager.values())} eager "
            f"at V={host_vocab} (host time) vs {len(launches)} + {eager} at V={V}"
        )
    row = {
        "entry": entry,
        "impl": impl,
        "B": B,
        "launches": len(launches) + eager,
        "host_us": 0.0,  # (set by main: every row of a batch timed in turns)
        "binder_us": 0.0,
    }
    detail = {
        "entry": entry,
        "impl": impl,
        "B": B,
        "triton": [launch.name for launch in launches],
        "eager": dict(counter.eager),
        "syncs": len(counter.syncs),
        "functions_run": calls_made(small),
    }
    return row, detail, notes, small, binder_pass(launches)


def build_at(entry: str, impl: str, B: int, V: int) -> Callable[[], Any]:
    if entry in SEAMS:
        return seam_call(SEAMS[entry][0 if impl == "ours" else 1], B, V)
    group = sampling_calls if entry.startswith("sampling.") else sampler_calls
    return group(B, V)[entry]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "CPU")
    except OSError:
        return platform.processor() or "CPU"


def meta(args: argparse.Namespace) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version()}
    for name in ("torch", "triton", "vllm"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "--short", "HEAD") + ("-dirty" if _git("status", "--porcelain") else ""),
        "machine": f"{_cpu_model()} ({os.cpu_count()} CPUs, {platform.machine()}), no GPU",
        "load_average": list(os.getloadavg()),
        "torch_threads": torch.get_num_threads(),
        "versions": versions,
        "shape": {"V": args.vocab, "host_vocab": args.host_vocab, "k": K, "dtype": "bfloat16", "num_sms": NUM_SMS},
        "repeats": args.repeats,
        "clock": args.clock,
        "how": "measured on CPU tensors, launches planned for a 132-SM GPU and recorded, not run "
        "(benchmarks/host_overhead.py docstring)",
    }


def table(doc: dict[str, Any]) -> str:
    """Markdown: one line per (entry, B), ours and vLLM's side by side."""
    by = {(r["entry"], r["impl"], r["B"]): r for r in doc["rows"]}
    lines = [
        "| entry | B | launches ours / vLLM | host us ours / vLLM | binder us ours / vLLM |",
        "|---|---|---|---|---|",
    ]
    for (entry, impl, B), r in by.items():
        if impl != "ours":
            continue
        v = by.get((entry, "vllm", B))

        def cell(key: str, r: dict[str, Any] = r, v: dict[str, Any] | None = v) -> str:
            return f"{r[key]}" + (f" / {v[key]}" if v else "")

        lines.append(f"| {entry} | {B} | {cell('launches')} | {cell('host_us')} | {cell('binder_us')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="write the rows here (a .md table is written next to it)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--host-vocab", type=int, default=64, help="vocabulary of the host-time calls")
    ap.add_argument("--repeats", type=int, default=30, help="timed calls per row (median)")
    ap.add_argument("--only", action="append", help="rows whose entry contains this text (repeatable)")
    ap.add_argument(
        "--clock",
        choices=("thread", "wall"),
        default="thread",
        help="host time as the thread's CPU time (default: what the call itself runs, which the shared "
        "machine's load does not stretch) or wall time",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from spec_samplers.bench.cost.workloads import prepare_vllm

    prepare_vllm()  # vLLM's real Triton kernels without a GPU (as the cost model loads them)
    doc: dict[str, Any] = {"meta": meta(args), "rows": [], "details": [], "notes": []}
    out = Path(args.json)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    for B in args.batch:
        measured = []
        for entry, impl, build in rows_to_build(B, args.vocab, args.only):
            try:
                measured.append(measure(entry, impl, B, args.vocab, args.host_vocab, build, args.repeats))
            except Exception as exc:  # one broken row must not hide the others
                doc["notes"].append(f"{entry}/{impl} B={B} failed: {type(exc).__name__}: {str(exc)[:300]}")
                print(doc["notes"][-1], file=sys.stderr, flush=True)
        host = host_us([m[3] for m in measured], args.repeats, clock)
        binder = in_turns([m[4] for m in measured], args.repeats, clock)
        for (row, detail, notes, *_), us, bus in zip(measured, host, binder):
            row["host_us"] = round(us, 1)
            row["binder_us"] = round(bus, 1) if detail["triton"] else 0.0
            doc["rows"].append(row)
            doc["details"].append(detail)
            doc["notes"] += notes
            print(json.dumps(row), flush=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")  # (a crash later keeps what was measured)
    doc["meta"]["load_average_end"] = list(os.getloadavg())
    out.write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(
        f"<!-- {doc['meta']['how']}; {doc['meta']['date']}, commit {doc['meta']['commit']}, "
        f"{doc['meta']['machine']}, load {doc['meta']['load_average']}, {doc['meta']['versions']} -->\n"
        + table(doc)
        + "\n"
        + "".join(f"\n- {n}" for n in doc["notes"])
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
