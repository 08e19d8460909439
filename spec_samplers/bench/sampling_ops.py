"""Benchmarks of the FlashInfer-compatible sampling operations (``spec-samplers bench sampling``).

Each operation of :mod:`spec_samplers.sampling` is timed against the PyTorch way of doing the same
thing: sort-based top-k / top-p masks (vLLM's ``apply_top_k_top_p``), ``torch.softmax``, and
sampling by an exponential race on the masked probabilities (``probs / Exp(1)``, argmax: vLLM's
``random_sample``). On CUDA, FlashInfer's own operation is timed in the same run when
``flashinfer`` imports (:func:`run` with ``flashinfer=True``; benchmarks/gpu_check.py can call it).

Bytes: the floor an operation cannot go below, read once and written once: B * V * itemsize for
the sampling operations (plus B * 4 of tokens), read + write of B * V for renorm / mask / softmax,
target and draft rows (2 * B * V * itemsize) for chain_speculative_sampling (as in
docs/design.md). ``gbps`` = bytes / time; ``floor_share`` = (bytes / measured copy bandwidth) /
time: 1.0 would be a memory-bound implementation at the machine's copy speed.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

import torch

from spec_samplers.bench.arguments import resolve_device
from spec_samplers.bench.timing import synchronize, time_call

#: (B, V) grids: the default run stays short on a CPU; ``full`` is the issue's grid
DEFAULT_BATCH_SIZES = (1, 16)
DEFAULT_VOCABS = (32000, 128256)
FULL_BATCH_SIZES = (1, 16, 128, 512)
FULL_VOCABS = (32000, 128256, 152064)
#: parameters of the filtered operations
TOP_K = 50
TOP_P = 0.9
MIN_P = 0.05
#: draft tokens of chain_speculative_sampling
CHAIN_N = 4

OPS = (
    "softmax",
    "sampling_from_probs",
    "sampling_from_logits",
    "top_k_sampling_from_probs",
    "top_p_sampling_from_probs",
    "min_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_probs",
    "top_k_renorm_probs",
    "top_k_mask_logits",
    "chain_speculative_sampling",
)


# ---------------------------------------------------------------------------------------------
# The PyTorch (sort-based) way.


def torch_race(probs: torch.Tensor) -> torch.Tensor:
    """vLLM's random_sample: argmax(probs / Exp(1)), a sample of the (unnormalised) probs."""
    return probs.div(torch.empty_like(probs).exponential_()).argmax(dim=-1)


