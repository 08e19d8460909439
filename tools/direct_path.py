#!/usr/bin/env python
"""Direct-path measurements (issue 28): a measurement script, not part of the package.

Subcommands (run from the checkout root with ``PYTHONPATH=$PWD``):

* ``levels [--json F] [--detail] [--call NAME]``: for a fixed list of calls on small CPU tensors, run
  with ``backend="triton"`` under ``TRITON_INTERPRET=1``, what a reader follows per call, on a warm
  call (the second: imports and once-per-process work done), caught with ``sys.setprofile``
  without patching anything: the package files and functions the call executes on the host
  ("touched", "functions"; what runs inside a launch is the kernel, interpreted, and is not
  counted), and the Python stack at every Triton launch (the call of Triton's
  ``InterpretedFunction.run``, what ``kernel[grid](...)`` calls under the interpreter): the
  spec_samplers frames from the public entry down to the frame that made the launch. Per call:
  levels (those frames, the entry included; max over the call's launches), their qualified names,
  the distinct files on the path, the launches (kernel names in order); ``--detail`` lists the
  functions. The last line: files and functions per call over the sampler entries, and the
  targets (issue 40: mean files <= 5, functions <= 15).
* ``launches [--json F] [--time N]``: per call of every public entry (``entry_calls``: the level
  calls, the other samplers' entries, the sampling operations in their other argument forms), the
  launches a GPU would run, counted on the same CPU tensors planned as for a 132-SM GPU
  (``planned_for(LaunchConfig(num_sms=132, kernels=True, launches=[...]))``: the Triton launches
  are recorded, not run) plus the eager PyTorch ops the call runs
  (``spec_samplers.bench.cost.trace.OpCounter``, a dispatch mode: every aten op but views and
  allocations; the counter of tests/test_host_syncs.py and benchmarks/host_overhead.py), and the
  host syncs; with ``--time``, the host microseconds per call with the launches recorded (median).
* ``params [--json F]``: the largest function parameter counts in spec_samplers (ast).
* ``dups [--json F]``: the ``duplicates`` tool over spec_samplers/ (pair count and pairs).
* ``signatures --out F``: ``inspect.signature`` of every public name, as sorted JSON.
* ``corpus --out F``: tokens of seeded inputs through every entry, backend torch and triton.
* ``diff A B``: the differences between two signature or corpus files (no output: identical).
* ``report --out PREFIX``: all of the above into PREFIX.json, PREFIX.md, PREFIX-signatures.json
  and PREFIX-corpus.json.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import json
import os
import pkgutil
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (not when imported: a test
    # process on a GPU keeps its setting)

import torch  # noqa: E402

import spec_samplers  # noqa: E402

PKG_DIR = Path(spec_samplers.__file__).resolve().parent
ROOT = PKG_DIR.parent

# -- the launch recorder ----------------------------------------------------------------------------


@dataclass
class Frame:
    qualname: str
    file: str  # relative to the checkout root
    line: int


@dataclass
class Launch:
    kernel: str
    path: list[Frame]  # the package's frames, the entry first, the launching frame last


@dataclass
class Recording:
    launches: list[Launch] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)  # package files whose functions ran
    functions: set[str] = field(default_factory=set)  # package functions that ran (file:qualname)

    @property
    def levels(self) -> int:
        return max((len(launch.path) for launch in self.launches), default=0)

    def deepest(self) -> Launch | None:
        return max(self.launches, key=lambda launch: len(launch.path), default=None)

    def path_files(self) -> list[str]:
        """The distinct files on the deepest path, in path order."""
        deepest = self.deepest()
        return [] if deepest is None else list(dict.fromkeys(f.file for f in deepest.path))


def _launch_codes() -> set[Any]:
    """The code objects that ``kernel[grid](...)`` reaches: ``InterpretedFunction.run`` under the
    interpreter, ``JITFunction.run`` when compiling (through an autotuner or heuristics too)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return {InterpretedFunction.run.__code__, JITFunction.run.__code__}


def in_package(filename: str, package_dir: Path = PKG_DIR) -> bool:
    return filename.startswith(str(package_dir) + os.sep)


def package_path(frame: Any, anchor: Any, package_dir: Path = PKG_DIR) -> list[Frame]:
    """The frames of files under ``package_dir`` from ``frame`` up to (not including) ``anchor``,
    outermost first. Frames of other code (torch, triton, functools) are skipped, not counted."""
    path = []
    f = frame
    while f is not None and f is not anchor:
        code = f.f_code
        if in_package(code.co_filename, package_dir):
            rel = os.path.relpath(code.co_filename, package_dir.parent)
            path.append(Frame(getattr(code, "co_qualname", code.co_name), rel, f.f_lineno))
        f = f.f_back
    if f is None:
        raise RuntimeError("launch outside the recorded call (the anchor frame is not on the stack)")
    return path[::-1]


