"""The CPU path against its read floor and against vLLM's CPU draw (issue 37), in one process.

Verification (``--part verify``): each sampler (rejection, block verification, typical acceptance)
at K = 4, fp32 probabilities, B in ``--batch`` and V in ``--vocab``, drafts far from the target
(every request rejects its first draft, so rejection and block read full vocabulary rows), and
typical acceptance once more with in-support drafts under its threshold (``.../entropy``: the
entropy pass runs before the rejection; ``--compiled-only``: the reference runs once, for the
token check, and only the compiled path is timed). Two
paths of the same sampler, interleaved call by call so both see the same load:

* ``before``: ``backend="torch"``, the PyTorch reference (one chunk of requests at a time);
* ``after``: ``backend="auto"``, which on CPU tensors runs the compiled twin (spec_samplers.cpu)
  where the sampler has one, else the same reference.

``floor_ms``: the rows the sampler must read (rejection: the target and draft row of each
request, 2 * B * V * 4 bytes; block: all 2K rows; typical: the K target rows) at the read
bandwidth this process measures (``sum`` of a 128 MiB fp32 tensor, best of 5); ``x_floor`` =
median time / floor.

Draw (``--part draw``): one seeded draw per row from softmax(logits / T) (``sampling_from_logits``
with per-row seeds, the plugin's bonus draw) against vLLM's CPU method written out here (softmax,
then probs / Exp(1) from ``exponential_``, argmax), V = 128256; and, where vLLM's C++ CPU ops load
(run with the engine environment's python), against the draw vLLM's x86 CPU build really runs
(``TopKTopPSampler.forward_cpu``: ``torch.ops._C.fused_gumbel_argmax``, per-row seeds).

Threads: ``--threads`` (default 1) for torch and numba alike. A benchmark: nothing is asserted.

    python benchmarks/cpu_floor.py --json benchmarks/results/2026-11-29-cpu-floor.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

K = 4
#: the clock of every timing: wall time (``--clock wall``, default) or the calling thread's CPU time
#: (``--clock cpu``, one thread only: torch and numba run on the calling thread), which a loaded
#: machine does not stretch (at load 20 on 2 cores, wall times were ~5x the CPU times)
CLOCK: Callable[[], float] = time.perf_counter
ROWS_READ = {"rejection_sampler": 2, "block_verification": 2 * K, "typical_acceptance_sampler": K}
#: typical acceptance again, drafting each position's least likely token of the target's support:
#: q(x) > 0 but under the entropy threshold, so the kernel makes the entropy pass before it
#: rejects (far drafts have q(x) = 0, which the compiled kernel rejects without it)
TYPICAL_ENTROPY = "typical_acceptance_sampler/entropy"
ROWS_READ[TYPICAL_ENTROPY] = K


def read_bandwidth() -> float:
    """Bytes per second of a ``sum`` over a 128 MiB fp32 tensor, best of 5."""
    src = torch.ones(32 * 2**20)
    times = []
    for _ in range(5):
        t0 = CLOCK()
        src.sum()
        times.append(CLOCK() - t0)
    return src.numel() * 4 / min(times)


def interleaved(fns: dict[str, Callable[[], object]], calls: int, budget_s: float) -> dict[str, float]:
    """Median seconds of each function, called in turn (first calls excluded), at most ``calls``
    rounds and about ``budget_s`` seconds."""
    first = {}
    for name, fn in fns.items():
        t0 = CLOCK()
        fn()
        first[name] = CLOCK() - t0
    rounds = max(1, min(calls, int(budget_s / max(sum(first.values()), 1e-9))))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = CLOCK()
            fn()
            times[name].append(CLOCK() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def far_batch(B: int, V: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Target mass on the first half of the vocabulary, draft mass on the second: every request
    rejects position 0 and recovers from full rows."""
    g = torch.Generator().manual_seed(seed)
    half = V // 2
    target = torch.zeros(B, K + 1, V)
    target[..., :half] = torch.softmax(torch.randn(B, K + 1, half, generator=g), -1)
    draft = torch.zeros(B, K, V)
    draft[..., half:] = torch.softmax(4 * torch.randn(B, K, V - half, generator=g), -1)
    ids = draft.argmax(-1)
    bonus = torch.zeros(B, 1, dtype=torch.int64)
    seeds = torch.randint(0, 2**62, (B,), generator=g)
    return target, draft, ids, bonus, seeds


