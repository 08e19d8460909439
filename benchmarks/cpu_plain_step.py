"""V1's plain step on CPU against vLLM's own CPU sampler, one thread, interleaved in one process.

``fast_path.verify_plain_step`` (the plugin's V1 plain step: each request's k_r draft rows and its
bonus row verified from the model's raw logits, the bonus drawn in our kernels) is timed in turn
with vLLM's own work for the same step, by the calling thread's CPU time (``time.thread_time``:
a loaded machine does not stretch it; torch and numba run on one thread here):

* n-gram steps without drafts (k_r = 0): vLLM's CPU sampler method, softmax(logits / T), then
  argmax of probs / E with E ~ Exp(1) from ``exponential_``;
* steps with k drafts each (point-mass drafts, as n-gram's): ours alone, for before/after
  (vLLM's ``RejectionSampler.forward`` does not run outside its engine here: its Triton kernels
  have no CPU backend).

Run it with a checkout first on PYTHONPATH; A/B: alternate processes of two checkouts.

    PYTHONPATH=<checkout> python benchmarks/cpu_plain_step.py --out F.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

CLOCK = time.thread_time


def interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median thread CPU seconds of each function, called in turn (two warm calls excluded)."""
    for fn in fns.values():
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = CLOCK()
            fn()
            times[name].append(CLOCK() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def step_metadata(drafts: list[list[int]]) -> Any:
    """SpecDecodeMetadata as V1's model runner lays it out: request r's k_r draft rows, then its
    bonus row."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    sampled = np.cumsum([len(d) + 1 for d in drafts])
    target, bonus = [], []
    for r, d in enumerate(drafts):
        start = int(sampled[r]) - len(d) - 1
        target += range(start, start + len(d))
        bonus.append(int(sampled[r]) - 1)
    i32 = torch.int32
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor([x for d in drafts for x in d], dtype=i32),
        num_draft_tokens=[len(d) for d in drafts],
        cu_num_draft_tokens=torch.tensor(np.cumsum([len(d) for d in drafts]), dtype=i32),
        cu_num_sampled_tokens=torch.tensor(sampled, dtype=i32),
        target_logits_indices=torch.tensor(target, dtype=i32),
        bonus_logits_indices=torch.tensor(bonus, dtype=i32),
        logits_indices=torch.arange(int(sampled[-1]), dtype=i32),
    )


def sampling_metadata(temperature: list[float]) -> Any:
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    B = len(temperature)
    all_greedy = all(t == 0 for t in temperature)
    return SamplingMetadata(
        temperature=None if all_greedy else torch.tensor(temperature, dtype=torch.float32),
        all_greedy=all_greedy,
        all_random=all(t != 0 for t in temperature),
        top_p=None,
        top_k=None,
        generators={},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(B),
        presence_penalties=torch.zeros(B),
        repetition_penalties=torch.ones(B),
        output_token_ids=[[] for _ in range(B)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def vllm_cpu_draw(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """vLLM's CPU sampling method: softmax(logits / T), then argmax of probs / E, E ~ Exp(1)."""
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def write_rows(rows: list[dict[str, Any]], out: str | None) -> None:
    """The run's rows with where they were measured, as JSON at ``out`` (None: not written)."""
    import spec_samplers

    doc = dict(
        spec_samplers=spec_samplers.__file__,
        machine=platform.processor() or platform.machine(),
        load=os.getloadavg(),
        clock="thread_time",
        rows=rows,
    )
    if out:
        with open(out, "w") as fh:
            json.dump(doc, fh, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--samplers", nargs="+", default=["rejection_sampler", "block_verification"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import spec_samplers
    from spec_samplers.integrations.vllm import fast_path
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier
    from spec_samplers.registry import get_sampler

    print(f"spec_samplers: {spec_samplers.__file__}; load {os.getloadavg()}", flush=True)
    rows = []
    V = args.vocab
    for B in args.batches:
        for k in (0, args.k):
            g = torch.Generator().manual_seed(B * 10 + k)
            drafts = [torch.randint(0, V, (k,), generator=g).tolist() for _ in range(B)]
            md = step_metadata(drafts)
            logits = torch.randn(B * (k + 1), V, generator=g) * 3
            temps = [0.8] * B
            sm = sampling_metadata(temps)
            fns: dict[str, Callable[[], object]] = {}
            for name in args.samplers:
                ver = RaggedVerifier(get_sampler(name))
                fns[name] = functools.partial(fast_path.verify_plain_step, ver, md, None, logits, sm)
            if k == 0:
                fns["vllm_method"] = functools.partial(vllm_cpu_draw, logits, sm.temperature)
            med = interleaved(fns, args.rounds)
            base = med.get("vllm_method", float("nan"))
            row = dict(B=B, k=k, V=V, **{f"{n}_us": t * 1e6 for n, t in med.items()})
            rows.append(row)
            cells = " | ".join(f"{n} {t * 1e6:9.1f} us ({t / base:5.2f}x)" for n, t in med.items())
            print(f"B={B:3d} k={k}: {cells}", flush=True)
    write_rows(rows, args.out)


if __name__ == "__main__":
    main()
