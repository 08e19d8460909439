"""Arguments and entry of ``spec-samplers bench`` and its subcommands ``verify`` (also the bare
``bench``), ``sampling``, ``params`` and ``models`` (wired into ``spec_samplers.cli``).

This module imports the subcommands' modules; they import only :mod:`spec_samplers.bench.arguments`
for what they share, never this module."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import torch

from spec_samplers.bench import models, params_bench, sampling_ops
from spec_samplers.bench.arguments import add_device_arguments, dtype_list, int_list, positive_int, resolve_device

DESCRIPTION = """\
Acceptance microbenchmarks. Bare `bench` (= `bench verify`) runs the verification samplers; the
subcommands `sampling`, `params` and `models` run the other benchmarks (`bench SUBCOMMAND --help`).

verify: runs every registered sampler (or --sampler NAME, repeatable) over synthetic draft/target
pairs of controlled divergence (or --from-file pairs) and prints acceptance per position and
overall, tokens emitted per step, the theory for lossless samplers, the output's total variation
from the target (next to the estimator's noise floor ± its sd), and the time per call with bytes
moved and GB/s.
--sampler typical_acceptance_sampler sweeps posterior_threshold x posterior_alpha (those not
given with --option) and plots acceptance against TV from the target.
--from-file: a .pt dict (torch.save) or .safetensors file with float tensors target_probs [N, V]
and draft_probs [N, V]; row n is one context (the two models' next-token distributions).
Runs on one CPU thread unless --threads says otherwise (fastest on small or shared machines)."""

SAMPLING_DESCRIPTION = """\
The FlashInfer-compatible sampling operations (spec_samplers.sampling) timed against PyTorch's
sort-based top-k/top-p on the same inputs, with each call's bytes and its share of the copy
bandwidth floor (spec_samplers/bench/sampling_ops.py)."""

PARAMS_DESCRIPTION = """\
Acceptance under vLLM SamplingParams (temperature, top-k, top-p, min-p): drafts processed like the
target vs by temperature only, measured and next to the lossless theory sum min(p, q')
(spec_samplers/bench/params_bench.py)."""

TREES_DESCRIPTION = """\
Tokens per target pass, chain vs tree drafting at equal node budgets, on synthetic pairs: theory
(where computable) and Monte Carlo with the package's own tree verifier
(spec_samplers/bench/tree_bench.py; docs/trees.md)."""

#: the mode flags that became subcommands, and the command that replaces each
MOVED_FLAGS = {
    "--models": "spec-samplers bench models TARGET DRAFT",
    "--ops": "spec-samplers bench sampling (or bench verify)",
    "--sampling-params": "spec-samplers bench params",
    "--trees": "spec-samplers bench trees",
}


def moved_flag_message(argv: list[str]) -> str | None:
    """For ``spec-samplers bench`` arguments that use a mode flag of the flag-based CLI, the error
    naming the subcommand that replaces it; for options given before a subcommand, the error
    saying where they go (None otherwise)."""
    if not argv or argv[0] != "bench" or (len(argv) > 1 and argv[1] in SUBCOMMANDS):
        return None
    for arg in argv[1:]:
        flag = arg.partition("=")[0]
        if flag in MOVED_FLAGS:
            return f"spec-samplers bench: error: {flag} is now a subcommand: {MOVED_FLAGS[flag]} (see bench --help)"
    later = [arg for arg in argv[2:] if arg in SUBCOMMANDS]
    if later:  # argparse would let the subcommand's defaults silently replace the options before it
        options = argv[1 : argv.index(later[0])]
        return (
            f"spec-samplers bench: error: options go after the subcommand: "
            f"spec-samplers bench {later[0]} {' '.join(options)} ..."
        )
    return None


def add_verify_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``bench verify`` (and of the bare ``bench``)."""
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
    p.add_argument("--k", type=positive_int, default=4, help="draft tokens per step (default 4)")
    p.add_argument("--rows", type=positive_int, help="rows per context in the quality runs (default 1024, quick 128)")
    p.add_argument(
        "--batch-sizes", type=int_list, help="timed batch sizes (default 1,4,16,64 on CPU; 1,8,32,128,512 on CUDA)"
    )
    p.add_argument("--vocab", type=positive_int, help="vocabulary size of the timed calls (default 32000, quick 2048)")
    p.add_argument(
        "--dtype",
        type=dtype_list,
        default=(torch.float32,),
        help="probability dtypes of the timed calls, e.g. float32,bfloat16",
    )
    p.add_argument("--min-time", type=float, help="seconds of repeats per timed point (default 0.2, quick 0.02)")
    p.add_argument("--no-timing", action="store_true", help="skip the timing")
    add_device_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the workloads and the samplers (default 0)")
    p.add_argument("--from-file", metavar="PATH", help="benchmark on saved target/draft probabilities (layout above)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (schema: spec_samplers/bench/report.py)")
    p.add_argument("--plot", metavar="PATH", help="write a PNG plot (needs matplotlib)")
    p.add_argument(
        "--progress", action="store_true", help="progress bar even when stderr is not a terminal (needs tqdm)"
    )
    p.add_argument("--quick", action="store_true", help="tiny workload (seconds; for tests)")


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``bench sampling``."""
    p.description = SAMPLING_DESCRIPTION
    p.add_argument(
        "--op",
        "--sampling-op",
        action="append",
        dest="sampling_ops",
        metavar="NAME",
        help=f"one operation to time (repeatable; default: all of {', '.join(sampling_ops.OPS)})",
    )
    p.add_argument(
        "--batch-sizes", type=int_list, help="batch sizes (comma-separated; default 1,16, full 1,16,128,512)"
    )
    p.add_argument(
        "--vocabs", type=int_list, help="vocabulary sizes (comma-separated; default 32000,128256, full adds 152064)"
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="the full grid B in 1,16,128,512 x V in 32000,128256,152064 (default 1,16 x 32000,128256)",
    )
    p.add_argument("--min-time", type=float, help="seconds of repeats per timed point (default 0.2, quick 0.02)")
    add_device_arguments(p)
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--progress", action="store_true", help="print each point to stderr as it is timed")
    p.add_argument("--quick", action="store_true", help="tiny workload: B 1,4 x V 2048 (seconds; for tests)")


def add_params_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``bench params``."""
    p.description = PARAMS_DESCRIPTION
    p.add_argument("--k", type=positive_int, default=4, help="draft tokens per step (default 4)")
    p.add_argument("--rows", type=positive_int, help="rows per context (default 1024, quick 128)")
    p.add_argument("--vocab", type=positive_int, help="vocabulary size (default 1000, quick 256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workloads and the sampler (default 0)")
    add_device_arguments(p)
    p.add_argument("--json", metavar="PATH", help=f"write the results as JSON (schema {params_bench.SCHEMA})")
    p.add_argument("--quick", action="store_true", help="tiny workload (seconds; for tests)")


def add_trees_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``bench trees``."""
    p.description = TREES_DESCRIPTION
    p.add_argument("--vocab", type=positive_int, help="vocabulary size of the synthetic pairs (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workloads and the verifier (default 0)")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    p.add_argument("--quick", action="store_true", help="2000 rounds at one draft noise (seconds; for tests)")


#: subcommand -> (help line, argument builder)
SUBCOMMANDS = {
    "verify": (
        "the verification samplers on synthetic or saved pairs (what the bare bench runs)",
        add_verify_arguments,
    ),
    "sampling": ("the FlashInfer-compatible sampling operations vs PyTorch", add_sampling_arguments),
    "params": (
        "acceptance under vLLM SamplingParams, drafts processed alike vs temperature only",
        add_params_arguments,
    ),
    "models": ("acceptance and speedup on a local transformers model pair", models.add_arguments),
    "trees": ("tokens per target pass, chain vs tree at equal node budgets", add_trees_arguments),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``bench`` parser: the verify options (the bare ``bench``) and the subcommands."""
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_verify_arguments(p)
    sub = p.add_subparsers(dest="bench_command", title="subcommands", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, (help_line, add) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_line, description=help_line)
        sp.formatter_class = argparse.RawDescriptionHelpFormatter
        add(sp)
        if name == "verify":
            sp.description = DESCRIPTION


def build_config(args: argparse.Namespace):
    from spec_samplers.bench import runner, workloads

    device = resolve_device(args.device)
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


#: peak memory of one timed call over the size of its inputs: measured 2.6 on the CPU (bench
#: --quick --vocab 262144 and 1048576: 378 bytes of peak RSS per vocabulary entry at B = 4, k = 4,
#: inputs 144), rounded up; covers the baselines timed next to the samplers
TIMING_OVERHEAD = 4
#: peak memory of the quality runs over their tensors (the pairs, the counts, one chunk of rows)
QUALITY_OVERHEAD = 3


def check_memory(config) -> None:
    """Refuse a bench run whose estimated memory exceeds what is available (before allocating)."""
    from spec_samplers.memory_budget import check_fits

    k, V = config.k, config.timing_vocab
    if config.batch_sizes:
        itemsize = max(torch.empty((), dtype=d).element_size() for d in config.dtypes)
        timed = max(config.batch_sizes) * (2 * k + 1) * V * itemsize * TIMING_OVERHEAD
        what = f"the timed call at B = {max(config.batch_sizes)}, k = {k}, V = {V}"
        if config.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(config.device)
            check_fits(timed, what, "--vocab / --batch-sizes / --k", free, where=f"{config.device} memory")
        else:
            check_fits(timed, what, "--vocab / --batch-sizes / --k")
    pairs = sum(3 * s.contexts * s.vocab_size * 4 for s in config.settings)  # target, draft, counts (fp32)
    rows = max(s.contexts for s in config.settings) * config.rows
    check_fits(pairs + drawn_rows_bytes(rows, k), f"the quality runs at --rows {config.rows}, k = {k}", "--rows / --k")


def drawn_rows_bytes(rows: int, k: int) -> int:
    """Memory of verifying ``rows`` requests of k drafted tokens (the quality runs, the demo): draft
    and bonus ids (int64) with torch.multinomial's temporaries, and one chunk of the sampler's rows."""
    from spec_samplers.bench.quality import CHUNK_ELEMENTS

    return rows * (k + 1) * 8 * 3 + CHUNK_ELEMENTS * 4 * QUALITY_OVERHEAD


def _error(exc: Exception) -> int:
    print(f"spec-samplers bench: error: {exc}", file=sys.stderr)
    return 2


def cmd_sampling(args: argparse.Namespace) -> int:
    """``spec-samplers bench sampling``."""
    bad = sorted(set(args.sampling_ops or ()) - set(sampling_ops.OPS))
    if bad:
        return _error(ValueError(f"--op: unknown {', '.join(bad)}; choose from {', '.join(sampling_ops.OPS)}"))
    try:
        return sampling_ops.main(args)
    except (ValueError, RuntimeError) as exc:
        return _error(exc)


def cmd_params(args: argparse.Namespace) -> int:
    """``spec-samplers bench params``."""
    try:
        return params_bench.main(args)
    except ValueError as exc:
        return _error(exc)


def cmd_bench(args: argparse.Namespace) -> int:
    """``spec-samplers bench [verify | sampling | params | models | trees]``."""
    torch.set_num_threads(args.threads)
    command = args.bench_command or "verify"
    if command == "models":
        return models.main(args)
    if command == "sampling":
        return cmd_sampling(args)
    if command == "params":
        return cmd_params(args)
    if command == "trees":
        from spec_samplers.bench import tree_bench

        try:
            return tree_bench.main(tree_bench.argv_from_bench(args))
        except ValueError as exc:
            return _error(exc)
    return cmd_verify(args)


def cmd_verify(args: argparse.Namespace) -> int:
    """``spec-samplers bench`` / ``bench verify``: the verification samplers."""
    from spec_samplers.bench import report, runner

    try:
        config = build_config(args)
        check_memory(config)
        if args.plot:
            from spec_samplers.bench.plot import require_pyplot

            require_pyplot()  # fail before the run, not after it
    except (ValueError, RuntimeError) as exc:  # BenchError is a ValueError
        return _error(exc)
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
    if not (args.json and args.plot):
        print(
            "\nMore: --json PATH writes every number (per-position rates, noise sds, machine; schema in\n"
            "spec_samplers/bench/report.py), --plot PATH a PNG of acceptance and TV against theory\n"
            "(needs matplotlib); e.g. --json bench.json --plot bench.png"
        )
    if args.json:
        report.write_json(args.json, {**document, "summary": report.sampler_summary(document)})
        print(f"\nwrote {args.json}")
    if args.plot:
        from spec_samplers.bench.plot import write_plot

        write_plot(args.plot, document)
        print(f"wrote {args.plot}")
    return 0
