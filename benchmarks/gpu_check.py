#!/usr/bin/env python
"""GPU check of the Triton kernels (issue 3): equality at real sizes, CUDA-graph replay, timings.

Usage::

    python benchmarks/gpu_check.py [--out benchmarks/results] [--quick] [--vocabs 32000 ...]

(--vocabs/--batches/--ks split the full sweep into shorter runs, one result file per V set.)

On a CUDA machine this one script

1. checks kernel == PyTorch reference token for token (``torch.equal``) at real sizes:
   V in {32000, 128256, 152064}, B in {1, 8, 64, 256}, k in {1, 4, 8}, fp32 and bf16, for
   rejection sampling (padded, mixed greedy/random rows, draft probs and point-mass drafts,
   ragged with some k_b = 0, logits inputs) and typical acceptance;
2. captures each kernel path in a CUDA graph once and replays it with new inputs and new seeds,
   checking the replayed tokens against the reference;
3. times the kernels with CUDA events (median of many runs, warm L2 and cold L2, the latter after
   overwriting a buffer larger than L2), graph replay at B = 1, next to the memory floor and,
   when importable, FlashInfer's ``chain_speculative_sampling`` and vLLM's Triton
   ``rejection_sample`` on the same inputs;
4. writes ``gpu_check_<gpu>_<date>.json`` and ``.md`` (GPU name, date, versions, tables) to --out.

It exits with status 1 when an equality or graph check fails on a probabilities input, and with
a "CUDA required" error on machines without CUDA.

Memory floor (SPEC section 6): time >= bytes that must be read / measured bandwidth, where the
bandwidth is that of a device-to-device copy (2 * bytes / time) measured in the same run.
Bytes that must be read, per call (b = bytes per element of the input dtype):

* rejection, probs with draft probs: the accept test reads O(B * k) gathered scalars; only the
  first rejected position of each request needs its vocabulary rows, q_j and p_j:
  worst case (every request rejects) 2 * B * V * b, independent of k. The timed inputs are that
  worst case (every draft id is a zero-probability token, so position 0 rejects);
* rejection, point-mass drafts (draft_probs=None): B * V * b;
* rejection, greedy requests: their argmax at every position, (k + 1) * B * V * b at worst;
* rejection, logits input: normalising a row needs all of it, and the accept test needs every
  position's normaliser: (2k + 1) * B * V * b (target and draft logits), read once;
  (the kernels read the rejected rows a second time: the floor is not reachable there);
* typical acceptance: every position's entropy, (k + 1) * B * V * b.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import importlib
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

VOCABS = (32000, 128256, 152064)
BATCHES = (1, 8, 64, 256)
KS = (1, 4, 8)
DTYPES = (torch.float32, torch.bfloat16)
#: where inputs live; the CPU test of this script swaps in "cpu" (kernels through TRITON_INTERPRET=1)
DEVICE = "cuda"


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise SystemExit(
            "gpu_check: CUDA required: no CUDA device is visible (torch.cuda.is_available() is False). "
            "Run this script on a GPU machine; the CPU test suite covers the kernels through TRITON_INTERPRET=1."
        )


def _version(name: str) -> str | None:
    try:
        mod = importlib.import_module(name)
    except Exception:
        return None
    return getattr(mod, "__version__", "unknown")


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclasses.dataclass
class Inputs:
    target: torch.Tensor  # [B, k+1, V]
    draft: torch.Tensor  # [B, k, V]
    ids: torch.Tensor  # [B, k] int64
    bonus: torch.Tensor  # [B, 1] int64
    seeds: torch.Tensor  # [B] int64
    offsets: torch.Tensor  # [B] int64
    is_greedy: torch.Tensor  # [B] bool
    target_logits: torch.Tensor  # [B, k+1, V]
    draft_logits: torch.Tensor  # [B, k, V]
    temperature: torch.Tensor  # [B] fp32, 0 on greedy rows


def make_inputs(B: int, k: int, V: int, dtype: torch.dtype, seed: int, *, worst_case: bool = False) -> Inputs:
    """Drafts close to the target (long accepted prefixes, realistic), or with ``worst_case`` a
    zero-probability draft at position 0 of every request (every request reads its rows)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    dev = DEVICE
    temperature = torch.rand(B, generator=g, device=dev) + 0.5
    tl = torch.randn(B, k + 1, V, generator=g, device=dev) * 3.0
    dl = tl[:, :k] + 0.3 * torch.randn(B, k, V, generator=g, device=dev)
    target = torch.softmax(tl / temperature[:, None, None], -1)
    draft = torch.softmax(dl / temperature[:, None, None], -1)
    ids = torch.multinomial(draft.reshape(-1, V), 1, generator=g).view(B, k)
    if worst_case:
        target[:, :, 0] = 0.0
        ids[:, 0] = 0
    bonus = torch.randint(0, V, (B, 1), generator=g, device=dev)
    is_greedy = torch.rand(B, generator=g, device=dev) < (0.0 if worst_case else 0.3)
    greedy_ids = dl.argmax(-1)
    ids = torch.where(is_greedy[:, None], greedy_ids, ids)
    temperature = torch.where(is_greedy, torch.zeros_like(temperature), temperature)
    seeds = torch.randint(0, 2**62, (B,), generator=g, device=dev)
    offsets = torch.randint(0, 2**40, (B,), generator=g, device=dev)
    return Inputs(target.to(dtype), draft.to(dtype), ids, bonus, seeds, offsets, is_greedy,
                  tl.to(dtype), dl.to(dtype), temperature)


