"""Measured: ``generate(custom_generate=speculative_generate)`` against transformers' own generate.

A small model pair built from configs (no download): a random Llama target (``--layers`` layers,
hidden ``--hidden``, vocabulary 32000) and, as its draft, its own first layer (layer skipping: the
draft shares the target's embedding, first layer, final norm and head). The target's later layers
have their output projections scaled by ``--later-scale``, so the draft agrees with it in part, as
a trained draft does (random weights alone give a draft that rarely agrees).
Every method runs the same prompts, interleaved round by round (``--repeats`` rounds, after one
warm-up round), on ``--threads`` CPU threads:

* batch 1: transformers' plain sampling, transformers' assisted generation
  (``assistant_model=draft``), and ours (``custom_generate=speculative_generate``);
* batch 8 (left-padded prompts of different lengths): transformers' plain sampling and ours
  (transformers' assisted generation serves one sequence at a time).

Reported per method: generated tokens per second (median over rounds), target and draft forward
passes (counted by forward hooks) and accepted drafts per verification step: ours from its statistics
(accepted drafts / rounds, over all rows); transformers' from the passes (each of its steps emits
the accepted drafts plus one token: (tokens - passes) / passes). EOS is disabled so every row
generates ``--max-new-tokens``.

    python benchmarks/hf_generate_bench.py --json benchmarks/results/hf_generate_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch


def build_pair(layers: int, hidden: int, vocab: int, init: float, later_scale: float, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        initializer_range=init,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # layers after the first write less into the residual stream: a draft that agrees
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(later_scale)
            layer.mlp.down_proj.weight.mul_(later_scale)
    draft_config = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 1})
    draft = LlamaForCausalLM(draft_config).eval()
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.") or ".layers.0." in k}
    draft.load_state_dict(state)
    for model in (target, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return target, draft


class PassCounter:
    """Counts a model's forward passes (a forward pre-hook on its decoder, ``model.model``, which
    every pass runs: the causal LM's own forward and the decoding loop's, which takes the head
    product itself)."""

    def __init__(self, model) -> None:
        self.calls = 0
        model.model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        self.calls += 1


def prompts(batch: int, vocab: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    lengths = [24] if batch == 1 else [16 + (3 * b) % 17 for b in range(batch)]
    P = max(lengths)
    ids = torch.randint(1, vocab, (batch, P), generator=gen)
    mask = torch.ones_like(ids)
    for b, n in enumerate(lengths):
        ids[b, : P - n] = 0
        mask[b, : P - n] = 0
    return ids, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--init", type=float, default=0.05, help="initializer range (peakier logits when larger)")
    parser.add_argument(
        "--later-scale", type=float, default=0.2, help="scale of the target's layers after the first (draft agreement)"
    )
    parser.add_argument("--k", type=int, default=4, help="drafts per step (num_assistant_tokens)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sampler", default="rejection_sampler")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import transformers

    from spec_samplers.integrations.transformers import speculative_generate

    torch.set_num_threads(args.threads)
    target, draft = build_pair(args.layers, args.hidden, args.vocab, args.init, args.later_scale)
    passes, draft_passes = PassCounter(target), PassCounter(draft)
    sample = dict(do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0, max_new_tokens=args.max_new_tokens)
    assisted = dict(assistant_model=draft, num_assistant_tokens=args.k)
    if hasattr(transformers.GenerationMixin, "_extract_generation_mode_kwargs"):
        ours_options = dict(custom_generate=speculative_generate, sampler=args.sampler)
    else:  # transformers 4.x: bind the callable's own parameters
        ours_options = dict(custom_generate=speculative_generate.with_options(sampler=args.sampler))
    ours_stats: list = []
    ours_options["stats" if "sampler" in ours_options else "custom_generate"] = (
        ours_stats
        if "sampler" in ours_options
        else speculative_generate.with_options(sampler=args.sampler, stats=ours_stats)
    )
    methods = {
        ("plain generate", 1): {},
        ("transformers assisted", 1): dict(**assisted, num_assistant_tokens_schedule="constant"),
        ("ours", 1): dict(**assisted, **ours_options),
        ("plain generate", 8): {},
        ("ours", 8): dict(**assisted, **ours_options),
    }
    inputs = {b: prompts(b, args.vocab, seed=b) for b in (1, 8)}
    times: dict = {key: [] for key in methods}
    counts: dict = {}
    load_before = os.getloadavg()
    for rep in range(args.repeats + 1):  # round 0 warms up
        for (name, batch), extra in methods.items():
            ids, mask = inputs[batch]
            torch.manual_seed(rep)
            passes.calls = draft_passes.calls = 0
            ours_stats.clear()
            start = time.perf_counter()
            with torch.no_grad():
                out = target.generate(input_ids=ids, attention_mask=mask, **sample, **extra)
            elapsed = time.perf_counter() - start
            new = int(out.shape[1] - ids.shape[1])
            if rep:
                times[(name, batch)].append(elapsed)
                accepted = None
                if ours_stats:
                    (result,) = ours_stats
                    accepted = sum(st.num_accepted for st in result.stats) / sum(st.num_rounds for st in result.stats)
                elif "assistant_model" in extra:
                    accepted = (new - passes.calls) / passes.calls
                counts[(name, batch)] = (new, passes.calls, accepted, draft_passes.calls)
    load_after = os.getloadavg()
    rows = []
    for (name, batch), elapsed in times.items():
        new, calls, accepted, draft_calls = counts[(name, batch)]
        tokens = new * batch
        row = {
            "method": name,
            "batch": batch,
            "tokens_per_s": tokens / statistics.median(elapsed),
            "seconds": elapsed,
            "new_tokens_per_row": new,
            "target_passes": calls,
            "draft_passes": draft_calls,
            "accepted_per_step": accepted,
        }
        rows.append(row)
    base = {r["batch"]: r["tokens_per_s"] for r in rows if r["method"] == "plain generate"}
    print(
        f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, {args.threads} thread(s); "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    print(
        "| batch | method | tokens/s (median) | s per round | vs plain | target passes | draft passes "
        "| accepted drafts/step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        acc = "-" if r["accepted_per_step"] is None else f"{r['accepted_per_step']:.2f}"
        print(
            f"| {r['batch']} | {r['method']} | {r['tokens_per_s']:.1f} | "
            f"{min(r['seconds']):.2f}-{max(r['seconds']):.2f} | {r['tokens_per_s'] / base[r['batch']]:.2f}x | "
            f"{r['target_passes']} | {r['draft_passes']} | {acc} |"
        )
    if args.json:
        write_json(args.json, args, (load_before, load_after), rows)


def write_json(path: str, args: argparse.Namespace, loads: tuple, rows: list, **meta: object) -> None:
    """The rows with how they were taken: arguments, versions, machine, load before and after."""
    import transformers

    meta = {
        **meta,
        "args": vars(args),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_before_after": list(loads),
    }
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
