#!/usr/bin/env python
"""Modeled cost of the sampling pivot search, before and after the scratch-row search (h-gpu).

Each search kernel is compiled for sm_90 here (no GPU: ``spec_samplers.bench.cost.sass``) and
the issue cycles of each loop body read from its SASS; a PyTorch emulation of the search's
decisions on the GPU profile's rows (V = 128256; bf16 randn logits) gives the trip counts (passes,
candidates). Cost = sum of loop cycles x warps x trips (warp-issue cycles per row; straight-line
code left out). Both kernels come from git (``--old-rev``, the commit before the change,
``--new-rev``, a commit with it).

    TRITON_INTERPRET= python benchmarks/search_cost_model.py [--old-rev 0e58db8] [--new-rev 0ac3ec0]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import subprocess
import tempfile
import types

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

from spec_samplers.bench.cost import sass  # noqa: E402

V = 128256
PIVOTS = 16


def _old_module(rev: str) -> types.ModuleType:
    text = subprocess.run(
        ["git", "show", f"{rev}:spec_samplers/kernels/sampling_kernels.py"], capture_output=True, text=True, check=True
    ).stdout
    path = os.path.join(tempfile.mkdtemp(), "old_sampling_kernels.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("old_sampling_kernels", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _loops(kernel: object, kwargs: dict) -> list[int]:
    launch = types.SimpleNamespace(kernel=kernel, args=(), kwargs=kwargs, grid=(1,))
    return [loop["issue_cycles"] for loop in sass.compile_variant(launch)["loops"]]


def _search_args(new: bool, warps: int) -> dict:
    f32 = torch.empty(1, dtype=torch.float32)
    i64 = torch.empty(1, dtype=torch.int64)
    args = dict(x_ptr=torch.empty(1, V), stride_r=V, rows_ptr=i64, max_ptr=f32, lo_ptr=f32, hi_ptr=f32)
    args.update(mass_ptr=i64, k_ptr=i64, p_ptr=f32, R=1, V=V, MODE=0, LOGITS=False, TRACK_MASS=False)
    args.update(BLOCK_V=256, PRECISE=True, num_warps=warps)
    if new:
        args.update(scratch_ptr=torch.empty(1, 8192), cap=8192)
    return args


def _filter_args(new: bool, warps: int) -> dict:
    B, K = 1, 4
    f32 = torch.empty(B, dtype=torch.float32)
    args = dict(x_ptr=torch.empty(B, K + 1, V, dtype=torch.bfloat16), stride_b=(K + 1) * V, stride_k=V, cu_ptr=None)
    args.update(temp_ptr=f32, top_k_ptr=torch.empty(B, dtype=torch.int64), top_p_ptr=f32, min_p_ptr=f32)
    args.update(stats_ptr=torch.empty(B, K + 1, 3), K=K, num_rows=B * K, V=V, RAGGED=False, BONUS_ROW=True)
    args.update(BLOCK_V=256, PRECISE=True, num_warps=warps)
    if new:
        args.update(scratch_ptr=torch.empty(B, K + 1, 8192), cap=8192)
    return args


def _key(v: torch.Tensor) -> torch.Tensor:
    b = v.view(torch.int32).to(torch.int64)
    return torch.where(b >= 0, b, b ^ 0x7FFFFFFF)


def _from_key(k: torch.Tensor) -> torch.Tensor:
    k = k.to(torch.int32)
    return torch.where(k >= 0, k, k ^ 0x7FFFFFFF).view(torch.float32)


def trips(v: torch.Tensor, lo: float, hi: float, mode: int, k: int = 0, top_p: float = 1.0) -> dict:
    """Passes until lo >= hi, the candidates in [lo, hi] at the start and after pass 1."""
    units = (v.clamp(max=1.0).double() * 2.0**40 + 0.5).floor().to(torch.int64)
    thr = top_p * float(units[v >= lo].sum())
    n0 = int(((v >= lo) & (v <= hi)).sum())
    passes, n1 = 0, n0
    while lo < hi and passes < 8:
        passes += 1
        key_lo = _key(torch.tensor([lo]))[0]
        piv = _from_key(key_lo + (torch.arange(1, PIVOTS + 1) * (_key(torch.tensor([hi]))[0] - key_lo)) // (PIVOTS + 1))
        gt = v[None, :] > piv[:, None]
        if mode == 0:
            ok = gt.sum(1) < k
        else:
            mass = (gt * units[None, :]).sum(1)
            ok = (mass == 0) | (mass.double() < thr)
        first = int(torch.where(ok, torch.arange(PIVOTS), PIVOTS).min())
        if first < PIVOTS:
            hi = float(torch.where(~gt[first], v, -math.inf).max())
        if first > 0:
            lo = float(torch.where(gt[first - 1], v, math.inf).min())
        if passes == 1:
            n1 = int(((v >= lo) & (v <= hi)).sum())
    return dict(passes=passes, n=n0, n_after_pass1=n1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old-rev", default="0e58db8")
    # (the scratch-row search as it landed: search_kernel has since become thresholds_kernel, which
    # runs the same searches after a min/max pass of its own)
    ap.add_argument("--new-rev", default="0ac3ec0")
    ap.add_argument("--rows", type=int, default=5)
    args = ap.parse_args()
    old_sk, new_sk = _old_module(args.old_rev), _old_module(args.new_rev)
    g = torch.Generator().manual_seed(0)
    top_k, cut = [], []
    for _ in range(args.rows):
        x = torch.randn(V, generator=g).to(torch.bfloat16).float()
        p = torch.softmax(x, -1)
        top_k.append(trips(p, float(p.min()), float(p.max()), 0, k=50))
        cut.append(trips(torch.exp((x - x.max()) / 0.8), 0.05, 1.0, 1, top_p=0.95))
    print("trips, top-k = 50 on softmax(randn):", top_k)
    print("trips, min-p 0.05 + top-p 0.95 at T = 0.8:", cut)
    w_old, w_new = 4, new_sk.SEARCH_WARPS
    tiles, wide = -(-V // 256), -(-V // 1024)
    # loops in source order. old search: [pivot pass]; old filter_cut: [count pass, mass sweep,
    # mass pass]. new search: [copy (if it fits), row pass, candidate pass, copy again]; new
    # filter_cut: those four for the top-k search, then for the top-p search.
    so, sn = (
        _loops(old_sk.search_kernel, _search_args(False, w_old)),
        _loops(new_sk.search_kernel, _search_args(True, w_new)),
    )
    fo, fn = (
        _loops(old_sk.filter_cut_kernel, _filter_args(False, w_old)),
        _loops(new_sk.filter_cut_kernel, _filter_args(True, w_new)),
    )
    print("loop issue cycles per warp and step: search old", so, "new", sn, "; filter_cut old", fo, "new", fn)
    for name, rows, old, new in (
        (
            "top-k = 50 search",
            top_k,
            lambda r: r["passes"] * tiles * so[0] * w_old,
            lambda r: (
                (tiles * sn[1] + wide * sn[3] + (r["passes"] - 1) * -(-r["n_after_pass1"] // 256) * sn[2]) * w_new
            ),
        ),
        (
            "min-p + top-p cut (filter_cut)",
            cut,
            lambda r: (tiles * fo[1] + r["passes"] * tiles * fo[2]) * w_old,
            lambda r: (wide * fn[4] + r["passes"] * -(-r["n"] // 256) * fn[6]) * w_new,
        ),
    ):
        o = max(old(r) for r in rows)
        n = max(new(r) for r in rows)
        print(f"{name}: {o:,} -> {n:,} warp-issue cycles per row (worst of {len(rows)} rows): {o / n:.1f}x fewer")


if __name__ == "__main__":
    main()
