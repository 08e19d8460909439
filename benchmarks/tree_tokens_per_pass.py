"""Tokens per target pass, chain vs tree at equal node budgets, on the tiny model pair of the
tests (tests/tiny_models.py: a 2-layer Llama, V = 25, and a noisy copy as the draft), measured
with SpeculativeDecoder, plus the synthetic table of spec_samplers.bench.tree_bench.

    python benchmarks/tree_tokens_per_pass.py [--noise 0.1 --noise 0.5] [--requests 64] [--tokens 32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tiny_models import CHARS, noisy_copy, tiny_llama  # noqa: E402

from spec_samplers import SamplingParams  # noqa: E402
from spec_samplers.decoding import SpeculativeDecoder  # noqa: E402
from spec_samplers.decoding.tree_drafting import NodeBudget  # noqa: E402
from spec_samplers.integrations.transformers import HFLanguageModel  # noqa: E402

#: (label, decoder options) at equal node budgets
CONFIGS = [
    ("chain 3", dict(num_speculative_tokens=3)),
    ("chain 6", dict(num_speculative_tokens=6)),
    ("tree 2,2 (6)", dict(tree=[2, 2])),
    ("tree 2,2 w/o repl. (6)", dict(tree=[2, 2], draft_sampling="without_replacement")),
    ("budget 6,3 top-k (6)", dict(tree=NodeBudget(6, 3), draft_sampling="deterministic")),
    ("chain 10", dict(num_speculative_tokens=10)),
    ("tree 2,2,1 (10)", dict(tree=[2, 2, 1])),
    ("tree 2,2,1 w/o repl. (10)", dict(tree=[2, 2, 1], draft_sampling="without_replacement")),
    ("budget 10,4 sampled (10)", dict(tree=NodeBudget(10, 4, "sampled"), draft_sampling="without_replacement")),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noise", type=float, action="append", help="draft weight noise (default 0.1 and 0.5)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = tiny_llama(0, vocab_size=len(CHARS) + 2, hidden=32)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, len(CHARS) + 2, (args.requests, 6), generator=gen)
    params = SamplingParams(temperature=args.temperature)
    for noise in args.noise or [0.1, 0.5]:
        draft = noisy_copy(target, noise, seed=1)
        print(
            f"tiny pair, draft noise {noise}, T = {args.temperature}, {args.requests} requests x {args.tokens} tokens"
        )
        for label, options in CONFIGS:
            decoder = SpeculativeDecoder(HFLanguageModel(target), HFLanguageModel(draft), **options)
            out = decoder.generate(prompts, args.tokens, params, seed=1)
            rounds = sum(s.num_rounds for s in out.stats)
            generated = sum(s.num_generated for s in out.stats)
            print(f"  {label:<28} {generated / rounds:.3f} tokens per verification pass")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