def ragged(inp: Inputs, k_b: torch.Tensor):
    """(target [T, V], draft [T, V], ids [T], cu [B]) keeping the first k_b positions of each request."""
    k = inp.ids.shape[1]
    keep = torch.arange(k, device=DEVICE)[None, :] < k_b[:, None]
    return inp.target[:, :k][keep], inp.draft[keep], inp.ids[keep], torch.cumsum(k_b, 0)


# ---------------------------------------------------------------------------------------------
# Equality


def _fits(B: int, k: int, V: int) -> bool:
    """Inputs plus the reference's temporaries stay well inside device memory."""
    if DEVICE != "cuda":
        return True
    return B * (k + 1) * V * 4 * 6 < 0.6 * torch.cuda.get_device_properties(0).total_memory


def check_equality(vocabs=VOCABS, batches=BATCHES, ks=KS) -> list[dict]:
    from spec_samplers import reference as R
    from spec_samplers.kernels import rejection_launch as RL
    from spec_samplers.kernels import typical_launch as TL

    rows = []
    for V in vocabs:
        for B in batches:
            for k in ks:
                for dtype in DTYPES:
                    if not _fits(B, k, V):
                        continue
                    inp = make_inputs(B, k, V, dtype, seed=V + B + k)
                    res = {"V": V, "B": B, "k": k, "dtype": str(dtype).replace("torch.", "")}
                    a = (inp.target, inp.bonus, inp.draft, inp.ids, inp.seeds, inp.offsets, inp.is_greedy)
                    res["rejection"] = torch.equal(RL.rejection_sample_triton(*a), R.rejection_sample_reference(*a))
                    a0 = (inp.target, inp.bonus, None, inp.ids, inp.seeds, inp.offsets, inp.is_greedy)
                    res["rejection_point_mass"] = torch.equal(RL.rejection_sample_triton(*a0), R.rejection_sample_reference(*a0))
                    k_b = torch.randint(0, k + 1, (B,), device=DEVICE)
                    t, d, ids, cu = ragged(inp, k_b)
                    ar = (t, inp.bonus[:, 0], d, ids, cu, k, inp.seeds, inp.offsets, inp.is_greedy)
                    res["rejection_ragged"] = torch.equal(
                        RL.rejection_sample_ragged_triton(*ar), R.rejection_sample_ragged_reference(*ar))
                    at = (inp.target, inp.bonus, inp.ids, 0.09, 0.3)
                    res["typical"] = torch.equal(TL.typical_accept_triton(*at), R.typical_accept_reference(*at))
                    al = (inp.target_logits, inp.bonus, inp.draft_logits, inp.ids, inp.temperature, inp.seeds, inp.offsets)
                    out = RL.rejection_sample_from_logits_triton(*al)
                    ref = R.rejection_sample_from_logits_reference(*al)
                    # Logits: the fused softmax may differ from torch.softmax in the last bit, so a
                    # near-tie can flip; report differing rows rather than require equality.
                    res["logits_rows_differing"] = int((out != ref).any(dim=1).sum())
                    atl = (inp.target_logits, inp.bonus, inp.ids, inp.temperature, 0.09, 0.3)
                    res["typical_logits_rows_differing"] = int(
                        (TL.typical_accept_from_logits_triton(*atl) != R.typical_accept_from_logits_reference(*atl)).any(dim=1).sum())
                    res["accepted_per_request"] = float((R.rejection_sample_reference(*a)[:, 1:] != -1).sum(1).float().mean())
                    rows.append(res)
                    print("equality", res, flush=True)
                    del inp
                    if DEVICE == "cuda":
                        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------
