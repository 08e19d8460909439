"""Command-line pieces shared by the ``bench`` subcommands and ``generate``: argument types, the
device option, the dtype names and the SamplingParams options.

Every module of the bench that parses arguments imports them from here (never from another
subcommand's module), so the subcommands do not import each other.
"""

from __future__ import annotations

import argparse

import torch

from spec_samplers.sampling_params import SamplingParams

#: dtype names accepted by --dtype and --model-dtype
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
#: the bench's dtype names, and "auto": the checkpoint's own dtype
MODEL_DTYPES: dict[str, torch.dtype | None] = {"auto": None, **DTYPES}


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated integers >= 1."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


def dtype_list(text: str) -> tuple[torch.dtype, ...]:
    """argparse type: comma-separated dtype names from :data:`DTYPES`."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in DTYPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated dtypes from {', '.join(DTYPES)}, got {text!r}")
    return tuple(dict.fromkeys(DTYPES[n] for n in names))


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def resolve_device(name: str | None) -> torch.device:
    """The ``--device`` option: None gives cuda when available, else cpu; ValueError for a name
    torch does not know or for CUDA without a GPU."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"--device: expected cpu, cuda or cuda:N, got {name!r}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {name!r} requested but CUDA is not available (torch {torch.__version__})")
    return device


def add_device_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--device and --threads."""
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available, else cpu)")
    p.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch CPU threads (default 1: the workload is many small calls, and on a small or "
        "shared machine more threads wait on each other; raise it on an idle many-core machine)",
    )


def add_filter_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--temperature, --top-p, --top-k, --min-p: SamplingParams' fields (``generate``, ``bench
    models``, ``certify``)."""
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (default 1: off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most probable tokens (default 0: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="keep tokens >= min_p * max probability (default 0: off)")


def add_sampling_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """SamplingParams fields and the model dtype as options (``generate`` and ``bench models``)."""
    add_filter_arguments(p)
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument(
        "--model-dtype",
        choices=sorted(MODEL_DTYPES),
        default="auto",
        help="dtype to load the models in (default auto: the checkpoint's; float32 on CPU)",
    )


def sampling_params_from_args(args: argparse.Namespace, seed: int | None = None) -> SamplingParams:
    """The SamplingParams that :func:`add_sampling_arguments`'s options describe."""
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, seed=seed)