def torch_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """vLLM's apply_top_k_top_p: sort ascending, mask below the k-th largest and outside the
    nucleus, scatter back. Returns masked logits (-inf outside)."""
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth = logits_sort.gather(1, (logits_sort.shape[1] - k.to(torch.int64))[:, None])
        logits_sort = logits_sort.masked_fill(logits_sort < kth, float("-inf"))
    if p is not None:
        probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        mask = probs_sum <= 1 - p[:, None]
        mask[:, -1] = False
        logits_sort = logits_sort.masked_fill(mask, float("-inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def torch_top_k_probs(probs: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Sort-based top-k mask of probabilities (0 outside), not renormalised."""
    kth = probs.sort(dim=-1, descending=True).values.gather(1, (k.to(torch.int64) - 1)[:, None])
    return probs.masked_fill(probs < kth, 0.0)


def torch_top_p_probs(probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Sort-based top-p mask of probabilities (0 outside), not renormalised."""
    sorted_probs, idx = probs.sort(dim=-1, descending=False)
    mask = sorted_probs.cumsum(dim=-1) <= 1 - p[:, None]
    mask[:, -1] = False
    return probs.masked_fill(mask.scatter(1, idx, mask), 0.0)


def _renorm(probs: torch.Tensor) -> torch.Tensor:
    return probs / probs.sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------------------------
# One benchmark point.


def _inputs(B: int, V: int, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    logits = (torch.randn(B, V, generator=g) * 3.0).to(device)  # LLM-like: a few hundred plausible tokens
    probs = torch.softmax(logits, dim=-1)
    n = CHAIN_N
    draft = torch.softmax(torch.randn(B, n, V, generator=g) * 3.0, dim=-1).to(device)
    target = torch.softmax(torch.randn(B, n + 1, V, generator=g) * 3.0, dim=-1).to(device)
    ids = torch.randint(0, V, (B, n), generator=g).to(device)
    return {
        "logits": logits,
        "probs": probs,
        "draft": draft,
        "target": target,
        "ids": ids,
        "k": torch.full((B,), TOP_K, dtype=torch.int32, device=device),
        "p": torch.full((B,), TOP_P, dtype=torch.float32, device=device),
        "seed": torch.arange(B, dtype=torch.int64, device=device),
        "offset": torch.zeros(B, dtype=torch.int64, device=device),
    }


def _calls(op: str, x: dict[str, torch.Tensor], backend: str) -> tuple[Callable[[], object], Callable[[], object], int]:
    """(ours, the PyTorch way, floor bytes) of ``op`` on inputs ``x``."""
    import spec_samplers.sampling as s

    probs, logits, k, p = x["probs"], x["logits"], x["k"], x["p"]
    B, V = probs.shape
    rng: dict[str, Any] = dict(seed=x["seed"], offset=x["offset"], backend=backend)
    read = B * V * probs.element_size()
    sample_bytes = read + B * 4
    table: dict[str, tuple[Callable[[], object], Callable[[], object], int]] = {
        "softmax": (lambda: s.softmax(logits, 1.0, backend=backend), lambda: torch.softmax(logits, dim=-1), 2 * read),
        "sampling_from_probs": (lambda: s.sampling_from_probs(probs, **rng), lambda: torch_race(probs), sample_bytes),
        "sampling_from_logits": (
            lambda: s.sampling_from_logits(logits, **rng),
            lambda: torch_race(torch.softmax(logits, -1)),
            sample_bytes,
        ),
        "top_k_sampling_from_probs": (
            lambda: s.top_k_sampling_from_probs(probs, k, **rng),
            lambda: torch_race(torch_top_k_probs(probs, k)),
            sample_bytes,
        ),
        "top_p_sampling_from_probs": (
            lambda: s.top_p_sampling_from_probs(probs, p, **rng),
            lambda: torch_race(torch_top_p_probs(probs, p)),
            sample_bytes,
        ),
        "min_p_sampling_from_probs": (
            lambda: s.min_p_sampling_from_probs(probs, MIN_P, **rng),
            lambda: torch_race(probs.masked_fill(probs < MIN_P * probs.amax(-1, keepdim=True), 0.0)),
            sample_bytes,
        ),
        "top_k_top_p_sampling_from_logits": (
            lambda: s.top_k_top_p_sampling_from_logits(logits, k, p, **rng),
            lambda: torch_race(torch.softmax(torch_top_k_top_p(logits, k, p), -1)),
            sample_bytes,
        ),
        "top_k_top_p_sampling_from_probs": (
            lambda: s.top_k_top_p_sampling_from_probs(probs, k, p, **rng),
            lambda: torch_race(torch_top_p_probs(_renorm(torch_top_k_probs(probs, k)), p)),
            sample_bytes,
        ),
        "top_p_renorm_probs": (
            lambda: s.top_p_renorm_probs(probs, p, backend=backend),
            lambda: _renorm(torch_top_p_probs(probs, p)),
            2 * read,
        ),
        "top_k_renorm_probs": (
            lambda: s.top_k_renorm_probs(probs, k, backend=backend),
            lambda: _renorm(torch_top_k_probs(probs, k)),
            2 * read,
        ),
        "top_k_mask_logits": (
            lambda: s.top_k_mask_logits(logits, k, backend=backend),
            lambda: torch_top_k_top_p(logits, k, None),
            2 * read,
        ),
        "chain_speculative_sampling": (
            lambda: s.chain_speculative_sampling(x["draft"], x["ids"], x["target"], **rng),
            lambda: None,
            2 * read,
        ),
    }
    return table[op]


def _flashinfer_call(op: str, x: dict[str, torch.Tensor]) -> Callable[[], object] | None:
    """FlashInfer's own operation on the same inputs (CUDA, when flashinfer imports)."""
    try:
        fi = importlib.import_module("flashinfer.sampling")
    except Exception:
        return None
    probs, logits, k, p = x["probs"], x["logits"], x["k"], x["p"]
    calls = {
        "softmax": lambda: fi.softmax(logits, 1.0),
        "sampling_from_probs": lambda: fi.sampling_from_probs(probs),
        "sampling_from_logits": lambda: fi.sampling_from_logits(logits),
        "top_k_sampling_from_probs": lambda: fi.top_k_sampling_from_probs(probs, k),
        "top_p_sampling_from_probs": lambda: fi.top_p_sampling_from_probs(probs, p),
        "min_p_sampling_from_probs": lambda: fi.min_p_sampling_from_probs(probs, MIN_P),
        "top_k_top_p_sampling_from_logits": lambda: fi.top_k_top_p_sampling_from_logits(logits, k, p),
        "top_k_top_p_sampling_from_probs": lambda: fi.top_k_top_p_sampling_from_probs(probs, k, p),
        "top_p_renorm_probs": lambda: fi.top_p_renorm_probs(probs, p),
        "top_k_renorm_probs": lambda: fi.top_k_renorm_probs(probs, k),
        "top_k_mask_logits": lambda: fi.top_k_mask_logits(logits, k),
        "chain_speculative_sampling": lambda: fi.chain_speculative_sampling(x["draft"], x["ids"].int(), x["target"]),
    }
    return calls.get(op)


def copy_bandwidth(device: torch.device, nbytes: int = 2**28) -> float:
    """Bytes per second of a large tensor copy (read + write), the memory floor's speed."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    result = time_call(lambda: dst.copy_(src), device, min_time_s=0.3)
    return 2 * nbytes / result["time_s"]


def run(
    device: torch.device,
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
    vocabs: tuple[int, ...] = DEFAULT_VOCABS,
    ops: tuple[str, ...] = OPS,
    min_time_s: float = 0.2,
    backend: str = "auto",
    flashinfer: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time every op at every (B, V). Returns {"bandwidth_gbps", "entries": [...]}, one entry per
    (op, B, V) with ``time_s`` / ``gbps`` / ``floor_share`` for ours, the PyTorch way and (CUDA)
    FlashInfer."""
    bandwidth = copy_bandwidth(device)
    entries = []
    for V in vocabs:
        for B in batch_sizes:
            x = _inputs(B, V, device, seed=B * 7 + V)
            for op in ops:
                ours, baseline, nbytes = _calls(op, x, backend)
                entry: dict[str, Any] = {"op": op, "batch_size": B, "vocab_size": V, "bytes": nbytes}
                impls = [("ours", ours)]
                if op != "chain_speculative_sampling":
                    impls.append(("torch", baseline))
                fi = _flashinfer_call(op, x) if flashinfer and device.type == "cuda" else None
                if fi is not None:
                    impls.append(("flashinfer", fi))
                for name, fn in impls:
                    if progress:
                        progress(f"{op} B={B} V={V} {name}")
                    t = time_call(fn, device, min_time_s=min_time_s, min_repeats=1, warmup=1)["time_s"]
                    entry[name] = {
                        "time_s": t,
                        "gbps": nbytes / t / 1e9,
                        "floor_share": nbytes / bandwidth / t,
                    }
                entries.append(entry)
                synchronize(device)
    return {"bandwidth_gbps": bandwidth / 1e9, "entries": entries}


def render(result: dict[str, Any]) -> str:
    """A plain-text table: time (ms), GB/s and floor share of ours and the others, speedup."""
    impls = [i for i in ("ours", "torch", "flashinfer") if any(i in e for e in result["entries"])]
    headers = ["op", "B", "V"] + [f"{i} {c}" for i in impls for c in ("ms", "GB/s", "floor")] + ["torch/ours"]
    rows = []
    for e in result["entries"]:
        row = [e["op"], str(e["batch_size"]), str(e["vocab_size"])]
        for i in impls:
            if i in e:
                row += [f"{e[i]['time_s'] * 1e3:.3f}", f"{e[i]['gbps']:.2f}", f"{e[i]['floor_share']:.3f}"]
            else:
                row += ["-", "-", "-"]
        row.append(f"{e['torch']['time_s'] / e['ours']['time_s']:.2f}x" if "torch" in e else "-")
        rows.append(row)
    widths = (
        [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)] if rows else [len(h) for h in headers]
    )
    lines = [
        "  ".join(h.rjust(w) if i > 0 else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True)))
    ]
    for r in rows:
        lines.append(
            "  ".join(c.rjust(w) if i > 0 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )
    return f"copy bandwidth {result['bandwidth_gbps']:.1f} GB/s (floor share = bytes / bandwidth / time)\n" + "\n".join(
        lines
    )


def main(args: Any) -> int:
    """``spec-samplers bench sampling`` (its arguments: spec_samplers.bench.cli.add_sampling_arguments)."""
    import sys

    from spec_samplers.bench import report

    device = resolve_device(args.device)
    full = bool(args.full)
    batch_sizes = args.batch_sizes or (FULL_BATCH_SIZES if full else DEFAULT_BATCH_SIZES)
    vocabs = args.vocabs or (FULL_VOCABS if full else DEFAULT_VOCABS)
    ops = tuple(args.sampling_ops or OPS)
    min_time = args.min_time if args.min_time is not None else (0.02 if args.quick else 0.2)
    if args.quick:
        batch_sizes, vocabs = (1, 4), (2048,)
    start = time.perf_counter()
    result = run(
        device,
        tuple(batch_sizes),
        tuple(vocabs),
        ops,
        min_time_s=min_time,
        progress=(lambda m: print(m, file=sys.stderr)) if args.progress else None,
    )
    document = {
        "schema": "spec-samplers-sampling-bench/1",
        "machine": report.machine_info(device),
        "config": {
            "batch_sizes": list(batch_sizes),
            "vocabs": list(vocabs),
            "ops": list(ops),
            "min_time_s": min_time,
            "top_k": TOP_K,
            "top_p": TOP_P,
            "min_p": MIN_P,
            "chain_n": CHAIN_N,
            "threads": torch.get_num_threads(),
            "full": full,
            "wall_s": None,
        },
        **result,
    }
    document["config"]["wall_s"] = round(time.perf_counter() - start, 1)
    print(render(result))
    if args.json:
        report.write_json(args.json, document)
        print(f"\nwrote {args.json}")
    return 0


def check_backends_agree(device: torch.device, batch_size: int, vocab_size: int, seed: int = 0) -> list[str]:
    """Runs every op on backend="triton" and backend="torch" on the same inputs, seeds and offsets
    (real sizes on a GPU; benchmarks/gpu_check.py can call it) and returns the ops whose outputs
    differ: tokens, validity, renormalised probabilities and masked logits must be equal, softmax
    within 1e-6. An empty list means the kernels reproduced the reference."""
    x = _inputs(batch_size, vocab_size, device, seed)
    bad = []
    for op in OPS:
        outs = []
        for backend in ("triton", "torch"):
            out = _calls(op, x, backend)[0]()
            outs.append(out if isinstance(out, tuple) else (out,))
        if op == "softmax":
            same = torch.allclose(outs[0][0], outs[1][0], atol=1e-6, rtol=1e-5)
        else:
            same = all(torch.equal(a, b) for a, b in zip(outs[0], outs[1], strict=True))
        if not same:
            bad.append(op)
    return bad