def record(fn: Callable[..., Any], *args: Any, package_dir: Path = PKG_DIR, **kwargs: Any) -> tuple[Any, Recording]:
    """Run ``fn(*args, **kwargs)``; return its result, the stack of each Triton launch and the host
    code it ran: package functions called outside the launches (what runs inside one is the kernel,
    interpreted: device code, not counted as host functions)."""
    launch_codes = _launch_codes()
    rec = Recording()
    seen: set[Any] = set()
    anchor = sys._getframe()
    launching: list[Any] = []  # the launch frame while a kernel runs

    def profile(frame: Any, event: str, arg: Any) -> None:
        if launching:
            if event == "return" and frame is launching[0]:
                launching.clear()
            return
        if event != "call":
            return
        code = frame.f_code
        if code in launch_codes:
            if frame.f_locals.get("warmup"):
                return
            kernel = frame.f_locals["self"]
            name = getattr(getattr(kernel, "fn", None), "__name__", type(kernel).__name__)
            rec.launches.append(Launch(name, package_path(frame.f_back, anchor, package_dir)))
            launching.append(frame)
        elif code not in seen:
            seen.add(code)
            if in_package(code.co_filename, package_dir):
                rel = os.path.relpath(code.co_filename, package_dir.parent)
                rec.touched.add(rel)
                rec.functions.add(f"{rel}:{getattr(code, 'co_qualname', code.co_name)}")

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        out = fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    return out, rec


# -- the calls ----------------------------------------------------------------------------------------

