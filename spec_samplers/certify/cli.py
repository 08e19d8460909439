"""``spec-samplers certify``: run a speculative decoding setup and test whether its output has the
target's law (exit 0: consistent with exactness; 1: evidence of loss; 2: bad usage)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from typing import Any

DESCRIPTION = """\
Generate N seeded continuations of a few prompts with speculative decoding on, compute the
target's exact law of their first m tokens with the target model itself (non-speculative, the
same sampling parameters), and test the samples against it: per position and jointly, the TV
distance with a confidence interval, a chi-square p-value, and a verdict whose false-failure
rate is --alpha. Exit 0 when the output is consistent with exactness, 1 on evidence of loss.

Without --target, a tiny random Llama pair (vocabulary 16, a 2-layer target and a 1-layer draft)
is built. Without --samples, N is the smallest that detects, with probability --power, a law at
TV distance --detectable-tv from the target's. --engine vllm runs vLLM's CPU build and must be
started with that environment's python (docs/certify.md)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spec_samplers.bench.arguments import add_filter_arguments, positive_int
    from spec_samplers.certify.engines import ENGINES
    from spec_samplers.certify.faults import PLANTS

    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--engine", required=True, choices=ENGINES, help="the setup to certify")
    p.add_argument("--target", metavar="DIR", help="target model directory (default: a tiny pair built here)")
    drafting = p.add_mutually_exclusive_group()
    drafting.add_argument("--draft", metavar="DIR", help="draft model directory")
    drafting.add_argument("--ngram", action="store_true", help="n-gram (prompt lookup) drafting instead of a draft")
    p.add_argument("--sampler", help="registered sampler (spec-samplers list); default: the engine's own verification")
    add_filter_arguments(p)
    p.add_argument(
        "--mixed-batch",
        action="store_true",
        help="batch greedy requests with the sampled ones and "
        "check the greedy rows token for token against the target's greedy continuation",
    )
    p.add_argument("--tokens", type=positive_int, default=2, metavar="M", help="generated tokens tested (default 2)")
    p.add_argument("--samples", type=positive_int, metavar="N", help="requests in all (default: from --detectable-tv)")
    p.add_argument("--alpha", type=float, default=0.01, help="false-failure rate of the verdict (default 0.01)")
    p.add_argument("--json", metavar="OUT", help="write the full report here")
    more = p.add_argument_group("more options")
    more.add_argument("--detectable-tv", type=float, default=0.1, help="TV the chosen N detects (default 0.1)")
    more.add_argument("--power", type=float, default=0.95, help="probability of detecting it (default 0.95)")
    more.add_argument("--prompts", metavar="IDS;IDS", help="token-id prompts, e.g. '1,2,3;4,5' (default: 3 prompts)")
    more.add_argument("--k", type=positive_int, default=3, help="draft tokens per round (default 3)")
    more.add_argument("--tree", metavar="B1,B2,..", help="spec-samplers engine: draft a static tree")
    more.add_argument(
        "--draft-sampling",
        choices=("independent", "without_replacement", "deterministic"),
        default="independent",
        help="how tree siblings are drawn (default independent)",
    )
    more.add_argument(
        "--plant",
        choices=sorted(PLANTS),
        help="spec-samplers engine: run a planted fault, to see "
        "the test's power: " + "; ".join(f"{k}: {v}" for k, v in PLANTS.items()),
    )
    more.add_argument("--dtype", default="float32", help="the engine's model dtype (default float32)")
    more.add_argument("--seed", type=int, default=0, help="base seed of the requests (default 0)")
    more.add_argument("--batch-size", type=positive_int, default=2048, help="requests per engine call")
    more.add_argument("--vocab-size", type=int, default=16, help="vocabulary of the tiny pair (default 16)")
    more.add_argument("--work-dir", metavar="DIR", help="where to build the tiny pair (default: a temporary dir)")
    more.add_argument(
        "--min-prob",
        type=float,
        help="lump continuations below this probability "
        "(default: 0 when the law has at most 100000 cells, else 5 / N per prompt)",
    )
    p.set_defaults(func=cmd_certify)


def _prompts(text: str | None) -> list[list[int]]:
    from spec_samplers.certify.tiny_models import TINY_PROMPTS

    if not text:
        return [list(p) for p in TINY_PROMPTS]
    try:
        prompts = [[int(t) for t in part.split(",") if t.strip()] for part in text.split(";") if part.strip()]
    except ValueError:
        raise ValueError(f"--prompts: expected token ids like '1,2,3;4,5', got {text!r}") from None
    if not prompts or not all(prompts):
        raise ValueError(f"--prompts: expected at least one non-empty prompt, got {text!r}")
    return prompts


