#!/usr/bin/env python
"""Where an eager call's time goes on a GPU: host (Python, launch planning, checks) or device.

The first real-GPU run (benchmarks/results/2026-11-28-gpu-check-H200-V128256.md) measured the
eager entries at 90-600 us per call while their graph replays took 15-50 us, and the sampling
operations 10-30x slower than the PyTorch ones. This script splits one eager call at a time:

* ``device_us``: the sum of the GPU kernels' durations per call (torch.profiler);
* ``launches``: kernels launched per call; ``syncs``: host synchronisations per call (CUDA
  runtime calls named ``*Synchronize``); ``memcpys``: ``cudaMemcpy*`` calls per call;
* ``host_us``: wall time per call over a loop of calls with one synchronize at the end (the rate
  a CPU thread can issue them: when it is far above ``device_us``, the call is host-bound);
* ``events_us``: CUDA-event time of one call (what gpu_check.py reports);
* the host functions that cost the most (cProfile, tottime), to a text file.

    python benchmarks/gpu_host_profile.py --out DIR [--vocab 128256] [--batch 1 64]

Writes ``host_profile.json`` and ``host_profile.txt`` to DIR. ``--device cpu`` runs the same
code on CPU tensors (kernels interpreted; for testing the script, not for its numbers).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from collections.abc import Callable
from pathlib import Path

import torch


def entries(B: int, k: int, V: int, device: str) -> dict[str, Callable[[], object]]:
    import spec_samplers.sampling as sampling
    from spec_samplers import RejectionSampler, SamplingParams, TypicalAcceptanceSampler

    gen = torch.Generator(device=device).manual_seed(0)
    tl = torch.randn(B, k + 1, V, device=device, generator=gen).to(torch.bfloat16)
    dl = torch.randn(B, k, V, device=device, generator=gen).to(torch.bfloat16)
    q = torch.softmax(tl.float(), -1)
    p = torch.softmax(dl.float(), -1)
    ids = torch.randint(0, V, (B, k), device=device, generator=gen)
    bonus = torch.randint(0, V, (B, 1), device=device, generator=gen)
    seeds = torch.arange(B, device=device)
    temp = torch.full((B,), 0.8, device=device)
    rs, ts = RejectionSampler(), TypicalAcceptanceSampler()
    params = SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05)
    probs0 = q[:, 0].contiguous()
    return {
        "RejectionSampler(probs)": lambda: rs(q, bonus, p, ids, seeds=seeds),
        "RejectionSampler(point mass)": lambda: rs(q, bonus, None, ids, seeds=seeds),
        "TypicalAcceptanceSampler(probs)": lambda: ts(q, bonus, p, ids),
        "forward_from_logits(T)": lambda: rs.forward_from_logits(tl, bonus, dl, ids, temp, seeds=seeds),
        "forward_from_logits(SamplingParams)": lambda: rs.forward_from_logits(
            tl, bonus, dl, ids, sampling_params=params, seeds=seeds
        ),
        "sampling.softmax": lambda: sampling.softmax(tl[:, 0]),
        "sampling.sampling_from_probs": lambda: sampling.sampling_from_probs(probs0, seed=1),
        "sampling.top_k_sampling_from_probs": lambda: sampling.top_k_sampling_from_probs(probs0, 50, seed=1),
        "torch.softmax (baseline)": lambda: torch.softmax(tl[:, 0].float(), -1),
        "torch.multinomial (baseline)": lambda: torch.multinomial(probs0, 1),
    }


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def profile_one(fn: Callable[[], object], device: str, calls: int) -> dict:
    for _ in range(3):
        fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    host_us = (time.perf_counter() - t0) / calls * 1e6
    events_us = None
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(max(5, calls // 4)):
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        events_us = sorted(samples)[len(samples) // 2]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    n = 10
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(n):
            fn()
        _sync(device)
    device_us, launches, syncs, memcpys = 0.0, 0, 0, 0
    for e in prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            device_us += e.device_time
            launches += 1
        elif e.name.startswith("cuda") and e.name.endswith("Synchronize"):
            syncs += 1
        elif e.name.startswith("cudaMemcpy"):
            memcpys += 1
    stats = cProfile.Profile()
    stats.enable()
    for _ in range(n):
        fn()
    _sync(device)
    stats.disable()
    text = io.StringIO()
    pstats.Stats(stats, stream=text).sort_stats("tottime").print_stats(18)
    return {
        "host_us": host_us,
        "events_us": events_us,
        "device_us": device_us / n,
        "launches": launches / n,
        "syncs": syncs / n,
        "memcpys": memcpys / n,
        "cprofile": text.getvalue(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    rows, text = [], []
    for B in args.batch:
        for name, fn in entries(B, args.k, args.vocab, args.device).items():
            try:
                r = profile_one(fn, args.device, args.calls)
            except Exception as exc:  # one broken entry must not hide the others' numbers
                rows.append({"entry": name, "B": B, "error": repr(exc)})
                print(rows[-1], flush=True)
                continue
            text.append(f"==== {name}  B={B} V={args.vocab} k={args.k}\n{r.pop('cprofile')}")
            rows.append({"entry": name, "B": B, "V": args.vocab, "k": args.k, **r})
            print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    meta = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "torch": torch.__version__}
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_profile.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "host_profile.txt").write_text("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
