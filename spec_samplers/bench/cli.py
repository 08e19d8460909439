"""Arguments and entry of ``spec-samplers bench`` (wired into ``spec_samplers.cli``)."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import torch

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

DESCRIPTION = """\
Acceptance microbenchmarks. Runs every registered sampler (or --sampler NAME, repeatable) over
synthetic draft/target pairs of controlled divergence (or --from-file pairs) and prints acceptance
per position and overall, tokens emitted per step, the theory for lossless samplers, the output's
total variation from the target, and the time per call with bytes moved and GB/s.
--sampler typical_acceptance_sampler sweeps posterior_threshold x posterior_alpha (those not
given with --option) and plots acceptance against TV from the target.
--from-file: a .pt dict (torch.save) or .safetensors file with float tensors target_probs [N, V]
and draft_probs [N, V]; row n is one context (the two models' next-token distributions).
Runs on one CPU thread unless --threads says otherwise (fastest on small or shared machines)."""


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


def _dtype_list(text: str) -> tuple[torch.dtype, ...]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in DTYPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated dtypes from {', '.join(DTYPES)}, got {text!r}")
    return tuple(dict.fromkeys(DTYPES[n] for n in names))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "--sampler", action="append", metavar="NAME", help="sampler to run (repeatable; default: all registered)"
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="constructor option for the selected samplers that have it (repeatable), e.g. posterior_alpha=0.2",
    )
    p.add_argument("--no-sweep", action="store_true", help="do not sweep options (typical acceptance explorer)")
    p.add_argument("--k", type=_positive_int, default=4, help="draft tokens per step (default 4)")
    p.add_argument("--rows", type=_positive_int, help="rows per context in the quality runs (default 1024, quick 128)")
    p.add_argument(
        "--batch-sizes", type=_int_list, help="timed batch sizes (default 1,4,16,64 on CPU; 1,8,32,128,512 on CUDA)"
    )
    p.add_argument("--vocab", type=_positive_int, help="vocabulary size of the timed calls (default 32000, quick 2048)")
    p.add_argument(
        "--dtype",
        type=_dtype_list,
        default=(torch.float32,),
        help="probability dtypes of the timed calls, e.g. float32,bfloat16",
    )
    p.add_argument("--min-time", type=float, help="seconds of repeats per timed point (default 0.2, quick 0.02)")
    p.add_argument("--no-timing", action="store_true", help="skip the timing")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available, else cpu)")
    p.add_argument(
        "--threads",
        type=_positive_int,
        default=1,
        help="torch CPU threads (default 1: the workload is many small calls, and on a small or "
        "shared machine more threads wait on each other; raise it on an idle many-core machine)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--from-file", metavar="PATH", help="benchmark on saved target/draft probabilities (layout above)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (schema: spec_samplers/bench/report.py)")
    p.add_argument("--plot", metavar="PATH", help="write a PNG plot (needs matplotlib)")
    p.add_argument(
        "--progress", action="store_true", help="progress bar even when stderr is not a terminal (needs tqdm)"
    )
    p.add_argument("--quick", action="store_true", help="tiny workload (seconds; for tests)")
    p.add_argument(
        "--sampling-params",
        action="store_true",
        help="instead: acceptance under vLLM SamplingParams, drafts processed alike vs temperature only "
        "(spec_samplers/bench/params_bench.py; uses --k --rows --vocab --seed --device --json --quick)",
    )
    p.add_argument(
        "--trees",
        action="store_true",
        help="instead: tokens per target pass, chain vs tree at equal node budgets, theory and Monte Carlo "
        "(spec_samplers/bench/tree_bench.py; uses --vocab (default 64) --seed --json --quick)",
    )
    from spec_samplers.bench.models import add_arguments as add_model_arguments

    add_model_arguments(p)
    p.add_argument(
        "--ops",
        choices=("verification", "sampling"),
        default="verification",
        help="what to benchmark: the verification samplers (default) or the FlashInfer-compatible "
        "sampling operations against PyTorch's sort-based top-k/top-p (spec_samplers/bench/sampling_ops.py)",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="--ops sampling: the full grid B in 1,16,128,512 x V in 32000,128256,152064 (default 1,16 x 32000,128256)",
    )
    p.add_argument("--vocabs", type=_int_list, help="--ops sampling: vocabulary sizes (comma-separated)")
    p.add_argument(
        "--sampling-op",
        action="append",
        dest="sampling_ops",
        metavar="NAME",
        help="--ops sampling: one operation to time (repeatable; default: all)",
    )


def _device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"--device: expected cpu, cuda or cuda:N, got {name!r}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {name!r} requested but CUDA is not available (torch {torch.__version__})")
    return device


def build_config(args: argparse.Namespace):
    from spec_samplers.bench import runner, workloads

    device = _device(args.device)
    specs = runner.resolve_samplers(args.sampler, args.option, sweep=not args.no_sweep)
    loaded = {}
    if args.from_file:
        setting, target, draft = workloads.load_pairs(args.from_file)
        settings, loaded = [setting], {setting.name: (target, draft)}
    else:
        settings = workloads.default_settings(quick=args.quick)
    if args.rows is not None and args.rows < 2:
        raise ValueError(f"--rows: expected an integer >= 2, got {args.rows}")
    cuda = device.type == "cuda"
    batch_sizes = args.batch_sizes or ((1, 4) if args.quick else (1, 8, 32, 128, 512) if cuda else (1, 4, 16, 64))
    vocab = args.vocab or (settings[0].vocab_size if args.from_file else 2048 if args.quick else 32000)
    return runner.BenchConfig(
        specs=specs,
        settings=settings,
        k=args.k,
        rows=args.rows or (128 if args.quick else 1024),
        seed=args.seed,
        device=device,
        batch_sizes=() if args.no_timing else batch_sizes,
        timing_vocab=vocab,
        dtypes=args.dtype,
        min_time_s=args.min_time if args.min_time is not None else (0.02 if args.quick else 0.2),
        progress=args.progress or (sys.stderr.isatty() and importlib.util.find_spec("tqdm") is not None),
        loaded_pairs=loaded,
        quick=args.quick,
    )


def cmd_bench(args: argparse.Namespace) -> int:
    from spec_samplers.bench import report, runner

    if getattr(args, "models", None):
        from spec_samplers.bench.models import cmd_bench_models

        return cmd_bench_models(args)
    torch.set_num_threads(args.threads)
    if getattr(args, "trees", False):
        from spec_samplers.bench import tree_bench

        return tree_bench.main(tree_bench.argv_from_bench(args))
    if args.sampling_params:
        from spec_samplers.bench.params_bench import cmd_params_bench

        try:
            return cmd_params_bench(args, _device(args.device))
        except ValueError as exc:
            print(f"spec-samplers bench: error: {exc}", file=sys.stderr)
            return 2
    if args.ops == "sampling":
        from spec_samplers.bench import sampling_ops

        bad = sorted(set(args.sampling_ops or ()) - set(sampling_ops.OPS))
        if bad:
            print(
                f"spec-samplers bench: error: --sampling-op: unknown {', '.join(bad)}; choose from "
                f"{', '.join(sampling_ops.OPS)}",
                file=sys.stderr,
            )
            return 2
        try:
            return sampling_ops.main(args)
        except (ValueError, RuntimeError) as exc:
            print(f"spec-samplers bench: error: {exc}", file=sys.stderr)
            return 2
    try:
        config = build_config(args)
        if args.plot:
            from spec_samplers.bench.plot import _pyplot

            _pyplot()  # fail before the run, not after it
    except (ValueError, RuntimeError) as exc:  # BenchError is a ValueError
        print(f"spec-samplers bench: error: {exc}", file=sys.stderr)
        return 2
    document = {
        "schema": report.SCHEMA,
        "machine": report.machine_info(config.device),
        "config": {
            "k": config.k,
            "rows": config.rows,
            "seed": config.seed,
            "quick": config.quick,
            "batch_sizes": list(config.batch_sizes),
            "timing_vocab": config.timing_vocab,
            "dtypes": [str(d).replace("torch.", "") for d in config.dtypes],
            "min_time_s": config.min_time_s,
            "from_file": args.from_file,
            "threads": torch.get_num_threads(),
        },
        **runner.run(config),
    }
    print(report.render(document))
    if args.json:
        report.write_json(args.json, document)
        print(f"\nwrote {args.json}")
    if args.plot:
        from spec_samplers.bench.plot import write_plot

        write_plot(args.plot, document)
        print(f"wrote {args.plot}")
    return 0