# CUDA graphs


def check_graphs() -> list[dict]:
    from spec_samplers import RejectionSampler
    from spec_samplers import reference as R
    from spec_samplers.kernels import rejection_launch as RL
    from spec_samplers.kernels import typical_launch as TL

    rows = []
    for B, k, V in ((1, 4, 128256), (64, 4, 32000)):
        for dtype in DTYPES:
            static = make_inputs(B, k, V, dtype, seed=1)
            fns = {
                "rejection": lambda s: RL.rejection_sample_triton(s.target, s.bonus, s.draft, s.ids, s.seeds, s.offsets, s.is_greedy),
                "typical": lambda s: TL.typical_accept_triton(s.target, s.bonus, s.ids, 0.09, 0.3),
                "rejection_logits": lambda s: RL.rejection_sample_from_logits_triton(
                    s.target_logits, s.bonus, s.draft_logits, s.ids, s.temperature, s.seeds, s.offsets),
            }
            sampler = RejectionSampler()  # backend "auto": the kernels on CUDA
            fns["sampler_forward"] = lambda s: sampler(s.target, s.bonus, s.draft, s.ids, seeds=s.seeds, offsets=s.offsets,
                                                       is_greedy=s.is_greedy)
            refs = {
                "sampler_forward": lambda s: R.rejection_sample_reference(
                    s.target, s.bonus, s.draft, s.ids, s.seeds, s.offsets, s.is_greedy),
                "rejection": lambda s: R.rejection_sample_reference(s.target, s.bonus, s.draft, s.ids, s.seeds, s.offsets, s.is_greedy),
                "typical": lambda s: R.typical_accept_reference(s.target, s.bonus, s.ids, 0.09, 0.3),
                "rejection_logits": lambda s: R.rejection_sample_from_logits_reference(
                    s.target_logits, s.bonus, s.draft_logits, s.ids, s.temperature, s.seeds, s.offsets),
            }
            for name, fn in fns.items():
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    fn(static)  # compile and warm up outside the capture
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = fn(static)
                differing = 0
                for trial in range(3):
                    new = make_inputs(B, k, V, dtype, seed=100 + trial)
                    for f in dataclasses.fields(Inputs):
                        getattr(static, f.name).copy_(getattr(new, f.name))
                    graph.replay()
                    torch.cuda.synchronize()
                    differing += int((out != refs[name](static)).any(dim=1).sum())
                replay_us = _time_graph(graph)
                # Logits: ulp-level softmax differences may flip a near-tie (reported, not failed).
                ok = differing == 0 or name == "rejection_logits"
                rows.append({"kernel": name, "B": B, "k": k, "V": V, "dtype": str(dtype).replace("torch.", ""),
                             "replays_equal": ok, "rows_differing": differing, "replay_us": replay_us})
                print("graph", rows[-1], flush=True)
    return rows


def _time_graph(graph: torch.cuda.CUDAGraph, iters: int = 200) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------
# Timing


def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy (read + write), median of 20."""
    x = torch.empty(2**28, dtype=torch.float32, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        y.copy_(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del x, y
    return 2 * 2**30 / statistics.median(times)


_FLUSH: torch.Tensor | None = None


def time_call(fn, *, cold: bool, iters: int) -> float:
    """Median microseconds of fn() by CUDA events; cold: L2 overwritten before each call."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(2**28 // 4 * 4, dtype=torch.int8, device="cuda")  # 256 MiB > any L2
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        if cold:
            _FLUSH.zero_()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _flashinfer_fn(inp: Inputs):
    try:
        import flashinfer.sampling as fs
    except Exception as exc:  # not installed or not built for this GPU
        return None, f"flashinfer not importable: {exc}"
    draft, target = inp.draft.float(), inp.target.float()  # FlashInfer reads fp32 only
    ids = inp.ids.int()
    return (lambda: fs.chain_speculative_sampling(draft, ids, target)), None