def _check_prompt_ids(prompts: list[list[int]], vocab_size: int) -> None:
    """Every prompt id in the target's vocabulary (an id outside it would index past the embedding)."""
    for b, prompt in enumerate(prompts):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"--prompts: expected token ids in [0, {vocab_size}) (the target's vocabulary), "
                f"got {bad[0]} in prompt {b}"
            )


def _table(verdict: Any) -> list[str]:
    """One line per test: the p-value and the threshold it is compared with in columns of their
    own; a test whose cells all pooled away (df = 0) reads "untested", not a pass."""
    head = f"{'test':<20} {'TV':>7} {'CI (1-alpha)':>17} {'noise TV':>9} {'chi2/df':>13} {'p':>9}"
    lines = [f"{head} {'rejects if p <':>14}  verdict"]
    for t in verdict.tests:
        if t.df == 0:
            chi2, p_value, outcome = f"{'-':>8}/{0:<4d}", f"{'-':>9}", "untested (no cell with an expected count of 5)"
        else:
            chi2, p_value = f"{t.chi2:8.1f}/{t.df:<4d}", f"{t.p_value:9.3g}"
            outcome = "REJECTS" if t.rejects else "ok"
        lines.append(
            f"{t.name:<20} {t.tv:7.4f} [{t.tv_low:6.4f}, {t.tv_high:6.4f}] {t.noise_tv:9.4f} "
            f"{chi2} {p_value} {t.threshold:14.2g}  {outcome}"
        )
    return lines


def certify(args: argparse.Namespace) -> dict[str, Any]:
    """Run the certification that ``args`` describe and return its report (``consistent`` says
    the verdict)."""
    from spec_samplers.certify.engines import PROCESSING, Setup, run, vllm_unavailable
    from spec_samplers.certify.law import check_samples, greedy_continuation, samples_needed, target_law
    from spec_samplers.certify.tiny_models import build_tiny_pair, load_causal_lm
    from spec_samplers.decoding.tree_drafting import as_tree_shape
    from spec_samplers.integrations.transformers import check_model_dir
    from spec_samplers.sampling_params import SamplingParams

    if not 0 < args.alpha < 1:
        raise ValueError(f"--alpha: expected a number in (0, 1), got {args.alpha}")
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p)
    if params.is_greedy:
        raise ValueError("--temperature: certify tests a sampled law (> 0); greedy rows are checked with --mixed-batch")
    if args.plant and args.engine != "spec-samplers":
        raise ValueError("--plant: planted faults run on --engine spec-samplers")
    if args.engine == "vllm" and vllm_unavailable():  # before any model is built
        raise ValueError(f"--engine vllm: {vllm_unavailable()}")
    prompts = _prompts(args.prompts)
    target_dir, draft_dir = args.target, args.draft
    built = None
    if target_dir is None:
        if draft_dir is not None:
            raise ValueError("--draft without --target: give both, or neither for the tiny pair")
        work = args.work_dir or tempfile.mkdtemp(prefix="spec-samplers-certify-")
        built = build_tiny_pair(work, vocab_size=args.vocab_size, seed=args.seed)
        target_dir, draft_dir = built.target, (None if args.ngram else built.draft)
    else:
        check_model_dir(target_dir, "--target")
        if draft_dir is not None:
            check_model_dir(draft_dir, "--draft")
        elif not args.ngram:
            raise ValueError("--target: give --draft DIR or --ngram with it")
    tree = [int(b) for b in args.tree.split(",")] if args.tree else None
    if tree is not None:
        as_tree_shape(tree)  # a bad shape answers before anything runs
    m = args.tokens
    model = load_causal_lm(target_dir)
    processing = PROCESSING[args.engine]
    vocab = int(model.config.vocab_size)
    _check_prompt_ids(prompts, vocab)

    def laws_at(min_prob: float) -> list[Any]:
        return [target_law(model, p, m, params, processing, min_prob) for p in prompts]

    min_prob = args.min_prob
    full_cells = vocab**m
    laws = laws_at(min_prob if min_prob is not None else (0.0 if full_cells <= 100_000 else 1e-3))
    n_total = args.samples or samples_needed(laws, args.detectable_tv, args.alpha, args.power)
    n_per_prompt = math.ceil(n_total / len(prompts))
    if min_prob is None and full_cells > 100_000:  # lump what the chi-square would pool anyway
        laws = laws_at(5.0 / n_per_prompt)
        if not args.samples:
            n_per_prompt = math.ceil(samples_needed(laws, args.detectable_tv, args.alpha, args.power) / len(prompts))
    setup = Setup(
        engine=args.engine,
        target=target_dir,
        draft=draft_dir,
        params=params,
        num_tokens=m,
        num_speculative_tokens=args.k,
        sampler=args.sampler,
        tree=tree,
        draft_sampling=args.draft_sampling,
        plant=args.plant,
        mixed_batch=args.mixed_batch,
        seed=args.seed,
        batch_size=args.batch_size,
        dtype=args.dtype,
    )
    result = run(setup, prompts, n_per_prompt)
    if result.stop_token_ids and not laws[0].stop_token_ids:
        laws = [target_law(model, p, m, params, processing, laws[0].min_prob, result.stop_token_ids) for p in prompts]
    verdict = check_samples(laws, result.samples, args.alpha)
    greedy_report: dict[str, Any] | None = None
    consistent = verdict.consistent
    if args.mixed_batch:
        expected = [greedy_continuation(model, p, m) for p in prompts]
        rows = [(b, row) for b, group in enumerate(result.greedy) for row in group]
        wrong = [(b, row) for b, row in rows if row[:m] != expected[b]]
        greedy_report = {
            "requests": len(rows),
            "wrong": len(wrong),
            "examples": [{"prompt": prompts[b], "got": row[:m], "expected": expected[b]} for b, row in wrong[:5]],
        }
        consistent = consistent and not wrong and bool(rows)
    return {
        "consistent": consistent,
        "engine": args.engine,
        "sampler": args.sampler
        or (
            "planted: " + args.plant if args.plant else "rejection_sampler" if args.engine == "spec-samplers" else "own"
        ),
        "drafting": "ngram" if args.ngram else ("tree " + args.tree if args.tree else f"draft model, k={args.k}"),
        "target": target_dir,
        "draft": draft_dir,
        "tiny_pair": built is not None,
        "params": {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "min_p": params.min_p,
        },
        "processing": processing,
        "tokens": m,
        "prompts": prompts,
        "samples": verdict.num_samples,
        "samples_chosen_for": None if args.samples else {"detectable_tv": args.detectable_tv, "power": args.power},
        "alpha": args.alpha,
        "law_cells": [law.num_cells for law in laws],
        "min_prob": laws[0].min_prob,
        "acceptance_rate": result.acceptance_rate,
        "tokens_per_target_pass": result.tokens_per_target_pass,
        "engine_seconds": result.seconds,
        "notes": result.notes,
        "verdict": verdict.as_dict(),
        "greedy": greedy_report,
        "_verdict": verdict,
    }