#: (B, K, V) of the level calls; the corpus adds a second shape (a request with no drafts, V not a power of 2)
SHAPE = (2, 3, 64)
SHAPE2 = (3, 2, 200)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _probs(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.softmax(torch.randn(shape, generator=g) * 2.0, dim=-1)


def _logits(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g) * 2.0


def _ids(shape: tuple[int, ...], g: torch.Generator, v: int) -> torch.Tensor:
    return torch.randint(0, v, shape, generator=g)


@dataclass
class Call:
    """One call of a public entry: ``fn(*args, **kwargs)``; ``entry`` is the public name."""

    name: str
    entry: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _seeds(n: int, base: int = 11) -> dict[str, torch.Tensor]:
    return dict(seeds=torch.arange(base, base + n, dtype=torch.int64), offsets=torch.zeros(n, dtype=torch.int64))


def _sampler_calls(
    backend: str,
    seed: int,
    point_mass: bool = False,
    shape: tuple[int, int, int] = SHAPE,
    samplers: tuple[tuple[str, type, bool], ...] | None = None,
) -> list[Call]:
    """The four entries of a stochastic sampler (RejectionSampler) and a deterministic one
    (TypicalAcceptanceSampler), the logits entries with temperature and with sampling_params, the
    ragged logits entry with draft_rows and with draft_probs; BlockVerificationSampler.forward.
    ``samplers`` ((label, class, stochastic), ...): these samplers' entries instead (not
    BlockVerificationSampler.forward's own call)."""
    from spec_samplers import BlockVerificationSampler, RejectionSampler, SamplingParams, TypicalAcceptanceSampler

    g = _gen(seed)
    B, K, V = shape
    k_b = torch.tensor([K, 1, 0][:B])  # ragged: request 0 has K drafts, request 1 one, request 2 none
    cu = torch.cumsum(k_b, 0)
    T = int(cu[-1])
    padded_probs = (_probs((B, K + 1, V), g), _ids((B, 1), g, V), _probs((B, K, V), g), _ids((B, K), g, V))
    ragged_probs = (_probs((T, V), g), _ids((B,), g, V), _probs((T, V), g), _ids((T,), g, V), cu, K)
    padded_logits = (_logits((B, K + 1, V), g), _ids((B, 1), g, V), _logits((B, K, V), g), _ids((B, K), g, V))
    ragged_logits = (_logits((T, V), g), _ids((B,), g, V), _logits((T, V), g), _ids((T,), g, V), cu, K)
    if point_mass:
        padded_probs = padded_probs[:2] + (None,) + padded_probs[3:]
        ragged_probs = ragged_probs[:2] + (None,) + ragged_probs[3:]
        padded_logits = padded_logits[:2] + (None,) + padded_logits[3:]
        ragged_logits = ragged_logits[:2] + (None,) + ragged_logits[3:]
    temperature = torch.tensor([0.8, 0.0, 1.3][:B])  # request 1 greedy
    params = [SamplingParams(temperature=0.9, top_p=0.8), SamplingParams(temperature=1.1, min_p=0.05)]
    params = (params + [SamplingParams(temperature=0.0)])[:B]
    n_rows = T + 2
    draft_rows = torch.randperm(n_rows, generator=g)[:T]
    draft_matrix = _logits((n_rows, V), g)
    draft_probs = _probs((T, V), g)
    ragged_no_draft = ragged_logits[:2] + (None,) + ragged_logits[3:]
    calls = []
    suffix = "_point_mass" if point_mass else ""
    for label, cls, stochastic in samplers or (
        ("rejection", RejectionSampler, True),
        ("typical", TypicalAcceptanceSampler, False),
    ):
        s = cls(backend=backend)
        rnd = _seeds(B) if stochastic else {}
        calls += [
            Call(f"{label}.forward{suffix}", "forward", s, padded_probs, dict(rnd)),
            Call(f"{label}.forward_ragged{suffix}", "forward_ragged", s.forward_ragged, ragged_probs, dict(rnd)),
            Call(
                f"{label}.forward_from_logits[temperature]{suffix}",
                "forward_from_logits",
                s.forward_from_logits,
                padded_logits,
                dict(rnd, temperature=temperature),
            ),
            Call(
                f"{label}.forward_from_logits[sampling_params]{suffix}",
                "forward_from_logits",
                s.forward_from_logits,
                padded_logits,
                dict(rnd, sampling_params=params),
            ),
            Call(
                f"{label}.forward_ragged_from_logits[temperature]{suffix}",
                "forward_ragged_from_logits",
                s.forward_ragged_from_logits,
                ragged_logits,
                dict(rnd, temperature=temperature),
            ),
        ]
        if not point_mass:
            calls += [
                Call(
                    f"{label}.forward_ragged_from_logits[draft_rows]",
                    "forward_ragged_from_logits",
                    s.forward_ragged_from_logits,
                    ragged_logits[:2] + (draft_matrix,) + ragged_logits[3:],
                    dict(rnd, temperature=temperature, draft_rows=draft_rows),
                ),
                Call(
                    f"{label}.forward_ragged_from_logits[draft_probs]",
                    "forward_ragged_from_logits",
                    s.forward_ragged_from_logits,
                    ragged_no_draft,
                    dict(rnd, temperature=temperature, draft_probs=draft_probs),
                ),
            ]
    if samplers is None:
        block = BlockVerificationSampler(backend=backend)
        calls.append(Call(f"block.forward{suffix}", "forward", block, padded_probs, _seeds(B)))
    return calls


def _tree_calls(
    backend: str,
    seed: int,
    shape: tuple[int, int, int] = SHAPE,
    samplers: tuple[tuple[str, type, bool], ...] | None = None,
    paths: tuple[int, int] | None = None,
) -> list[Call]:
    """forward_tree, forward_tree_from_logits and their ragged twins, on the two samplers with a tree
    kernel (RejectionSampler, TypicalAcceptanceSampler), or on ``samplers`` ((label, class,
    stochastic), ...); ``paths`` (K, L): a tree of K paths of length L (GBV's shape), every
    request with all of its nodes."""
    from spec_samplers import RejectionSampler, SamplingParams, TypicalAcceptanceSampler
    from spec_samplers.tree.multipath import path_parents

    g = _gen(seed)
    B, _, V = shape
    parents = [0, 0, 1, 1, 3] if paths is None else path_parents(*paths)  # N = 5 nodes, depth 3
    N = len(parents)
    # ragged: request 1 has the first 3 nodes, request 2 one (paths: every request has all N)
    sizes = [N, 3, 1][:B] if paths is None else [N] * B
    cu = torch.cumsum(torch.tensor(sizes), 0)
    T = int(cu[-1])
    ragged_parents = torch.tensor([p for n in sizes for p in parents[:n]])
    temperature = torch.tensor([0.7, 0.0, 1.2][:B])
    # per-request filters (top-k, top-p, min-p; a greedy request): processed in the entry (sampling_params=)
    filters = [
        SamplingParams(temperature=0.8, top_k=3, top_p=0.9),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.1, top_p=0.5, min_p=0.2),
    ][:B]
    padded_probs = (_probs((B, N + 1, V), g), _probs((B, N + 1, V), g), _ids((B, N), g, V), parents)
    ragged_probs = (_probs((T + B, V), g), _probs((T + B, V), g), _ids((T,), g, V), ragged_parents, cu, N)
    padded_logits = (_logits((B, N + 1, V), g), _logits((B, N + 1, V), g), _ids((B, N), g, V), parents)
    ragged_logits = (_logits((T + B, V), g), _logits((T + B, V), g), _ids((T,), g, V), ragged_parents, cu, N)
    calls = []
    for label, cls, stochastic in samplers or (
        ("rejection", RejectionSampler, True),
        ("typical", TypicalAcceptanceSampler, False),
    ):
        s = cls(backend=backend)
        rnd = _seeds(B) if stochastic else {}
        calls += [
            Call(f"{label}.forward_tree", "forward_tree", s.forward_tree, padded_probs, dict(rnd)),
            Call(f"{label}.forward_tree_ragged", "forward_tree_ragged", s.forward_tree_ragged, ragged_probs, dict(rnd)),
            Call(
                f"{label}.forward_tree_from_logits",
                "forward_tree_from_logits",
                s.forward_tree_from_logits,
                padded_logits,
                dict(rnd, temperature=temperature),
            ),
            Call(
                f"{label}.forward_tree_ragged_from_logits",
                "forward_tree_ragged_from_logits",
                s.forward_tree_ragged_from_logits,
                ragged_logits,
                dict(rnd, temperature=temperature),
            ),
            Call(
                f"{label}.forward_tree_from_logits[filters]",
                "forward_tree_from_logits",
                s.forward_tree_from_logits,
                padded_logits,
                dict(rnd, sampling_params=filters),
            ),
            Call(
                f"{label}.forward_tree_ragged_from_logits[filters]",
                "forward_tree_ragged_from_logits",
                s.forward_tree_ragged_from_logits,
                ragged_logits,
                dict(rnd, sampling_params=filters),
            ),
        ]
    return calls


