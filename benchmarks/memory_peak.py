"""Peak extra host memory of each PyTorch-path entry at an engine-sized batch (issue 33).

Each entry runs once in its own child process: the child builds the inputs, records its RSS,
resets the kernel's peak-RSS mark (``echo 5 > /proc/self/clear_refs``), runs the entry and
reports VmHWM - RSS before, i.e. the memory the call added at its peak. Linux only.

    python benchmarks/memory_peak.py --batch 4096 --vocab 4096 --k 1 [--source DIR] [--json PATH]

``--source DIR`` runs another checkout's code (e.g. the commit before the chunking, exported with
``git archive``) for the before/after comparison; both sides run the same script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from types import SimpleNamespace

ENTRIES = (
    "rejection.forward",
    "rejection.forward_ragged",
    "rejection.forward_from_logits",
    "rejection.forward_ragged_from_logits",
    "rejection.forward_from_logits+sampling_params",
    "typical.forward",
    "typical.forward_ragged_from_logits",
    "block.forward",
    "block.forward_ragged_from_logits",
    "vllm_v1_seam.verify",
    "tree.forward_tree",
    "sampling.top_k_top_p_sampling_from_logits",
)


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(entry: str, B: int, V: int, K: int, chunk_elements: int | None) -> dict[str, float]:
    import torch

    import spec_samplers as ss

    if chunk_elements is not None:
        from spec_samplers import chunking

        chunking.CHUNK_ELEMENTS = chunk_elements

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    T = B * K
    logits = torch.randn(B * (K + 1), V, generator=gen)  # the target logits, all rows
    draft_ids = torch.randint(0, V, (B, K), generator=gen)
    bonus = torch.randint(0, V, (B, 1), generator=gen)
    seeds = torch.arange(B, dtype=torch.int64)
    temperature = torch.ones(B)
    cu = torch.arange(1, B + 1, dtype=torch.int64) * K
    name, _, method = entry.partition(".")
    sampler = {
        "rejection": lambda: ss.RejectionSampler(backend="torch"),
        "typical": lambda: ss.TypicalAcceptanceSampler(backend="torch"),
        "block": lambda: ss.BlockVerificationSampler(backend="torch"),
    }.get(name, lambda: ss.RejectionSampler(backend="torch"))()
    rand = {} if name == "typical" else {"seeds": seeds}
    padded = logits.view(B, K + 1, V)
    ragged = logits[:T]  # [T, V]: the draft rows of a ragged batch (no bonus rows)
    inputs: tuple = ()
    if method == "forward":
        inputs = (padded.softmax(-1), torch.softmax(padded[:, :K] + 1.0, -1))
    elif method == "forward_ragged":
        inputs = (ragged.softmax(-1), torch.softmax(ragged + 1.0, -1))
    elif method.startswith(("forward_from_logits", "forward_ragged_from_logits")) or name == "tree":
        inputs = (padded[:, :K] + 1.0,) if "ragged" not in method else (ragged + 1.0,)
    elif name == "vllm_v1_seam":
        inputs = ()
    rss = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    if method == "forward":
        sampler(padded.softmax(-1) if False else inputs[0], bonus, inputs[1], draft_ids, **rand)
    elif method == "forward_ragged":
        sampler.forward_ragged(inputs[0], bonus, inputs[1], draft_ids.view(-1), cu, K, **rand)
    elif method == "forward_from_logits":
        sampler.forward_from_logits(padded, bonus, inputs[0], draft_ids, temperature, **rand)
    elif method == "forward_from_logits+sampling_params":
        params = ss.SamplingParams(temperature=0.8, top_k=50, top_p=0.95)
        sampler.forward_from_logits(padded, bonus, inputs[0], draft_ids, sampling_params=params, **rand)
    elif method == "forward_ragged_from_logits":
        sampler.forward_ragged_from_logits(ragged, bonus, inputs[0], draft_ids.view(-1), cu, K, temperature, **rand)
    elif name == "vllm_v1_seam":
        from spec_samplers.integrations.vllm import v1_runner
        from spec_samplers.integrations.vllm.ragged import RaggedVerifier

        metadata = SimpleNamespace(all_greedy=False, all_random=True, generators={}, temperature=temperature)
        v1_runner.verify(RaggedVerifier(sampler), draft_ids.view(-1), [K] * B, K, cu, None, ragged, bonus, metadata)
    elif name == "tree":
        parents = torch.arange(K)  # a chain of K nodes: node j's parent is j - 1
        sampler.forward_tree_from_logits(
            padded, torch.cat([inputs[0], padded[:, K:]], 1), draft_ids, parents, temperature, **rand
        )
    elif name == "sampling":
        from spec_samplers.sampling import top_k_top_p_sampling_from_logits

        top_k_top_p_sampling_from_logits(logits, 50, 0.95, seed=1, backend="torch")
    peak = _status("VmHWM")
    return {"extra_bytes": peak - rss, "inputs_bytes": logits.numel() * 4}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--k", type=int, default=1)
    p.add_argument("--entry", action="append", choices=ENTRIES)
    p.add_argument("--source", help="checkout whose spec_samplers to measure (default: this one)")
    p.add_argument("--chunk-elements", type=int, help="spec_samplers.chunking.CHUNK_ELEMENTS (default: the package's)")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.batch, args.vocab, args.k, args.chunk_elements)))
        return 0
    root = os.path.abspath(args.source or os.path.join(os.path.dirname(__file__), ".."))
    env = {**os.environ, "PYTHONPATH": root, "TRITON_INTERPRET": "0"}
    rows = []
    print(f"B = {args.batch}, V = {args.vocab}, K = {args.k}, code from {root}")
    for entry in args.entry or ENTRIES:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", entry]
        cmd += ["--batch", str(args.batch), "--vocab", str(args.vocab), "--k", str(args.k)]
        cmd += [] if args.chunk_elements is None else ["--chunk-elements", str(args.chunk_elements)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            row = {"entry": entry, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
        else:
            row = {"entry": entry, **json.loads(done.stdout.strip().splitlines()[-1])}
        rows.append(row)
        if "error" in row:
            print(f"  {entry:<48} error: {row['error']}")
        else:
            ratio = row["extra_bytes"] / row["inputs_bytes"]
            print(f"  {entry:<48} extra {row['extra_bytes'] / 1e6:9.1f} MB  = {ratio:5.2f} x the target logits")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"batch": args.batch, "vocab": args.vocab, "k": args.k, "source": root, "rows": rows}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
