"""The ``spec-samplers`` command.

Start-up: only the chosen subcommand's arguments are built (:func:`build_parser`), and nothing
here imports torch at module level, so ``--help``, ``--version`` and ``list`` answer without it
(tests/test_cli_startup.py checks that structurally)."""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from collections.abc import Callable

from spec_samplers._version import __version__

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
    from spec_samplers.bench.presets import check_demo, print_demo, run_demo

    try:
        check_demo(args.trials, args.k)
    except ValueError as exc:
        print(f"spec-samplers demo: error: {exc}", file=sys.stderr)
        return 2
    rows = run_demo(trials=args.trials, k=args.k)
    print_demo(rows, args.trials, args.k)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from spec_samplers.bench.cli import cmd_bench as run_bench

    return run_bench(args)


def cmd_generate(args: argparse.Namespace) -> int:
    from spec_samplers.generate_cli import cmd_generate as run_generate

    return run_generate(args)


def cmd_profile(args: argparse.Namespace) -> int:
    from spec_samplers.profile_cli import cmd_profile as run_profile

    return run_profile(args)


def _builder(target: str) -> Callable[[argparse.ArgumentParser], None]:
    """The argument builder ``"module:function"``, imported when its subcommand is chosen."""

    def add(p: argparse.ArgumentParser) -> None:
        module, _, name = target.partition(":")
        getattr(importlib.import_module(module), name)(p)

    return add


def cmd_certify(args: argparse.Namespace) -> int:
    from spec_samplers.certify.cli import cmd_certify as run_certify

    return run_certify(args)


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    from spec_samplers.bench.arguments import positive_int

    p.add_argument("--trials", type=positive_int, default=4000, help="rows per setting (default 4000)")
    p.add_argument("--k", type=positive_int, default=4, help="draft tokens per row (default 4)")


def add_tiny_pair_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", metavar="DIR", help="where to write target/ and draft/")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace DIR/target and DIR/draft if they hold files")


def cmd_tiny_pair(args: argparse.Namespace) -> int:
    def error(message: str) -> int:
        print(f"spec-samplers tiny-pair: error: {message}", file=sys.stderr)
        return 2

    if os.path.exists(args.directory) and not os.path.isdir(args.directory):
        return error(f"DIR {args.directory!r}: expected a directory, got a file")
    for name in ("target", "draft"):
        path = os.path.join(args.directory, name)
        if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)) and not args.overwrite:
            return error(f"DIR {args.directory!r}: {path!r} exists and is not empty; pass --overwrite or another DIR")
    try:
        from spec_samplers.certify.tiny_models import tiny_pair_with_tokenizer

        pair = tiny_pair_with_tokenizer(args.directory, seed=args.seed)
    except ImportError as exc:
        return error(f'needs transformers (pip install -e ".[transformers]"): {exc}')
    except OSError as exc:
        return error(f"DIR {args.directory!r}: {exc}")
    print(f"wrote a random Llama pair with a character tokenizer (vocabulary {pair.vocab_size}, seed {pair.seed}):")
    print(f"  target {pair.target} (2 layers), draft {pair.draft} (1 layer)")
    print(f"try: spec-samplers generate --target {pair.target} --draft {pair.draft} --prompt 'hello world'")
    return 0


#: subcommand -> (help line, description (None: the one its argument builder sets), argument
#: builder (None: no options), command). A new subcommand is one more entry here.
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
        _builder("spec_samplers.bench.cli:add_arguments"),
        cmd_bench,
    ),
    "generate": (
        "speculative decoding of a prompt with two local transformers models",
        None,
        _builder("spec_samplers.generate_cli:add_arguments"),
        cmd_generate,
    ),
    "profile": (
        "modeled GPU cost of one verification call (launches, bytes, SASS); no GPU needed",
        "Every kernel launch of one call, the bytes each moves (counted by Triton's interpreter), its sm_90 "
        "SASS (registers, spills, occupancy, instructions per vocabulary element) and a MODELED time on "
        "H100/H200; docs/cost-model.md.",
        _builder("spec_samplers.profile_cli:add_arguments"),
        cmd_profile,
    ),
    "certify": (
        "test whether a speculative decoding setup (vLLM, transformers, ours) keeps the target's law",
        None,
        _builder("spec_samplers.certify.cli:add_arguments"),
        cmd_certify,
    ),
    "tiny-pair": (
        "write a small random target/draft pair with a tokenizer to DIR/target and DIR/draft",
        "A random 2-layer Llama target and its 1-layer draft (the target's weights plus noise), with a "
        "character tokenizer (vocabulary 25), saved with save_pretrained: a model pair to try generate, "
        "certify, bench models and the transformers examples on without downloading anything. Needs "
        "transformers.",
        add_tiny_pair_arguments,
        cmd_tiny_pair,
    ),
}


def _chosen(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given ``argv``, only the subcommand it names gets its arguments (the
    others answer ``--help`` from their help line), so a call imports that subcommand alone."""
    chosen = None if argv is None else _chosen(argv)
    parser = argparse.ArgumentParser(prog="spec-samplers", description="Speculative-decoding verification samplers.")
    parser.add_argument("--version", action="version", version=f"spec-samplers {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_line, description, add, command) in COMMANDS.items():
        p = sub.add_parser(name, help=help_line, description=description)
        if add is not None and (argv is None or name == chosen):
            add(p)
        p.set_defaults(func=command)
    return parser


#: the options that name a file a command writes (checked before the run, which may take minutes)
OUTPUT_OPTIONS = ("json", "plot")


def output_path_error(option: str, path: str) -> str | None:
    """Why ``path`` cannot be written (its nearest existing folder is not a writable folder), or
    None. The writers create missing folders, so a missing folder is fine."""
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if os.path.isdir(path):
        return f"--{option} {path!r}: expected a file path, got a directory"
    if not os.path.isdir(folder):
        return f"--{option} {path!r}: {folder!r} is not a directory"
    if not os.access(folder, os.W_OK):
        return f"--{option} {path!r}: the directory {folder!r} is not writable"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if _chosen(argv) == "bench":
        from spec_samplers.bench.cli import moved_flag_message

        moved = moved_flag_message(argv)
        if moved:  # a mode flag of the flag-based bench: name the subcommand instead of argparse's error
            print(moved, file=sys.stderr)
            return 2
    args = build_parser(argv).parse_args(argv)
    for option in OUTPUT_OPTIONS:
        path = getattr(args, option, None)
        problem = None if path is None else output_path_error(option, path)
        if problem:
            print(f"spec-samplers {args.command}: error: {problem}", file=sys.stderr)
            return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
