"""Acceptance under vLLM SamplingParams: drafts processed alike vs by temperature only.

``spec-samplers bench params`` runs it.

A request's SamplingParams turn the target's logits into q' (temperature, min-p, top-k, top-p in
vLLM's order, :func:`spec_samplers.sampling_params.process_logits`). The draft can be sampled
from

* ``alike``: its logits processed with the same parameters, p' (what
  ``forward_from_logits(sampling_params=...)`` verifies against);
* ``temperature only``: softmax(draft logits / T), p_T (what vLLM's drafters do: they apply the
  temperature and nothing else, and vLLM verifies against that p_T).

Rejection sampling is lossless for q' either way (the verifier is told the p the drafts came
from); the acceptance differs: a lossless sampler accepts at rate alpha = sum_x min(p(x), q'(x))
per position, and p_T puts mass on tokens that top-k / top-p / min-p removed from q'. Each
context c is one (target, draft) logits pair: z ~ scale * N(0, 1) and z + sigma * N(0, 1) over V
tokens (scale 3 is the default suite's softmax family, peaked: top_p=0.95 keeps tens of tokens
of 1000; scale 1.5 is flatter: it keeps hundreds), repeated over ``rows`` rows at every one of the
k positions; measured numbers, theory and z-scores are
those of :func:`spec_samplers.bench.quality.measure` (|z| < 4.5 for an exact sampler).

JSON (``--json PATH``, ``"schema": "spec-samplers-params-bench/1"``)::

    {"schema": ..., "machine": {as spec-samplers-bench/1},
     "config": {"k", "rows", "seed", "quick", "vocab_size", "contexts", "scales", "sigmas", "device",
                "threads"},
     "results": [{"params": {"temperature", "top_p", "top_k", "min_p"}, "params_name": str,
                  "scale": float, "sigma": float, "draft": "alike" | "temperature only",
                  "kept_tokens": float (mean support of q'), "draft_kept_tokens": float,
                  ... the fields of quality.measure: per_position, acceptance(_stderr),
                  emitted(_stderr), tv_draft_target, tv_output, theory, z}]}
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

import torch

from spec_samplers.bench import quality, report
from spec_samplers.bench.arguments import resolve_device
from spec_samplers.rejection import RejectionSampler
from spec_samplers.sampling_params import SamplingParams, process_logits

SCHEMA = "spec-samplers-params-bench/1"

#: the settings of issue 12: the V0 trace's request, then top-k and min-p alone, then all together
PARAM_SETTINGS: tuple[tuple[str, SamplingParams], ...] = (
    ("trace: T=0.8 top_p=0.95", SamplingParams(temperature=0.8, top_p=0.95)),
    ("top_k=50", SamplingParams(top_k=50)),
    ("min_p=0.05", SamplingParams(min_p=0.05)),
    ("T=0.8 top_k=50 top_p=0.95 min_p=0.05", SamplingParams(temperature=0.8, top_k=50, top_p=0.95, min_p=0.05)),
)
DRAFTS = ("alike", "temperature only")


def logits_pairs(
    contexts: int, vocab_size: int, scale: float, sigma: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(target logits, draft logits), each [C, V] fp32 on the CPU: z ~ scale N(0, 1), z + sigma N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(contexts, vocab_size, generator=gen) * scale
    return z, z + sigma * torch.randn(contexts, vocab_size, generator=gen)


def draft_distributions(draft_logits: torch.Tensor, params: SamplingParams) -> dict[str, torch.Tensor]:
    """The draft distribution [C, V] under each drafting policy of :data:`DRAFTS`."""
    return {
        "alike": process_logits(draft_logits, params),
        "temperature only": process_logits(draft_logits, SamplingParams(temperature=params.temperature)),
    }


def run(
    k: int = 4,
    rows: int = 1024,
    seed: int = 0,
    vocab_size: int = 1000,
    contexts: int = 4,
    scales: tuple[float, ...] = (3.0, 1.5),
    sigmas: tuple[float, ...] = (0.5, 1.0),
    device: torch.device | str = "cpu",
    settings: tuple[tuple[str, SamplingParams], ...] = PARAM_SETTINGS,
) -> list[dict[str, object]]:
    """One result per (parameter setting, logit scale, sigma, drafting policy); see the module docstring."""
    sampler = RejectionSampler()
    results: list[dict[str, object]] = []
    pairs = [(scale, sigma) for scale in scales for sigma in sigmas]
    for name, params in settings:
        for pair_index, (scale, sigma) in enumerate(pairs):
            target_logits, draft_logits = logits_pairs(contexts, vocab_size, scale, sigma, seed + pair_index)
            q = process_logits(target_logits, params)  # [C, V]
            for draft_name, p in draft_distributions(draft_logits, params).items():
                measured = quality.measure(sampler, q, p, k, rows, seed=seed, device=device, lossless=True)
                results.append(
                    {
                        "params": {f: v for f, v in asdict(params).items() if f != "seed"},
                        "params_name": name,
                        "scale": scale,
                        "sigma": sigma,
                        "draft": draft_name,
                        "kept_tokens": float((q > 0).sum(dim=1).double().mean()),
                        "draft_kept_tokens": float((p > 0).sum(dim=1).double().mean()),
                        **measured,
                    }
                )
    return results


def render(document: dict[str, object]) -> str:
    """The terminal table: one line per (setting, sigma, drafting policy)."""
    config = document["config"]
    assert isinstance(config, dict)
    lines = [
        (
            f"Acceptance under SamplingParams (RejectionSampler, k={config['k']}, V={config['vocab_size']}, "
            f"{config['contexts']} contexts x {config['rows']} rows, device {config['device']})"
        ),
        (
            "draft 'alike': sampled from the draft processed with the same parameters; 'temperature only': "
            "softmax(draft / T), as vLLM's drafters"
        ),
        (
            "alpha = sum min(p, q') (theory per position); acceptance = accepted / proposed drafts, "
            "theory for a lossless "
            "sampler; z = (measured - theory) / stderr; |q|, |p|: mean number of tokens with mass"
        ),
        "",
        (
            f"{'parameters':<38} {'scale':>5} {'sigma':>5} {'draft':<16} {'|q|':>6} {'|p|':>6} {'alpha':>6} "
            f"{'accept':>7} {'theory':>7} {'z':>6} {'emitted':>7} {'theory':>7} {'TV excess':>9}"
        ),
    ]
    results = document["results"]
    assert isinstance(results, list)
    for r in results:
        theory = r["theory"]
        z = r["z"]
        lines.append(
            f"{r['params_name']:<38} {r['scale']:>5g} {r['sigma']:>5g} {r['draft']:<16} {r['kept_tokens']:>6.1f} "
            f"{r['draft_kept_tokens']:>6.1f} {theory['alpha']:>6.3f} {r['acceptance']:>7.4f} "
            f"{theory['acceptance']:>7.4f} {z['acceptance']:>6.2f} {r['emitted']:>7.3f} {theory['emitted']:>7.3f} "
            f"{r['tv_output']['excess']:>9.4f}"
        )
    lines += ["", "Gain of drafting alike (theory acceptance, alike - temperature only):"]
    by_key = {(r["params_name"], r["scale"], r["sigma"], r["draft"]): r for r in results}
    for (name, scale, sigma, draft), r in by_key.items():
        if draft != "alike":
            continue
        other = by_key[(name, scale, sigma, "temperature only")]
        gain = r["theory"]["acceptance"] - other["theory"]["acceptance"]
        lines.append(
            f"  {name:<38} scale={scale:<4g} sigma={sigma:<4g} {gain:+.4f}  "
            f"({other['theory']['acceptance']:.4f} -> {r['theory']['acceptance']:.4f})"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """``spec-samplers bench params`` (its arguments: spec_samplers.bench.cli.add_params_arguments)."""
    device = resolve_device(args.device)
    quick = bool(args.quick)
    vocab = args.vocab or (256 if quick else 1000)
    rows = args.rows or (128 if quick else 1024)
    contexts = 2 if quick else 4
    scales = (3.0,) if quick else (3.0, 1.5)
    sigmas = (1.0,) if quick else (0.5, 1.0)
    if rows < 2:
        raise ValueError(f"--rows: expected an integer >= 2, got {rows}")
    # the run's arguments, recorded as the JSON's config (in this order) with what else ran
    config: dict[str, Any] = {"k": args.k, "rows": rows, "seed": args.seed, "quick": quick, "vocab_size": vocab}
    config.update(contexts=contexts, scales=scales, sigmas=sigmas)
    results = run(device=device, **{name: value for name, value in config.items() if name != "quick"})
    document: dict[str, object] = {
        "schema": SCHEMA,
        "machine": report.machine_info(device),
        "config": {
            **config,
            "scales": list(scales),
            "sigmas": list(sigmas),
            "device": str(device),
            "threads": torch.get_num_threads(),
        },
        "results": results,
    }
    print(render(document))
    if args.json:
        report.write_json(args.json, document)
        print(f"\nwrote {args.json}")
    return 0
