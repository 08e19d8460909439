"""``spec-samplers bench models TARGET DRAFT``: acceptance and speedup on a real model pair.

For every selected sampler (default: all registered), each prompt is generated on its own
(batch 1, the latency setting) with speculative decoding, and again with plain autoregressive
decoding of the target alone; the draft alone is timed too, which gives the cost ratio
c = draft pass time / target pass time. Reported per sampler: acceptance (accepted / drafted
tokens, vLLM's definition), acceptance per position, the judged drafts' acceptance next to the
lossless expectation sum_x min(p', q'), tokens per round, tokens/s and the speedup over the
target alone. A round emits E tokens (measured: tokens per round; with per-position acceptance a,
E = (1 - a^(k+1)) / (1 - a)) and costs k draft passes and one target pass over k + 1 tokens, v
times a one-token target pass (measured), so the expected speedup is E / (c k + v) (Leviathan et
al. 2023 with v = 1); the loop's own work (logits processing, sampling, verification, cache
bookkeeping) is what the measured speedup loses beyond that.

Models are local directories (``save_pretrained`` layout, e.g. a Hugging Face snapshot); nothing is
downloaded. The tokenizer comes from the target directory. EOS is ignored unless
``--stop-at-eos`` (so every run generates the same number of tokens).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spec_samplers.bench.arguments import (
    MODEL_DTYPES,
    add_device_arguments,
    add_sampling_arguments,
    positive_int,
    resolve_device,
    sampling_params_from_args,
)

SCHEMA = "spec-samplers-models/1"
DEFAULT_PROMPTS = (
    "The quick brown fox",
    "In a distant future, the city of",
    "def fibonacci(n):",
    "Speculative decoding works by",
)
DESCRIPTION = """\
Speculative decoding on a real model pair: TARGET and DRAFT are local model directories
(transformers format: save_pretrained output or a Hugging Face snapshot; nothing is downloaded).
Each prompt is generated at batch 1 with every selected sampler (default: all registered) and
with the target alone; prints acceptance (overall, per position, and next to the lossless
expectation), tokens per round, tokens/s, the speedup over the target alone, and the speedup
expected from the measured pass costs (tok/rnd / (c k + v))."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``spec-samplers bench models``."""
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("target", metavar="TARGET", help="target model directory")
    p.add_argument("draft", metavar="DRAFT", help="draft model directory (same vocabulary as the target)")
    p.add_argument(
        "--sampler", action="append", metavar="NAME", help="sampler to run (repeatable; default: all registered)"
    )
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="sampler option (repeatable)")
    p.add_argument("--k", type=positive_int, default=4, help="draft tokens per round (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first prompt's request (default 0)")
    p.add_argument("--prompt", action="append", metavar="TEXT", help="prompt (repeatable; default: 4 built-in prompts)")
    p.add_argument("--stop-at-eos", action="store_true", help="stop at the target's EOS (default: ignore it)")
    p.add_argument("--json", metavar="PATH", help=f"write the results as JSON (schema {SCHEMA})")
    add_device_arguments(p)
    add_sampling_arguments(p)


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def _verify_cost(model: Any, prompt: list[int], k: int, device: torch.device, repeats: int = 5) -> float:
    """Time of a target pass over k + 1 tokens / time of a pass over one token (median of repeats),
    after the prompt, on a cache that each pass is cropped back from."""
    cache = model.new_kv_cache()
    model.forward(torch.tensor([prompt], device=device), cache)
    times: dict[int, list[float]] = {1: [], k + 1: []}
    for _ in range(repeats):
        for q in (1, k + 1):
            ids = torch.tensor([prompt[-1:] * q], device=device)
            times[q].append(_timed(functools.partial(model.forward, ids, cache), device)[1])
            cache.crop(q)
    return statistics.median(times[k + 1]) / statistics.median(times[1])