def _vllm_fn(inp: Inputs):
    try:
        from vllm.v1.sample import rejection_sampler as vrs
        from vllm.v1.sample.metadata import SamplingMetadata
    except Exception as exc:
        return None, f"vllm not importable: {exc}"
    B, k, V = inp.ids.shape[0], inp.ids.shape[1], inp.target.shape[-1]
    values = {
        "temperature": torch.ones(B, device=DEVICE), "all_greedy": False, "all_random": True, "top_p": None,
        "top_k": None, "generators": {}, "max_num_logprobs": None, "no_penalties": True, "prompt_token_ids": None,
        "frequency_penalties": torch.zeros(B, device=DEVICE), "presence_penalties": torch.zeros(B, device=DEVICE),
        "repetition_penalties": torch.ones(B, device=DEVICE), "output_token_ids": [[] for _ in range(B)],
        "allowed_token_ids_mask": None, "bad_words_token_ids": {}, "logitsprocs": None,
    }
    try:
        fields = {f.name for f in dataclasses.fields(SamplingMetadata)}
        meta = SamplingMetadata(**{n: v for n, v in values.items() if n in fields})
    except Exception as exc:
        return None, f"vllm SamplingMetadata not constructible: {exc}"
    target_logits = torch.log(inp.target[:, :k].float().clamp_min(1e-30)).reshape(B * k, V).contiguous()
    draft_probs = inp.draft.float().reshape(B * k, V).contiguous()
    ids = inp.ids.reshape(-1).int().contiguous()
    cu = torch.arange(1, B + 1, device=DEVICE, dtype=torch.int32) * k
    bonus = inp.bonus.int().contiguous()
    num = [k] * B

    def call():
        # vLLM scales target_logits in place (temperature 1 here) and softmaxes them itself.
        return vrs.rejection_sample(ids, num, k, cu, draft_probs, target_logits, bonus, meta)

    try:
        call()
    except Exception as exc:
        return None, f"vllm rejection_sample failed: {exc}"
    return call, None


def run_timings(bw: float, vocabs=VOCABS, batches=BATCHES, ks=KS, warm_iters: int = 100,
                cold_iters: int = 30) -> tuple[list[dict], list[str]]:
    from spec_samplers.kernels import rejection_launch as RL
    from spec_samplers.kernels import typical_launch as TL

    rows, notes = [], []
    for V in vocabs:
        for B in batches:
            for k in ks:
                for dtype in DTYPES:
                    if not _fits(B, k, V):
                        continue
                    inp = make_inputs(B, k, V, dtype, seed=7, worst_case=True)
                    b = inp.target.element_size()
                    cases = {
                        "rejection": (lambda: RL.rejection_sample_triton(inp.target, inp.bonus, inp.draft, inp.ids, inp.seeds, inp.offsets), 2 * B * V * b),
                        "rejection_point_mass": (lambda: RL.rejection_sample_triton(inp.target, inp.bonus, None, inp.ids, inp.seeds, inp.offsets), B * V * b),
                        "typical": (lambda: TL.typical_accept_triton(inp.target, inp.bonus, inp.ids, 0.09, 0.3), (k + 1) * B * V * b),
                        "rejection_logits": (lambda: RL.rejection_sample_from_logits_triton(
                            inp.target_logits, inp.bonus, inp.draft_logits, inp.ids, inp.temperature, inp.seeds, inp.offsets),
                            (2 * k + 1) * B * V * b),
                    }
                    for name, (fn, floor_bytes) in cases.items():
                        warm = time_call(fn, cold=False, iters=warm_iters)
                        cold = time_call(fn, cold=True, iters=cold_iters)
                        floor_us = floor_bytes / bw * 1e6
                        rows.append({"impl": "spec_samplers", "kernel": name, "V": V, "B": B, "k": k,
                                     "dtype": str(dtype).replace("torch.", ""), "warm_us": warm, "cold_us": cold,
                                     "floor_us": floor_us, "cold_over_floor": cold / floor_us})
                        print("time", rows[-1], flush=True)
                    for impl, maker in (("flashinfer", _flashinfer_fn), ("vllm", _vllm_fn)):
                        fn, why = maker(inp)
                        if fn is None:
                            if why not in notes:
                                notes.append(why)
                            continue
                        warm = time_call(fn, cold=False, iters=warm_iters)
                        cold = time_call(fn, cold=True, iters=cold_iters)
                        floor_us = 2 * B * V * b / bw * 1e6
                        rows.append({"impl": impl, "kernel": "rejection", "V": V, "B": B, "k": k,
                                     "dtype": str(dtype).replace("torch.", ""), "warm_us": warm, "cold_us": cold,
                                     "floor_us": floor_us, "cold_over_floor": cold / floor_us})
                        print("time", rows[-1], flush=True)
                    del inp
                    torch.cuda.empty_cache()
    return rows, notes