def verify_rows(
    batches: list[int], vocabs: list[int], calls: int, budget_s: float, timed: tuple[str, ...] = ("before", "after")
) -> list[dict[str, object]]:
    from spec_samplers.registry import get_sampler

    rows: list[dict[str, object]] = []
    for V in vocabs:
        full = far_batch(max(batches), V)
        for B in batches:
            target, draft, far_ids, bonus, seeds = (t[:B] for t in full)
            bw = read_bandwidth()
            in_support = target[:, :K, : V // 2].argmin(-1)
            for name, rows_read in ROWS_READ.items():
                extra = {"seeds": seeds} if not name.startswith("typical") else {}
                sampler = name.split("/")[0]
                paths = {p: get_sampler(sampler, backend=b) for p, b in (("before", "torch"), ("after", "auto"))}
                ids = in_support if name == TYPICAL_ENTROPY else far_ids
                outs = {p: s(target, bonus, draft, ids, **extra) for p, s in paths.items()}
                assert torch.equal(outs["before"], outs["after"]), f"{name} B={B} V={V}: tokens differ"
                calls_of = {p: functools.partial(s, target, bonus, draft, ids, **extra) for p, s in paths.items()}
                med = dict.fromkeys(("before", "after"), float("nan"))
                med.update(interleaved({p: calls_of[p] for p in timed}, calls, budget_s))
                floor = rows_read * B * V * 4 / bw
                row = dict(
                    sampler=name,
                    B=B,
                    V=V,
                    K=K,
                    floor_ms=floor * 1e3,
                    read_gb_s=bw / 1e9,
                    **{f"{p}_ms": t * 1e3 for p, t in med.items()},
                    **{f"{p}_x_floor": t / floor for p, t in med.items()},
                )
                rows.append(row)
                print(
                    f"{name:35} B={B:4d} V={V:6d} floor {floor * 1e3:8.2f} ms | "
                    f"before {med['before'] * 1e3:9.2f} ms ({med['before'] / floor:6.1f}x) | "
                    f"after {med['after'] * 1e3:8.2f} ms ({med['after'] / floor:5.1f}x)",
                    flush=True,
                )
    return rows


def vllm_cpu_draw(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """vLLM's CPU sampling method, written out: softmax(logits / T), then argmax of probs / E with
    E ~ Exp(1) from ``exponential_`` (the exponential race)."""
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def vllm_fused_draw() -> Callable[[torch.Tensor, dict[int, torch.Generator]], torch.Tensor] | None:
    """vLLM's x86 CPU build's own draw, where its C++ ops load (the engine environment): its
    ``TopKTopPSampler.forward_cpu`` takes one 31-bit seed per row (from the row's generator when
    seeded) and calls ``torch.ops._C.fused_gumbel_argmax`` on the fp32 logits (already divided by
    T); None elsewhere."""
    try:
        import vllm._custom_ops  # noqa: F401  (loads the ISA's _C library)

        op = torch.ops._C.fused_gumbel_argmax
    except (ImportError, AttributeError, RuntimeError, OSError):
        return None

    def draw(scaled: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
        seeds = torch.randint(0, 2**31, (scaled.shape[0],), dtype=torch.long)
        for i, gen in generators.items():
            seeds[i] = torch.randint(0, 2**31, (1,), generator=gen, dtype=torch.long).item()
        return op(scaled.to(torch.float32), seeds)

    return draw


def draw_rows(batches: list[int], V: int, calls: int, budget_s: float) -> list[dict[str, object]]:
    from spec_samplers.sampling import sampling_from_logits

    fused = vllm_fused_draw()

    rows: list[dict[str, object]] = []
    for B in batches:
        g = torch.Generator().manual_seed(B)
        logits = torch.randn(B, V, generator=g) * 3
        temperature = torch.full((B,), 0.8)
        seeds = torch.randint(0, 2**62, (B,), generator=g)
        offsets = torch.zeros(B, dtype=torch.int64)
        scaled = logits / temperature[:, None]  # (the plugin hands the draw logits already divided)
        ours = functools.partial(sampling_from_logits, scaled, seed=seeds, offset=offsets)
        theirs = functools.partial(vllm_cpu_draw, logits, temperature)
        fns = {"vllm": theirs, "ours": ours}
        if fused is not None:  # every row seeded, as ours: one generator per request
            generators = {i: torch.Generator().manual_seed(i) for i in range(B)}
            fns["vllm_fused"] = functools.partial(fused, scaled, generators)
        med = interleaved(fns, calls, budget_s)
        row = dict(op="seeded draw", B=B, V=V, vllm_ms=med["vllm"] * 1e3, ours_ms=med["ours"] * 1e3)
        row["ours_over_vllm"] = med["ours"] / med["vllm"]
        fused_text = ""
        if fused is not None:
            row["vllm_fused_ms"] = med["vllm_fused"] * 1e3
            row["ours_over_vllm_fused"] = med["ours"] / med["vllm_fused"]
            fused_text = f" | vLLM's C++ draw {row['vllm_fused_ms']:7.2f} ms ({row['ours_over_vllm_fused']:.2f}x)"
        rows.append(row)
        print(
            f"seeded draw B={B:3d} V={V}: vLLM method {med['vllm'] * 1e3:7.2f} ms | ours {med['ours'] * 1e3:7.2f} ms "
            f"({row['ours_over_vllm']:.2f}x){fused_text}",
            flush=True,
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("verify", "draw", "all"), default="all")
    ap.add_argument("--batch", type=int, action="append", help="verify: B (default 1, 8, 64, 256)")
    ap.add_argument("--vocab", type=int, action="append", help="verify: V (default 32000, 128256)")
    ap.add_argument("--draw-batch", type=int, action="append", help="draw: B (default 1, 8, 32)")
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--budget-s", type=float, default=6.0, help="about this long per row")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="cpu: the thread's CPU time (one thread)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument(
        "--compiled-only",
        action="store_true",
        help="verify: time only the compiled path (the reference runs once, for the token check)",
    )
    args = ap.parse_args()
    if args.clock == "cpu":
        if args.threads != 1:
            ap.error(f"--clock cpu times the calling thread: --threads must be 1, got {args.threads}")
        global CLOCK
        CLOCK = time.thread_time
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    loads = f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.clock} clock, load {loads}")
    rows: list[dict[str, object]] = []
    timed = ("after",) if args.compiled_only else ("before", "after")
    if args.part in ("verify", "all"):
        batches, vocabs = args.batch or [1, 8, 64, 256], args.vocab or [32000, 128256]
        rows += verify_rows(batches, vocabs, args.calls, args.budget_s, timed)
    if args.part in ("draw", "all"):
        rows += draw_rows(args.draw_batch or [1, 8, 32], 128256, args.calls, args.budget_s)
    if args.json:
        meta = dict(threads=args.threads, clock=args.clock, load_before=load, load_after=os.getloadavg())
        meta["torch"] = torch.__version__
        with open(args.json, "w") as fh:
            json.dump(dict(meta=meta, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