def _sum_stats(outputs: Sequence[Any]) -> dict[str, Any]:
    stats = [s for out in outputs for s in out.stats]
    total = {
        name: sum(getattr(s, name) for s in stats)
        for name in (
            "num_generated",
            "num_drafted",
            "num_accepted",
            "num_verified",
            "expected_accepted",
            "num_rounds",
            "target_forward_passes",
        )
    }
    k = max((len(s.accepted_per_position) for s in stats), default=0)
    per_position = [sum(s.accepted_per_position[i] for s in stats) for i in range(k)]

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    return {
        "tokens": total["num_generated"],
        "acceptance": ratio(total["num_accepted"], total["num_drafted"]),
        "acceptance_per_position": [ratio(a, total["num_rounds"]) for a in per_position],
        "judged_acceptance": ratio(total["num_accepted"], total["num_verified"]),
        "lossless_expectation": ratio(total["expected_accepted"], total["num_verified"]),
        "tokens_per_target_pass": ratio(total["num_generated"], total["target_forward_passes"]),
        "rounds": total["num_rounds"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the model-pair benchmark; returns the JSON document."""
    from spec_samplers.bench import runner
    from spec_samplers.decoding import SpeculativeDecoder, generate_autoregressive
    from spec_samplers.integrations.transformers import encode_prompt, load_model_pair

    device = resolve_device(args.device)
    specs = runner.resolve_samplers(args.sampler, args.option, sweep=False)
    params = sampling_params_from_args(args)
    target, draft, tokenizer = load_model_pair(
        args.target, args.draft, device, MODEL_DTYPES[args.model_dtype], args.stop_at_eos
    )
    prompts = [encode_prompt(tokenizer, text) for text in (args.prompt or DEFAULT_PROMPTS)]
    n = args.max_new_tokens

    def plain(model: Any) -> tuple[list[Any], float]:
        outs, seconds = [], 0.0
        for i, prompt in enumerate(prompts):
            out, dt = _timed(
                functools.partial(generate_autoregressive, model, [prompt], n, params, seed=args.seed + i), device
            )
            outs.append(out)
            seconds += dt
        return outs, seconds

    # warm-up: allocator, kernels, lazy initialisation
    generate_autoregressive(target, [prompts[0]], min(n, 4), params)
    generate_autoregressive(draft, [prompts[0]], min(n, 4), params)
    target_outs, target_s = plain(target)
    draft_outs, draft_s = plain(draft)
    target_tokens = sum(o.stats[0].num_generated for o in target_outs)
    draft_tokens = sum(o.stats[0].num_generated for o in draft_outs)
    target_tps = target_tokens / target_s
    rows = []
    for spec in specs:
        decoder = SpeculativeDecoder(target, draft, spec.sampler, num_speculative_tokens=args.k)
        decoder.generate([prompts[0]], min(n, 4), params)  # warm-up
        outs, seconds = [], 0.0
        for i, prompt in enumerate(prompts):
            out, dt = _timed(functools.partial(decoder.generate, [prompt], n, params, seed=args.seed + i), device)
            outs.append(out)
            seconds += dt
        summary = _sum_stats(outs)
        tps = summary["tokens"] / seconds
        rows.append(
            {
                "sampler": spec.label,
                "lossless": spec.lossless,
                "seconds": seconds,
                "tokens_per_s": tps,
                "speedup": tps / target_tps,
                **summary,
            }
        )
    cost_ratio = (draft_s / draft_tokens) / (target_s / target_tokens)
    verify_cost = _verify_cost(target, prompts[0], args.k, device)
    for row in rows:
        per_round = row["tokens"] / row["rounds"] if row["rounds"] else None
        row["tokens_per_round"] = per_round
        row["expected_speedup"] = None if per_round is None else per_round / (cost_ratio * args.k + verify_cost)
    return {
        "schema": SCHEMA,
        "target": args.target,
        "draft": args.draft,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "k": args.k,
        "max_new_tokens": n,
        "prompts": len(prompts),
        "sampling_params": {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "min_p": params.min_p,
        },
        "stop_at_eos": args.stop_at_eos,
        "target_alone": {"tokens": target_tokens, "seconds": target_s, "tokens_per_s": target_tps},
        "draft_alone": {"tokens": draft_tokens, "seconds": draft_s, "tokens_per_s": draft_tokens / draft_s},
        "cost_ratio": cost_ratio,
        "verify_cost": verify_cost,
        "samplers": rows,
    }


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def render(doc: dict[str, Any]) -> str:
    sp = doc["sampling_params"]
    lines = [
        f"target {doc['target']}  draft {doc['draft']}  ({doc['device']}, {doc['threads']} threads)",
        f"k={doc['k']}, {doc['prompts']} prompts x {doc['max_new_tokens']} new tokens, batch 1, temperature "
        f"{sp['temperature']} top_p {sp['top_p']} top_k {sp['top_k']} min_p {sp['min_p']}"
        + ("" if doc["stop_at_eos"] else ", EOS ignored"),
        (
            f"target alone: {doc['target_alone']['tokens_per_s']:.1f} tokens/s; draft alone: "
            f"{doc['draft_alone']['tokens_per_s']:.1f} tokens/s; c = draft/target pass time = {doc['cost_ratio']:.3f}; "
            f"v = target pass over k+1 tokens / over 1 token = {doc['verify_cost']:.2f}"
        ),
        "",
        (
            f"{'sampler':<40} {'accept':>7} {'judged':>7} {'theory':>7} {'tok/rnd':>8} {'tok/s':>8} {'speedup':>8} "
            f"{'expected':>8}  per position"
        ),
    ]
    for r in doc["samplers"]:
        theory = r["lossless_expectation"] if r["lossless"] else None
        per_pos = " ".join(_fmt(a, ".2f") for a in r["acceptance_per_position"])
        lines.append(
            f"{r['sampler']:<40} {_fmt(r['acceptance']):>7} {_fmt(r['judged_acceptance']):>7} {_fmt(theory):>7} "
            f"{_fmt(r['tokens_per_round'], '.2f'):>8} {r['tokens_per_s']:>8.1f} {r['speedup']:>7.2f}x "
            f"{_fmt(r['expected_speedup'], '.2f'):>7}x  {per_pos}"
        )
    lines += [
        "",
        (
            "accept: accepted / drafted tokens; judged: accepted / drafts the sampler judged (all earlier ones "
            "accepted); theory: sum_x min(p', q') over the judged drafts (what a lossless sampler accepts on average); "
            "tok/rnd: tokens per round (per target pass after the prefill); speedup: tokens/s over the target alone; "
            "expected: tok/rnd / (c k + v), the speedup if the loop's own work were free."
        ),
    ]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """``spec-samplers bench models``."""
    torch.set_num_threads(args.threads)
    try:
        document = run(args)
    except (ValueError, OSError, ImportError) as exc:  # BenchError and SamplingParams errors are ValueErrors
        print(f"spec-samplers bench: error: {exc}", file=sys.stderr)
        return 2
    print(render(document))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0