def _sampling_calls(backend: str, seed: int, shape: tuple[int, int, int] = SHAPE) -> list[Call]:
    """The sampling operations, with explicit [B] seeds and offsets."""
    import spec_samplers.sampling as sp

    g = _gen(seed)
    B, K, V = shape
    probs, logits = _probs((B, V), g), _logits((B, V), g)
    draft, target, ids = _probs((B, K, V), g), _probs((B, K + 1, V), g), _ids((B, K), g, V)
    rnd = dict(seed=torch.tensor([5, 6, 7][:B]), offset=torch.tensor([0, 3, 1][:B]))
    bk = dict(backend=backend)
    top_k, top_p, min_p = (torch.tensor(x[:B]) for x in ([5, 20, 0], [0.7, 0.9, 1.0], [0.1, 0.02, 0.0]))
    temperature = torch.tensor([0.7, 1.3, 0.0][:B])
    ops: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("sampling_from_probs", (probs,), rnd),
        ("sampling_from_logits", (logits,), rnd),
        ("top_k_sampling_from_probs", (probs, top_k), rnd),
        ("top_p_sampling_from_probs", (probs, top_p), rnd),
        ("min_p_sampling_from_probs", (probs, min_p), rnd),
        ("top_k_top_p_sampling_from_probs", (probs, top_k, top_p), rnd),
        ("top_k_top_p_sampling_from_logits", (logits, top_k, top_p), rnd),
        ("softmax", (logits,), dict(temperature=temperature)),
        ("top_k_renorm_probs", (probs, top_k), {}),
        ("top_p_renorm_probs", (probs, top_p), {}),
        ("top_k_mask_logits", (logits, top_k), {}),
        ("chain_speculative_sampling", (draft, ids, target), rnd),
    ]
    return [Call(f"sampling.{name}", name, getattr(sp, name), args, dict(kw, **bk)) for name, args, kw in ops]


def level_calls(backend: str = "triton") -> list[Call]:
    """The calls ``levels`` measures (and the structural test checks)."""
    return _sampler_calls(backend, 1) + _tree_calls(backend, 2) + _sampling_calls(backend, 3)


def _other_samplers() -> tuple[tuple[str, type, bool], ...]:
    from spec_samplers import BlockVerificationSampler, MultipathBlockVerificationSampler

    return (("block", BlockVerificationSampler, True), ("multipath", MultipathBlockVerificationSampler, True))


def _sampling_forms(backend: str, seed: int, shape: tuple[int, int, int] = SHAPE) -> list[Call]:
    """The sampling operations in the other argument forms a caller gives: one seed for the batch
    (derived per row), seed None (the generator draws the rows' seeds), a seed tensor with one
    offset, Python-scalar parameters, int32 indices, return_valid, the joint filter order, a
    scalar temperature (softmax without one: its floats differ from the reference's in the last
    digit kept, the rounding of the row sums); chain_speculative_sampling with counters given and in each seed form."""
    import spec_samplers.sampling as sp

    g = _gen(seed)
    B, K, V = shape
    probs, logits = _probs((B, V), g), _logits((B, V), g)
    draft, target, ids = _probs((B, K, V), g), _probs((B, K + 1, V), g), _ids((B, K), g, V)
    idx = torch.tensor([B - 1, 0, 0, 1][: B + 1], dtype=torch.int32)
    top_k, top_p = torch.tensor([3, 0, 70][:B], dtype=torch.int32), torch.tensor([0.5, 1.0, 0.9][:B])

    def gen() -> dict[str, Any]:  # a generator of its own per call (made once: its state advances per run)
        return dict(generator=torch.Generator().manual_seed(seed))

    per_row = dict(seed=torch.arange(B), offset=torch.arange(B))
    # (counters are added to in place: each backend's corpus call list has its own)
    counters = dict(maybe_output_accepted_token_num=torch.arange(B), maybe_output_emitted_draft_token_num=torch.ones(B))
    seed_tensor = torch.arange(B)
    ops: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = [
        ("sampling_from_probs", "seed=5", (probs,), dict(seed=5, offset=2)),
        ("sampling_from_probs", "generator", (probs,), gen()),
        ("sampling_from_probs", "indices, return_valid", (probs,), dict(seed=4, indices=idx, return_valid=True)),
        ("sampling_from_logits", "seed=5", (logits,), dict(seed=5)),
        ("sampling_from_logits", "generator", (logits,), gen()),
        ("top_k_sampling_from_probs", "k=4, seed tensor, offset=3", (probs, 4), dict(seed=seed_tensor, offset=3)),
        ("top_p_sampling_from_probs", "p=0.8, seed=1", (probs, 0.8), dict(seed=1)),
        ("min_p_sampling_from_probs", "generator", (probs, 0.1), gen()),
        (
            "top_k_top_p_sampling_from_probs",
            "joint, int32",
            (probs, top_k, top_p),
            dict(per_row, filter_apply_order="joint"),
        ),
        ("top_k_top_p_sampling_from_logits", "scalars, seed=9", (logits, 5, 0.9), dict(seed=9, offset=1)),
        (
            "top_k_top_p_sampling_from_logits",
            "joint, generator",
            (logits, top_k, top_p),
            dict(gen(), filter_apply_order="joint"),
        ),
        ("softmax", "0.7", (logits, 0.7), {}),
        ("top_k_renorm_probs", "3", (probs, 3), {}),
        ("top_p_renorm_probs", "0.9", (probs, 0.9), {}),
        ("top_k_mask_logits", "int32", (logits, top_k), {}),
        ("chain_speculative_sampling", "counters", (draft, ids, target), dict(per_row, **counters)),
        ("chain_speculative_sampling", "seed=5", (draft, ids, target), dict(seed=5, offset=2)),
        ("chain_speculative_sampling", "seed tensor, offset=3", (draft, ids, target), dict(seed=seed_tensor, offset=3)),
        ("chain_speculative_sampling", "generator", (draft, ids, target), gen()),
    ]
    bk = dict(backend=backend)
    return [
        Call(f"sampling.{name}[{form}]", name, getattr(sp, name), args, dict(kw, **bk)) for name, form, args, kw in ops
    ]


