"""The ``spec-samplers`` command."""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable

from spec_samplers.bench.arguments import positive_int
from spec_samplers.bench.cli import add_arguments as add_bench_arguments
from spec_samplers.bench.cli import moved_flag_message
from spec_samplers.generate_cli import add_arguments as add_generate_arguments
from spec_samplers.profile_cli import add_arguments as add_profile_arguments

Command = Callable[[argparse.Namespace], int]


def _format_default(value: object) -> str:
    return "required" if value is inspect.Parameter.empty else repr(value)


def cmd_list(args: argparse.Namespace) -> int:
    from spec_samplers.registry import available_samplers

    for name, info in available_samplers().items():
        try:
            options = info.options()
        except Exception as exc:  # a broken third-party entry point must not hide the others
            print(f"{name}  ({info.target}, package {info.package}): failed to load: {exc}")
            continue
        opts = ", ".join(f"{k}={_format_default(v)}" for k, v in options.items())
        print(f"{name}  ({info.target}, package {info.package})")
        print(f"    options: {opts or '(none)'}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from spec_samplers.bench.presets import print_demo, run_demo

    rows = run_demo(trials=args.trials, k=args.k)
    print_demo(rows, args.trials, args.k)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from spec_samplers.bench.cli import cmd_bench as run_bench

    return run_bench(args)


def cmd_generate(args: argparse.Namespace) -> int:
    from spec_samplers.generate_cli import cmd_generate as run_generate

    return run_generate(args)


def add_certify_arguments(p: argparse.ArgumentParser) -> None:
    from spec_samplers.certify.cli import add_arguments  # sets the command too

    add_arguments(p)


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trials", type=positive_int, default=4000, help="rows per setting (default 4000)")
    p.add_argument("--k", type=positive_int, default=4, help="draft tokens per row (default 4)")


#: subcommand -> (help line, description (None: the one its argument builder sets), argument
#: builder, command (None: the one its argument builder sets))
COMMANDS: dict[str, tuple[str, str | None, Callable[[argparse.ArgumentParser], None] | None, Command | None]] = {
    "list": (
        "list every registered sampler with its options and source package",
        "Every sampler registered under the spec_samplers.samplers entry point (built-in and third-party), "
        "with its constructor options and defaults and the package it comes from.",
        None,
        cmd_list,
    ),
    "demo": (
        "acceptance demo on synthetic distributions (measured vs 1 - TV)",
        "RejectionSampler on five synthetic draft/target pairs (V = 1000, draft = target logits + sigma * "
        "noise): measured acceptance at the first position next to the theory 1 - TV(p, q), and tokens "
        "emitted per step next to (1 - a^(k+1)) / (1 - a). No model needed.",
        add_demo_arguments,
        cmd_demo,
    ),
    "bench": (
        "benchmarks: verification samplers (bare bench), sampling ops, SamplingParams, model pairs, trees",
        None,
        add_bench_arguments,
        cmd_bench,
    ),
    "generate": (
        "speculative decoding of a prompt with two local transformers models",
        None,
        add_generate_arguments,
        cmd_generate,
    ),
    "profile": (
        "modeled GPU cost of one verification call (launches, bytes, SASS); no GPU needed",
        "Every kernel launch of one call, the bytes each moves (counted by Triton's interpreter), its sm_90 "
        "SASS (registers, spills, occupancy, instructions per vocabulary element) and a MODELED time on "
        "H100/H200; docs/cost-model.md.",
        add_profile_arguments,
        None,
    ),
    "certify": (
        "test whether a speculative decoding setup (vLLM, transformers, ours) keeps the target's law",
        None,
        add_certify_arguments,
        None,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spec-samplers", description="Speculative-decoding verification samplers.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_line, description, add, command) in COMMANDS.items():
        p = sub.add_parser(name, help=help_line, description=description)
        if add is not None:
            add(p)
        if command is not None:
            p.set_defaults(func=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    moved = moved_flag_message(argv)
    if moved:  # a mode flag of the flag-based bench: name the subcommand instead of argparse's error
        print(moved, file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
