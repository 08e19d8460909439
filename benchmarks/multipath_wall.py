"""Measured: wall time per step and tokens per step of block verification (one path) and GBV
(``multipath_block_verification``, K = 2, 3, 4 paths) in our decoding loop
(:class:`spec_samplers.decoding.SpeculativeDecoder`) and in ``generate(custom_generate=
speculative_generate)``, at L = 4 and 8 drafted tokens per path.

The model pair is the benchmark pair of ``benchmarks/hf_generate_bench.py`` (built from configs,
no download): a random Llama target (``--layers`` layers, hidden ``--hidden``, vocabulary
``--vocab``) and, as its draft, its own first layer, the later layers scaled by ``--later-scale``
so that the draft agrees in part. Every method runs the same prompts, interleaved round by round
(``--repeats`` rounds after one warm-up round), in one process, on ``--threads`` CPU threads.
Sampling at ``--temperature``, no top-k / top-p; EOS disabled, so every row generates
``--max-new-tokens``.

Per (entry, L, method): seconds per step (median over rounds of elapsed / verification rounds),
tokens per step ((accepted + rounds) / rounds, over all rows and rounds), tokens per second, and
(decoding loop only) the verifier's share of a step (time inside the sampler's call). The machine
load is printed and stored: on a shared machine only the ratios within one run compare.

    python benchmarks/multipath_wall.py --json benchmarks/results/2026-11-29-multipath-wall.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

import torch
from hf_generate_bench import build_pair, prompts, write_json

from spec_samplers import SamplingParams, get_sampler

METHODS = [("block verification (1 path)", "block_verification", None)] + [
    (f"GBV K={k}", "multipath_block_verification", k) for k in (2, 3, 4)
]


class TimedSampler:
    """Adds the seconds spent in a sampler instance's entries (forward, forward_tree) to ``self.seconds``."""

    def __init__(self, sampler: Any) -> None:
        self.seconds = 0.0
        for name in ("forward", "forward_tree"):
            inner = getattr(sampler, name)

            def timed(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return _inner(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - start

            setattr(sampler, name, timed)
        self.sampler = sampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--init", type=float, default=0.05)
    parser.add_argument("--later-scale", type=float, default=0.2)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import transformers

    from spec_samplers.decoding import SpeculativeDecoder
    from spec_samplers.integrations.transformers import HFLanguageModel, speculative_generate

    torch.set_num_threads(args.threads)
    target, draft = build_pair(args.layers, args.hidden, args.vocab, args.init, args.later_scale)
    ids, mask = prompts(args.batch, args.vocab, seed=args.batch)
    prompt_rows = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    params = SamplingParams(temperature=args.temperature)
    sample = dict(do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0, max_new_tokens=args.max_new_tokens)
    new_style = hasattr(transformers.GenerationMixin, "_extract_generation_mode_kwargs")
    configs = [(entry, L, m) for entry in ("loop", "generate") for L in args.lengths for m in METHODS]
    samples: dict[tuple, list[dict[str, float]]] = {c: [] for c in configs}
    load_before = os.getloadavg()
    started = time.time()
    for rep in range(args.repeats + 1):  # round 0 warms up
        for entry, L, (label, name, k) in configs:
            torch.manual_seed(rep)
            stats: list = []
            timed = TimedSampler(get_sampler(name))
            start = time.perf_counter()
            with torch.no_grad():
                if entry == "loop":
                    decoder = SpeculativeDecoder(
                        HFLanguageModel(target),
                        HFLanguageModel(draft),
                        timed.sampler,
                        num_speculative_tokens=L,
                        num_paths=k,
                    )
                    out = decoder.generate(
                        prompt_rows, max_new_tokens=args.max_new_tokens, sampling_params=params, seed=rep
                    )
                    stats.append(out)
                else:
                    options: dict[str, Any] = dict(sampler=name, stats=stats)
                    if k is not None:
                        options["num_paths"] = k
                    extra = (
                        dict(custom_generate=speculative_generate, **options)
                        if new_style
                        else dict(custom_generate=speculative_generate.with_options(**options))
                    )
                    target.generate(
                        input_ids=ids,
                        attention_mask=mask,
                        assistant_model=draft,
                        num_assistant_tokens=L,
                        **sample,
                        **extra,
                    )
            elapsed = time.perf_counter() - start
            (result,) = stats
            rounds = sum(s.num_rounds for s in result.stats)
            accepted = sum(s.num_accepted for s in result.stats)
            steps = max(s.num_rounds for s in result.stats)  # the batch's verification rounds
            if rep:
                samples[(entry, L, (label, name, k))].append(
                    dict(
                        seconds=elapsed,
                        seconds_per_step=elapsed / steps,
                        tokens_per_step=(accepted + rounds) / rounds,
                        verifier_per_step=timed.seconds / steps if entry == "loop" else float("nan"),
                        tokens_per_s=args.batch * args.max_new_tokens / elapsed,
                    )
                )
    load_after = os.getloadavg()
    rows = []
    for (entry, L, (label, _, k)), runs in samples.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        rows.append(
            dict(entry=entry, L=L, method=label, num_paths=k, runs=runs, **{f"median_{k_}": v for k_, v in med.items()})
        )
    base = {(r["entry"], r["L"]): r for r in rows if r["num_paths"] is None}
    print(
        f"measured: transformers {transformers.__version__}, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {args.threads} thread(s), batch "
        f"{args.batch}, {args.max_new_tokens} new tokens, T = {args.temperature}; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after; {time.time() - started:.0f} s"
    )
    print("| entry | L | method | ms per step | vs block | tokens per step | ms per token | verifier ms per step |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        b = base[(r["entry"], r["L"])]
        ver = r["median_verifier_per_step"]
        print(
            f"| {r['entry']} | {r['L']} | {r['method']} | {1e3 * r['median_seconds_per_step']:.1f} | "
            f"{r['median_seconds_per_step'] / b['median_seconds_per_step']:.2f}x | {r['median_tokens_per_step']:.2f} | "
            f"{1e3 / r['median_tokens_per_s'] * args.batch:.1f} | {'-' if ver != ver else f'{1e3 * ver:.1f}'} |"
        )
    if args.json:
        write_json(
            args.json, args, (load_before, load_after), rows, how="measured, interleaved round by round in one process"
        )


if __name__ == "__main__":
    main()