def cmd_certify(args: argparse.Namespace) -> int:
    try:
        report = certify(args)
    except (ValueError, OSError, ImportError) as exc:
        print(f"spec-samplers certify: error: {exc}", file=sys.stderr)
        return 2
    verdict = report.pop("_verdict")
    p = report["params"]
    print(
        f"engine {report['engine']}, verification {report['sampler']}, {report['drafting']}; T={p['temperature']} "
        f"top_p={p['top_p']} top_k={p['top_k']} min_p={p['min_p']} ({report['processing']} processing)"
    )
    chosen = report["samples_chosen_for"]
    print(
        f"{report['samples']} requests over {len(report['prompts'])} prompts, first {report['tokens']} tokens"
        + (
            f" (N chosen to detect TV >= {chosen['detectable_tv']} with probability {chosen['power']})"
            if chosen
            else ""
        )
        + f"; engine time {report['engine_seconds']:.1f} s"
        + (f"; acceptance {report['acceptance_rate']:.3f}" if report["acceptance_rate"] is not None else "")
        + (
            f"; {report['tokens_per_target_pass']:.2f} tokens per target pass (prefill included)"
            if report["tokens_per_target_pass"] is not None
            else ""
        )
    )
    for line in _table(verdict):
        print(line)
    if verdict.joint.df == 0:
        print("warning: no cell has an expected count of 5 at this N: the chi-square tests have nothing to test")
    if verdict.impossible:
        print(f"{verdict.impossible} continuations the target gives probability 0, e.g. {verdict.impossible_examples}")
    if report["greedy"] is not None:
        g = report["greedy"]
        print(
            f"greedy rows in the mixed batch: {g['wrong']} of {g['requests']} differ from the target's greedy output"
            + (f", e.g. {g['examples'][0]}" if g["examples"] else "")
        )
    for note in report["notes"]:
        print(f"note: {note}")
    verdict_line = (
        f"CONSISTENT with exactness (an exact engine fails with probability <= {report['alpha']})"
        if report["consistent"]
        else "EVIDENCE OF LOSS: the output does not follow the target's law"
    )
    print(verdict_line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if report["consistent"] else 1
