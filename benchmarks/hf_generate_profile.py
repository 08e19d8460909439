"""Measured: where one round of ``generate(custom_generate=speculative_generate)`` spends its time.

The pair, prompts and sampling settings of ``hf_generate_bench.py`` (its defaults: the
2026-11-28 settings). Each part of the decoding loop is timed by a wrapper around the call that
does it (model forwards by model and query length, draws, logits processing, verification, cache
crops, the token buffer with its observer); what no wrapper covers is the loop's own Python
(counters, read-backs, tails). Plain sampling (transformers' own generate) is timed in the same
process, alternating with ours, for its cost per token.

    python benchmarks/hf_generate_profile.py --batch 1 8
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_generate_bench import build_pair, prompts  # noqa: E402


def timed_parts(target: Any) -> tuple[dict[str, float], collections.Counter]:
    """Wrap the loop's parts (class attributes, for this process); returns (seconds, calls) by part."""
    from spec_samplers.decoding import kv_cache, output, speculative, strategy
    from spec_samplers.integrations import transformers as hf

    seconds: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()

    def wrap(owner: Any, name: str, label: Any) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = original(*args, **kwargs)
            key = label(args) if callable(label) else label
            seconds[key] += time.perf_counter() - start
            calls[key] += 1
            return result

        setattr(owner, name, timed)

    def forward_label(args: tuple) -> str:
        self, query = args[0], args[1]
        who = "target" if self.model is target else "draft"
        return f"{who} forward, {query.shape[1] if query.shape[1] <= 8 else 'prefill'} tokens"

    for method in ("forward", "forward_last"):
        if hasattr(hf.HFLanguageModel, method):
            wrap(hf.HFLanguageModel, method, forward_label)
    wrap(strategy.SampleStrategy, "draw", "draws (seeded race over V)")
    wrap(strategy.SampleStrategy, "probs", "logits processing (probs)")
    wrap(speculative.SpeculativeDecoder, "_verify", "verification sampler")
    wrap(kv_cache.SlotKVCache, "crop", "cache crops")
    wrap(kv_cache.SlotKVCache, "batch_select_indices", "cache row selection")
    wrap(output.TokenBuffer, "append", "token buffer and observer")
    wrap(speculative.SpeculativeDecoder, "generate", "loop total")
    return seconds, calls


def profile_batch(target: Any, draft: Any, batch: int, repeats: int, parts: tuple) -> None:
    """Time plain sampling and ours, alternating, ``repeats`` times; print ours by part."""
    from spec_samplers.integrations.transformers import speculative_generate

    seconds, calls = parts
    ids, mask = prompts(batch, 32000, seed=batch)
    sample: dict[str, Any] = dict(do_sample=True, temperature=0.8, top_k=0, top_p=1.0, max_new_tokens=64)
    stats: list = []

    def ours() -> None:
        stats.clear()
        target.generate(
            input_ids=ids, attention_mask=mask, **sample, assistant_model=draft, num_assistant_tokens=4,
            custom_generate=speculative_generate, sampler="rejection_sampler", stats=stats,
        )  # fmt: skip

    def plain() -> None:
        target.generate(input_ids=ids, attention_mask=mask, **sample)

    with torch.no_grad():
        torch.manual_seed(0)
        ours(), plain()  # warm-up
        seconds.clear(), calls.clear()
        plain_s = []
        for rep in range(repeats):
            torch.manual_seed(rep)
            start = time.perf_counter()
            plain()
            plain_s.append(time.perf_counter() - start)
            torch.manual_seed(rep)
            ours()
    rounds = max(s.num_rounds for s in stats[0].stats)
    drafted = sum(s.num_drafted for s in stats[0].stats) / sum(s.num_rounds for s in stats[0].stats)
    total = seconds.pop("loop total") / repeats
    calls.pop("loop total")
    tokens = sample["max_new_tokens"]
    print(
        f"batch {batch}: load average {os.getloadavg()[0]:.1f}; plain sampling "
        f"{1e3 * sum(plain_s) / repeats / tokens:.0f} ms per token step; ours {total:.2f} s per call, {rounds} rounds "
        f"(last call), {1e3 * total / rounds:.0f} ms per round, {1e3 * total / tokens:.0f} ms per token step; "
        f"{drafted:.2f} drafts per request and round (the draft-length policy's)"
    )
    print("| part | s per call | share | calls per call | ms per call | ms per round |")
    print("|---|---|---|---|---|---|")
    named = 0.0
    for key in sorted(seconds, key=lambda k: -seconds[k]):
        t = seconds[key] / repeats
        named += t
        print(
            f"| {key} | {t:.2f} | {100 * t / total:.1f}% | {calls[key] / repeats:.0f} | "
            f"{1e3 * seconds[key] / calls[key]:.1f} | {1e3 * t / rounds:.1f} |"
        )
    rest = total - named
    print(f"| the loop's own Python (counters, read-backs) | {rest:.2f} | {100 * rest / total:.1f}% | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = build_pair(12, 512, 32000, 0.05, 0.2)
    parts = timed_parts(target)
    for batch in args.batch:
        profile_batch(target, draft, batch, args.repeats, parts)


if __name__ == "__main__":
    main()
