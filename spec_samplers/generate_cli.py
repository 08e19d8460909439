"""``spec-samplers generate``: speculative decoding of one prompt with two local transformers models."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spec_samplers.decoding.tree_drafting import NodeBudget

DESCRIPTION = """\
Generate text from --prompt with speculative decoding: the draft model proposes --k tokens per
round, the target verifies them with --sampler (any registered sampler; default rejection_sampler,
whose output follows the target's distribution under the sampling options exactly). --target and
--draft are local model directories in transformers format (save_pretrained output or a Hugging
Face snapshot directory); nothing is downloaded. The tokenizer is the target's; the draft must
share its vocabulary. Prints the text, the acceptance and the tokens per target forward pass.
With --tree (children per depth, e.g. 2,2,1) or --node-budget (nodes,depth) the draft proposes a
token tree per round, scored in one target pass with tree attention (docs/trees.md)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spec_samplers.bench.arguments import add_sampling_arguments, positive_int

    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--target", required=True, metavar="PATH", help="target model directory")
    p.add_argument("--draft", required=True, metavar="PATH", help="draft model directory")
    p.add_argument("--prompt", required=True, metavar="TEXT", help="the text to continue")
    p.add_argument("--k", type=positive_int, default=4, help="draft tokens per round (default 4)")
    p.add_argument("--sampler", default="rejection_sampler", help="registered sampler (spec-samplers list)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="sampler option (repeatable)")
    p.add_argument("--seed", type=int, help="random seed of the request")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument("--tree", metavar="B1,B2,..", help="draft a static tree: children per depth (e.g. 2,2,1)")
    p.add_argument(
        "--node-budget", metavar="NODES,DEPTH", help="draft a dynamic tree of at most NODES nodes over DEPTH levels"
    )
    p.add_argument(
        "--expansion", choices=("top_k", "sampled"), default="top_k", help="--node-budget expansion (default top_k)"
    )
    p.add_argument(
        "--draft-sampling",
        choices=("independent", "without_replacement", "deterministic"),
        default="independent",
        help="how tree siblings are drawn (default independent)",
    )
    add_sampling_arguments(p)


def tree_from_args(args: argparse.Namespace) -> list[int] | NodeBudget | None:
    """The ``tree=`` of SpeculativeDecoder from --tree / --node-budget (None: a chain)."""
    from spec_samplers.decoding.tree_drafting import NodeBudget

    if args.tree and args.node_budget:
        raise ValueError("--tree and --node-budget: give one of them")
    try:
        if args.tree:
            return [int(b) for b in args.tree.split(",")]
        if args.node_budget:
            nodes, depth = (int(x) for x in args.node_budget.split(","))
            return NodeBudget(nodes, depth, args.expansion)
    except ValueError as exc:
        raise ValueError(f"--tree / --node-budget: expected comma-separated ints ({exc})") from None
    return None


#: bytes per parameter of the checkpoint dtypes config.json names
_ITEMSIZE = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "float64": 8}
#: loaded weights over their file size (buffers, the allocator's slack), and KV cache and
#: activations of one prompt: a margin, not a measurement
LOAD_OVERHEAD = 1.25


def model_bytes(path: str, dtype: str | None) -> int:
    """Memory the model in directory ``path`` takes loaded in ``dtype`` (None: the checkpoint's):
    its weight files' size, rescaled when loading converts the dtype."""
    import json
    import os

    weights = sum(
        os.path.getsize(os.path.join(path, name))
        for name in os.listdir(path)
        if name.endswith((".safetensors", ".bin", ".pt", ".pth"))
    )
    try:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        stored = _ITEMSIZE.get(str(config.get("torch_dtype") or config.get("dtype")), 4)
    except (OSError, ValueError):
        stored = 4
    loaded = stored if dtype is None else _ITEMSIZE[dtype]
    return int(weights * loaded / stored * LOAD_OVERHEAD)


def check_models_fit(args: argparse.Namespace, device: object) -> None:
    """Refuse, before loading, two models that do not fit the available host memory (they are
    read into it on every device)."""
    from spec_samplers.memory_budget import check_fits

    dtype = None if args.model_dtype == "auto" else args.model_dtype
    if dtype is None and getattr(device, "type", None) == "cpu":
        dtype = "float32"  # load_model_pair's default on the CPU
    need = model_bytes(args.target, dtype) + model_bytes(args.draft, dtype)
    check_fits(
        need,
        f"the target and draft models in {dtype or 'their checkpoint dtype'}",
        "--target / --draft / --model-dtype",
    )


def cmd_generate(args: argparse.Namespace) -> int:
    from spec_samplers.bench import runner
    from spec_samplers.bench.arguments import MODEL_DTYPES, resolve_device, sampling_params_from_args
    from spec_samplers.decoding import SpeculativeDecoder
    from spec_samplers.integrations.transformers import check_model_dir, encode_prompt, load_model_pair

    try:
        check_model_dir(args.target, "--target")  # before loading anything: a missing path answers at once
        check_model_dir(args.draft, "--draft")
        device = resolve_device(args.device)
        check_models_fit(args, device)
        params = sampling_params_from_args(args, seed=args.seed)
        spec = runner.resolve_samplers([args.sampler], args.option, sweep=False)[0]
        target, draft, tokenizer = load_model_pair(args.target, args.draft, device, MODEL_DTYPES[args.model_dtype])
        tree = tree_from_args(args)
        decoder = SpeculativeDecoder(
            target, draft, spec.sampler, num_speculative_tokens=args.k, tree=tree, draft_sampling=args.draft_sampling
        )
        prompt = encode_prompt(tokenizer, args.prompt)
        out = decoder.generate([prompt], args.max_new_tokens, params)
    except (ValueError, OSError, ImportError) as exc:
        print(f"spec-samplers generate: error: {exc}", file=sys.stderr)
        return 2
    stats = out.stats[0]
    print(tokenizer.decode(prompt + out.sequences()[0], skip_special_tokens=True))
    print()
    per_position = " ".join(f"{a:.2f}" for a in stats.acceptance_per_position)
    print(
        f"{stats.num_generated} tokens in {stats.num_rounds} rounds, {stats.target_forward_passes} target passes "
        f"(prefill included): {stats.tokens_per_target_pass:.2f} tokens per target pass"
        + (", stopped at EOS" if stats.finished_by_eos else "")
    )
    print(
        f"acceptance {stats.acceptance_rate:.3f} ({stats.num_accepted} of {stats.num_drafted} drafts accepted; "
        f"sampler {spec.label}, {f'tree {tree}' if tree is not None else f'k={args.k}'}); "
        f"per {'depth' if tree is not None else 'position'} {per_position}"
    )
    if spec.lossless and tree is None:
        print(
            f"judged drafts accepted {stats.verified_acceptance_rate:.3f}, lossless expectation "
            f"sum min(p', q') {stats.expected_acceptance_rate:.3f}"
        )
    return 0