def entry_calls(backend: str = "triton") -> list[Call]:
    """Every public entry of every registered sampler and every sampling operation: the level calls,
    then BlockVerificationSampler's and MultipathBlockVerificationSampler's other chain and tree
    entries (GBV's trees: K = 2 paths of L = 2), and the sampling operations in their other
    argument forms. What ``launches`` counts."""
    calls = level_calls(backend)
    seen = {c.name for c in calls}
    more = _sampler_calls(backend, 1, samplers=_other_samplers())
    more += _tree_calls(backend, 2, samplers=_other_samplers()[:1])
    more += _tree_calls(backend, 2, samplers=_other_samplers()[1:], paths=(2, 2))
    more += _sampling_forms(backend, 3)
    return calls + [c for c in more if c.name not in seen]


def corpus_calls(backend: str) -> list[Call]:
    """The token corpus: the level calls, point-mass drafts, and the calls at a second seed and shape
    (B=3 with a request that has no drafts, V=200)."""
    calls = entry_calls(backend) + _sampler_calls(backend, 4, point_mass=True)
    second = _sampler_calls(backend, 5, shape=SHAPE2) + _sampler_calls(backend, 8, point_mass=True, shape=SHAPE2)
    second += _tree_calls(backend, 6, shape=SHAPE2) + _sampling_calls(backend, 7, shape=SHAPE2)
    second += _sampler_calls(backend, 5, shape=SHAPE2, samplers=_other_samplers())
    for call in second:
        call.name += "#2"
    return calls + second


def _tokens(out: Any) -> Any:
    """JSON lists of a call's integer outputs (floats, e.g. softmax, rounded to 6 digits)."""
    if isinstance(out, torch.Tensor):
        if out.is_floating_point():
            return [round(x, 6) for x in out.flatten().tolist()]
        return out.tolist()
    if isinstance(out, (tuple, list)):
        return [_tokens(x) for x in out]
    raise TypeError(f"unexpected output type {type(out).__name__}")


# -- levels -------------------------------------------------------------------------------------------


def measure_levels(calls: list[Call] | None = None, package_dir: Path = PKG_DIR) -> list[dict[str, Any]]:
    rows = []
    for call in level_calls() if calls is None else calls:
        t0 = time.perf_counter()
        call.fn(*call.args, **call.kwargs)  # a warm call: imports and once-per-process work done
        _, rec = record(call.fn, *call.args, package_dir=package_dir, **call.kwargs)
        deepest = rec.deepest()
        rows.append(
            dict(
                call=call.name,
                entry=call.entry,
                levels=rec.levels,
                path=[] if deepest is None else [f.qualname for f in deepest.path],
                path_lines=[] if deepest is None else [f"{f.file}:{f.line}" for f in deepest.path],
                files=rec.path_files(),
                launches=[launch.kernel for launch in rec.launches],
                levels_per_launch=[len(launch.path) for launch in rec.launches],
                touched=sorted(rec.touched),
                functions=sorted(rec.functions),
                seconds=round(time.perf_counter() - t0, 2),
            )
        )
    return rows


#: the most package frames from a public entry (included) to a launch (issue 28)
LIMIT = 3

#: what a reader should follow per call (issue 40): files executed per call (mean over the sampler
#: entries) and package functions executed per call (each sampler entry)
FILES_TARGET = 5
FUNCTIONS_TARGET = 15


def violations(rows: list[dict[str, Any]], limit: int = LIMIT) -> list[str]:
    """What breaks the direct-path rule in ``measure_levels`` rows: more than ``limit`` package
    frames from the entry to a launch (with the path), no launch at all, or a path that does not
    start at the public entry."""
    found = []
    for r in rows:
        if not r["launches"]:
            found.append(f"{r['call']}: no kernel launch recorded")
        elif r["path"][0].rsplit(".", 1)[-1] != r["entry"]:
            found.append(f"{r['call']}: the path starts at {r['path'][0]}, not at the entry {r['entry']}")
        elif r["levels"] > limit:
            steps = " -> ".join(f"{q} ({loc})" for q, loc in zip(r["path"], r["path_lines"]))
            found.append(f"{r['call']}: {r['levels']} levels > {limit}: {steps}")
    return found


def sampler_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the chain sampler entries (not the tree entries, not the sampling operations)."""
    return [r for r in rows if not r["call"].startswith("sampling.") and "tree" not in r["entry"]]


def per_call(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Files and functions executed per call over ``rows``: the mean and the largest of each."""
    files = [len(r["touched"]) for r in rows]
    funcs = [len(r["functions"]) for r in rows]
    return dict(mean_files=sum(files) / len(rows), max_files=max(files),
                mean_functions=sum(funcs) / len(rows), max_functions=max(funcs))  # fmt: skip


def levels_text(rows: list[dict[str, Any]], detail: bool = False) -> str:
    lines = ["call | levels | files on path | launches | files touched | functions run | path"]
    for r in rows:
        kernels = ", ".join(r["launches"]) or "(none)"
        lines.append(
            f"{r['call']} | {r['levels']} | {len(r['files'])} | {len(r['launches'])}: {kernels} | "
            f"{len(r['touched'])} | {len(r['functions'])} | {' -> '.join(r['path'])}"
        )
        if detail:
            lines += [f"    {f}" for f in r["functions"]]
    sampler = sampler_rows(rows)
    if sampler:
        m = per_call(sampler)
        lines.append(
            f"sampler entries ({len(sampler)}): mean files touched {m['mean_files']:.1f} (max {m['max_files']}), "
            f"mean functions run {m['mean_functions']:.1f} (max {m['max_functions']}); "
            f"targets: mean files <= {FILES_TARGET}, functions <= {FUNCTIONS_TARGET} per call"
        )
    return "\n".join(lines)