# ---------------------------------------------------------------------------------------------
# Report


def _markdown(meta: dict, equality: list[dict], graphs: list[dict], timings: list[dict], notes: list[str]) -> str:
    lines = [f"# GPU check: {meta['gpu']}", "", f"Date {meta['date']}; " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
             f"; copy bandwidth {meta['copy_bandwidth_GBps']:.0f} GB/s.", ""]
    bad = [r for r in equality if not all(r[c] for c in ("rejection", "rejection_point_mass", "rejection_ragged", "typical"))]
    lines += [f"Equality (kernel == reference, torch.equal): {len(equality) - len(bad)}/{len(equality)} shapes equal on every probs path.",
              f"Logits paths, rows differing from the reference (ulp-level softmax differences): "
              f"{sum(r['logits_rows_differing'] for r in equality)} rejection, "
              f"{sum(r['typical_logits_rows_differing'] for r in equality)} typical.", ""]
    lines += ["| graph-captured call | B | k | V | dtype | replays equal | rows differing | replay us |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {g['kernel']} | {g['B']} | {g['k']} | {g['V']} | {g['dtype']} | {g['replays_equal']} | {g.get('rows_differing', 0)} | "
              f"{g['replay_us']:.1f} |" for g in graphs]
    lines += ["", "Timings (median us, CUDA events; cold = L2 flushed before each call; floor = bytes that must be read / copy bandwidth):", "",
              "| impl | kernel | V | B | k | dtype | warm us | cold us | floor us | cold / floor |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {t['impl']} | {t['kernel']} | {t['V']} | {t['B']} | {t['k']} | {t['dtype']} | {t['warm_us']:.1f} | {t['cold_us']:.1f} | "
              f"{t['floor_us']:.1f} | {t['cold_over_floor']:.2f} |" for t in timings]
    if notes:
        lines += ["", "Not measured:"] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"), help="output directory")
    parser.add_argument("--quick", action="store_true", help="a few shapes only (smoke run)")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS), help="subset of V (to split long runs)")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--ks", type=int, nargs="+", default=list(KS))
    args = parser.parse_args(argv)
    _require_cuda()
    import triton

    meta = {
        "gpu": torch.cuda.get_device_name(0),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                     "triton": triton.__version__, "flashinfer": _version("flashinfer"), "vllm": _version("vllm")},
    }
    bw = copy_bandwidth()
    meta["copy_bandwidth_GBps"] = bw / 1e9
    from spec_samplers.kernels.backend import use_triton

    meta["auto_backend_uses_kernels_on_cuda"] = use_triton("auto", torch.device("cuda"))
    print("meta", meta, flush=True)
    shapes = dict(vocabs=args.vocabs, batches=args.batches, ks=args.ks)
    if args.quick:
        shapes = dict(vocabs=args.vocabs[:1], batches=(1, 64), ks=(4,))
    equality = check_equality(**shapes)
    graphs = check_graphs()
    if args.skip_timing:
        timings, notes = [], ["timings skipped (--skip-timing)"]
    else:
        iters = dict(warm_iters=20, cold_iters=10) if args.quick else {}
        timings, notes = run_timings(bw, **shapes, **iters)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "" if shapes["vocabs"] == list(VOCABS) else "_V" + "-".join(map(str, shapes["vocabs"]))
    stem = f"gpu_check_{meta['gpu'].replace(' ', '_')}_{meta['date'][:10]}{tag}"
    (out / f"{stem}.json").write_text(json.dumps(
        {"meta": meta, "equality": equality, "graphs": graphs, "timings": timings, "notes": notes}, indent=1))
    (out / f"{stem}.md").write_text(_markdown(meta, equality, graphs, timings, notes))
    print(f"wrote {out / stem}.json and .md")
    failed = [r for r in equality if not all(r[c] for c in ("rejection", "rejection_point_mass", "rejection_ragged", "typical"))]
    failed += [g for g in graphs if not g["replays_equal"]]
    if failed:
        print(f"FAILED: {len(failed)} equality/graph checks", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