# -- launches -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def planned_gpu(recorded: list[Any], num_sms: int = 132) -> Iterator[None]:
    """Calls inside plan their launches as for a ``num_sms`` GPU and record them in ``recorded``."""
    from spec_samplers.kernels import backend

    with backend.planned_for(backend.LaunchConfig(num_sms=num_sms, kernels=True, launches=recorded)):
        yield


def count_launches(call: Call) -> dict[str, Any]:
    """The launches of ``call``'s second run (the first may move a sampler's counters) on its CPU
    tensors planned as for a 132-SM GPU: Triton launches (recorded) and eager ops, host syncs. Under
    a FakeTensorMode: the recorded launches do not run, so no op may read what they would have
    written."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from spec_samplers.bench.cost.trace import OpCounter

    recorded: list[Any] = []
    counter = OpCounter()
    with FakeTensorMode(allow_non_fake_inputs=True), planned_gpu(recorded):
        call.fn(*call.args, **call.kwargs)
        recorded.clear()
        with counter:
            call.fn(*call.args, **call.kwargs)
    triton = [getattr(launch, "name", "") or type(launch).__name__ for launch in recorded]
    eager = sum(counter.eager.values())
    return dict(call=call.name, entry=call.entry, launches=len(triton) + eager, triton=triton, eager=eager,
                eager_ops=dict(sorted(counter.eager.items())), syncs=len(counter.syncs))  # fmt: skip


def host_us(call: Call, repeat: int) -> float:
    """Median host microseconds of ``call`` on its real CPU tensors with its launches recorded, not
    run (planned as for a 132-SM GPU; eager ops run on the CPU), after 3 warm-up calls."""
    recorded: list[Any] = []
    times = []
    with planned_gpu(recorded):
        for i in range(3 + repeat):
            recorded.clear()
            t0 = time.perf_counter()
            call.fn(*call.args, **call.kwargs)
            if i >= 3:
                times.append(time.perf_counter() - t0)
    return round(sorted(times)[len(times) // 2] * 1e6, 1)


def measure_launches(calls: list[Call] | None = None, repeat: int = 0) -> list[dict[str, Any]]:
    rows = []
    calls = entry_calls() if calls is None else calls
    # timed on fresh calls: a counted call's sampler may hold fake tensors (its first call's)
    fresh = {c.name: c for c in entry_calls()} if repeat else {}
    for call in calls:
        try:
            rows.append(count_launches(call))
        except Exception as e:  # a host read of data (a sync) fails on fake tensors: recorded
            rows.append(dict(call=call.name, entry=call.entry, error=f"{type(e).__name__}: {str(e)[:120]}"))
            continue
        if repeat:
            try:
                rows[-1]["host_us"] = host_us(fresh.get(call.name, call), repeat)
            except Exception:  # an eager op that reads what a recorded launch did not write (tree entries)
                rows[-1]["host_us"] = None
    return rows


def launches_text(rows: list[dict[str, Any]]) -> str:
    lines = ["call | launches (triton + eager) | syncs | host us | triton | eager ops"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['call']} | (error: {r['error']})")
            continue
        lines.append(
            f"{r['call']} | {r['launches']} ({len(r['triton'])} + {r['eager']}) | {r['syncs']} | "
            f"{r.get('host_us', '')} | {', '.join(r['triton'])} | {r['eager_ops']}"
        )
    return "\n".join(lines)


# -- params -------------------------------------------------------------------------------------------


def param_counts(package_dir: Path = PKG_DIR) -> list[dict[str, Any]]:
    """Every function's parameter count (self / cls included; *args and **kwargs count 1 each), and
    the count without self / cls (``without_self``)."""
    rows = []
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))

        def visit(node: ast.AST, prefix: str, rel: str = os.path.relpath(path, package_dir.parent)) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = child.args
                    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
                    n += (a.vararg is not None) + (a.kwarg is not None)
                    name = f"{prefix}{child.name}"
                    first = (a.posonlyargs + a.args)[:1]
                    bound = bool(first) and first[0].arg in ("self", "cls")
                    rows.append(dict(name=name, file=rel, line=child.lineno, params=n, without_self=n - bound))
                    visit(child, f"{name}.<locals>.")
                elif isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                else:
                    visit(child, prefix)

        visit(tree, "")
    rows.sort(key=lambda r: (-r["params"], r["file"], r["line"]))
    return rows


# -- duplicates ---------------------------------------------------------------------------------------


def duplicates(package_dir: Path = PKG_DIR) -> dict[str, Any]:
    """``duplicates --most 200`` over the package directory (git-tracked files there)."""
    cmd = ["duplicates", "--repo", str(package_dir), "--most", "200", "--seconds", "120"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    lines = [line for line in out.splitlines() if line.strip()]
    pairs = [line.strip() for line in lines if line.strip().startswith("D") and "~" in line]
    return dict(command=" ".join(cmd[:1] + cmd[3:]) + " (in spec_samplers/)", header=lines[:1], pairs=pairs,
                count=len(pairs), other=[line for line in lines[1:] if line.strip() not in pairs])  # fmt: skip


# -- signatures ---------------------------------------------------------------------------------------

_MODULES = (
    "spec_samplers.sampling",
    "spec_samplers.logits_processor",
    "spec_samplers.tree",
    "spec_samplers.decoding",
)


def _public_names(module: Any) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and (inspect.isclass(v) or inspect.isfunction(v))
        and getattr(v, "__module__", None) == module.__name__
    ]


def _sig(obj: Any) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "<no signature>"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)  # a default's repr names its address: not a difference


def _members(cls: type, prefix: str, out: dict[str, str]) -> None:
    for name, value in inspect.getmembers(cls):
        if name.startswith("_") and name not in ("__init__", "__call__"):
            continue
        raw = inspect.getattr_static(cls, name, None)
        if isinstance(raw, property):
            out[f"{prefix}.{name}"] = "property" + ("" if raw.fget is None else " " + _sig(raw.fget))
        elif isinstance(raw, (staticmethod, classmethod)) or inspect.isfunction(value) or inspect.ismethod(value):
            if name in ("__init__", "__call__") and getattr(value, "__module__", "").startswith("torch"):
                continue
            if not getattr(value, "__module__", "").startswith("spec_samplers"):
                continue  # inherited from torch.nn.Module, NamedTuple...: not ours
            out[f"{prefix}.{name}"] = _sig(value)
        elif not callable(value) and not inspect.isclass(value) and name in vars(cls).keys() | _declared(cls):
            # declarations (lossless, kernel_op...): their values, so that a changed one shows
            plain = value is None or isinstance(value, (bool, int, float, str))
            out[f"{prefix}.{name}"] = f"= {value!r}" if plain else f"<{type(value).__name__}>"


def _declared(cls: type) -> set[str]:
    """Names the package's classes in ``cls``'s MRO define (not torch.nn.Module's)."""
    return {n for k in cls.__mro__ if k.__module__.startswith("spec_samplers") for n in vars(k)}


def signatures() -> dict[str, str]:
    """{qualified name: signature}: spec_samplers.__all__, the public names of the public
    subpackages and of spec_samplers.integrations.* (where importable), and every public method or
    property of their public classes."""
    out: dict[str, str] = {}
    modules = [("spec_samplers", spec_samplers, list(spec_samplers.__all__))]
    for name in _MODULES:
        module = importlib.import_module(name)
        modules.append((name, module, _public_names(module)))
    import spec_samplers.integrations as integrations

    for info in pkgutil.walk_packages(integrations.__path__, "spec_samplers.integrations.", onerror=lambda _: None):
        if info.name.rsplit(".", 1)[-1].startswith("_"):
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception as e:  # an engine that is not installed
            out[info.name] = f"<not importable: {type(e).__name__}>"
            continue
        modules.append((info.name, module, _public_names(module)))
    for module_name, module, names in modules:
        for name in names:
            value = getattr(module, name)
            key = f"{module_name}.{name}"
            if inspect.isclass(value):
                out[key] = "class" + _sig(value)
                _members(value, key, out)
            elif callable(value):
                out[key] = _sig(value)
            else:
                out[key] = f"<{type(value).__name__}>"
    return dict(sorted(out.items()))


# -- corpus -------------------------------------------------------------------------------------------


def corpus() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend in ("torch", "triton"):
        for call in corpus_calls(backend):
            try:
                out[f"{backend}:{call.name}"] = _tokens(call.fn(*call.args, **call.kwargs))
            except Exception as e:  # recorded, so that a diff shows it
                out[f"{backend}:{call.name}"] = f"<error {type(e).__name__}: {e}>"
    return dict(sorted(out.items()))


def kernel_vs_reference(data: dict[str, Any]) -> list[str]:
    """The corpus entries whose torch and triton tokens differ."""
    names = {key.split(":", 1)[1] for key in data}
    return sorted(n for n in names if data.get(f"torch:{n}") != data.get(f"triton:{n}"))


# -- diff ---------------------------------------------------------------------------------------------


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    lines = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            lines.append(f"- {key}: {json.dumps(a[key])}")
        elif key not in a:
            lines.append(f"+ {key}: {json.dumps(b[key])}")
        elif a[key] != b[key]:
            lines.append(f"~ {key}: {json.dumps(a[key])} -> {json.dumps(b[key])}")
    return lines


# -- report -------------------------------------------------------------------------------------------


def _commit() -> str:
    try:
        cmd = ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


_R = "benchmarks/results/2026-11-28-direct-path"
COMMANDS = "\n".join(
    [
        f"PYTHONPATH=$PWD python tools/direct_path.py report --out {_R}-{{label}} --label {{label}}",
        f"python tools/direct_path.py diff {_R}-before-signatures.json {_R}-{{label}}-signatures.json",
        f"python tools/direct_path.py diff {_R}-before-corpus.json {_R}-{{label}}-corpus.json",
    ]
)


def report(prefix: str, label: str) -> None:
    t0 = time.perf_counter()
    levels = measure_levels()
    t_levels = time.perf_counter() - t0
    params = param_counts()
    dups = duplicates()
    sigs = signatures()
    t1 = time.perf_counter()
    tokens = corpus()
    t_corpus = time.perf_counter() - t1
    mismatched = kernel_vs_reference(tokens)
    Path(f"{prefix}-signatures.json").write_text(json.dumps(sigs, indent=1, sort_keys=True) + "\n")
    Path(f"{prefix}-corpus.json").write_text(json.dumps(tokens, sort_keys=True) + "\n")
    meta = dict(
        label=label,
        commit=_commit(),
        python=sys.version.split()[0],
        torch=torch.__version__,
        triton=importlib.import_module("triton").__version__,
        how=(
            "measured: CPU, TRITON_INTERPRET=1, backend='triton', B=2 k=3 V=64; stacks caught with "
            "sys.setprofile at triton's InterpretedFunction.run (structure, not timing)"
        ),
        seconds=dict(levels=round(t_levels, 1), corpus=round(t_corpus, 1)),
    )
    data = dict(
        meta=meta,
        levels=levels,
        params_top15=params[:15],
        params_note="self/cls included (without_self: not); *args and **kwargs count 1 each",
        duplicates=dups,
        signatures=dict(count=len(sigs), file=f"{prefix}-signatures.json"),
        corpus=dict(entries=len(tokens), file=f"{prefix}-corpus.json", torch_vs_triton_differ=mismatched),
    )
    Path(f"{prefix}.json").write_text(json.dumps(data, indent=1) + "\n")
    md = [
        f"# Direct path, {label} ({meta['commit']})",
        "",
        "This file: `" + COMMANDS.format(label=label).splitlines()[0] + "`.",
        "",
        "The after side, from the checkout root (each diff prints nothing when identical):",
        "",
        "```",
        COMMANDS.format(label="after"),
        "```",
        "",
        f"How: {meta['how']}. Python {meta['python']}, torch {meta['torch']}, triton {meta['triton']}.",
        "Levels: spec_samplers frames on the stack at the launch, from the public entry (included) to the "
        "frame that calls `kernel[grid](...)`; the max over the call's launches. Files: the distinct files "
        "on that path. Touched: the package files whose functions ran during the call.",
        "",
        "## Levels per entry",
        "",
        "| call | levels | files on path | launches | files touched | path (deepest launch) |",
        "| --- | ---: | ---: | --- | ---: | --- |",
    ]
    for r in levels:
        kernels = ", ".join(r["launches"]) or "(none)"
        md.append(
            f"| {r['call']} | {r['levels']} | {len(r['files'])} | {len(r['launches'])}: {kernels} | "
            f"{len(r['touched'])} | {' → '.join(r['path'])} |"
        )
    md += ["", "## Largest parameter counts (" + data["params_note"] + ")", ""]
    md += ["| function | file | params | without self |", "| --- | --- | ---: | ---: |"]
    md += [f"| {p['name']} | {p['file']}:{p['line']} | {p['params']} | {p['without_self']} |" for p in params[:15]]
    md += ["", f"## Duplicate pairs: {dups['count']} (`{dups['command']}`)", "", "```"]
    md += dups["header"] + dups["pairs"] + dups["other"] + ["```", ""]
    md += [
        f"## Signatures: {len(sigs)} public names and members (`{Path(prefix).name}-signatures.json`)",
        "",
        f"## Token corpus: {len(tokens)} entries (`{Path(prefix).name}-corpus.json`)",
        "",
        "torch vs triton (interpreted) differ on: " + (", ".join(mismatched) or "none"),
        "",
    ]
    Path(f"{prefix}.md").write_text("\n".join(md))


# -- command line -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_warnings() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's masked lanes (pyproject.toml)
        yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("levels", "params", "dups", "launches"):
        sub.add_parser(name).add_argument("--json", help="also write the rows to this file")
    sub.choices["levels"].add_argument("--detail", action="store_true", help="list each call's functions")
    sub.choices["levels"].add_argument("--call", action="append", help="only this call (repeatable)")
    sub.choices["launches"].add_argument("--time", type=int, default=0, help="median host us over N more calls")
    sub.add_parser("signatures").add_argument("--out", required=True)
    sub.add_parser("corpus").add_argument("--out", required=True)
    d = sub.add_parser("diff")
    d.add_argument("a")
    d.add_argument("b")
    r = sub.add_parser("report")
    r.add_argument("--out", required=True, help="prefix of the .json, .md, -signatures.json, -corpus.json files")
    r.add_argument("--label", default="after")
    args = parser.parse_args(argv)
    with _quiet_warnings():
        if args.cmd == "levels":
            names = set(args.call or ())
            rows: Any = measure_levels([c for c in level_calls() if c.name in names] if names else None)
            print(levels_text(rows, detail=args.detail))
        elif args.cmd == "launches":
            rows = measure_launches(repeat=args.time)
            print(launches_text(rows))
        elif args.cmd == "params":
            rows = param_counts()
            for p in rows[:15]:
                print(f"{p['params']:3d} ({p['without_self']:2d})  {p['name']}  ({p['file']}:{p['line']})")
            print("(self/cls included, in parentheses without; *args and **kwargs count 1 each)")
        elif args.cmd == "dups":
            rows = duplicates()
            print("\n".join(rows["header"] + rows["pairs"] + rows["other"]))
        elif args.cmd == "signatures":
            Path(args.out).write_text(json.dumps(signatures(), indent=1, sort_keys=True) + "\n")
        elif args.cmd == "corpus":
            Path(args.out).write_text(json.dumps(corpus(), sort_keys=True) + "\n")
        elif args.cmd == "diff":
            a, b = (json.loads(Path(p).read_text()) for p in (args.a, args.b))
            lines = diff(a, b)
            print("\n".join(lines)) if lines else None
            return 1 if lines else 0
        elif args.cmd == "report":
            report(args.out, args.label)
        if args.cmd in ("levels", "params", "dups", "launches") and args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
