"""Compile every reachable kernel variant for sm_90 without a GPU (Triton frontend, LLVM, PTX, the
bundled ptxas), catching what the interpreter cannot: compiled-mode typing, libdevice calls, i1
pointers, None pointers.

"Reachable" is read off the launchers themselves: for every combination of input kinds a caller
can pass (padded/ragged, draft probabilities or point-mass drafts, offsets or not, greedy mask or
not, probabilities or logits, ragged logits drafts indexed by ``draft_rows`` or not), the
launchers plan their launches on meta tensors, and each distinct (kernel, argument types,
constexpr values) is compiled once. Block sizes use one representative value each (they do not
change which code is generated, only its widths).

Run as a script with TRITON_INTERPRET unset (tests/test_kernels_compile.py does that). The
variants compile in parallel, one process per usable core (``compile_all``; ``COMPILE_JOBS=1``
compiles in this process alone). ``COMPILE_COVER=1`` compiles a cover instead (:func:`cover`): CI
compiles every variant on vLLM's Triton and the cover on the newest."""

import dataclasses
import itertools
import os
import subprocess
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from spec_samplers.kernels.backend import plan_vocab_split  # noqa: E402
from spec_samplers.kernels.verify_launch import BLOCK, REJECTION, plan_typical, plan_verify  # noqa: E402
from spec_samplers.layout import VerifyBatch  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
META = torch.device("meta")
TYPES = {
    torch.int8: "i8",
    torch.float64: "fp64",
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "i1",
}


def batches():
    B, K, V = 4, 3, 5000
    for ragged, draft, offsets, greedy, logits, filtered, dtype in itertools.product(
        (False, True),
        (False, True),
        (False, True),
        (False, True),
        (False, True),
        (False, True),
        (torch.bfloat16, torch.float32),
    ):
        if logits and greedy:
            continue  # logits inputs derive greedy rows from T == 0
        if filtered and not logits:
            continue  # SamplingParams filters come with logits
        f = dict(dtype=dtype, device=META)
        i64 = dict(dtype=torch.int64, device=META)
        seeds = torch.empty(B, **i64)
        extra = dict(seeds=seeds, offsets=torch.empty(B, **i64) if offsets else None)
        if greedy:
            extra["is_greedy"] = torch.empty(B, dtype=torch.bool, device=META)
        if logits:
            extra["temperature"] = torch.empty(B, device=META)
        if filtered:
            extra.update(
                top_k=torch.empty(B, **i64), top_p=torch.empty(B, device=META), min_p=torch.empty(B, device=META)
            )
        bonus = torch.empty(B, 1, **i64)
        if ragged:
            T = 7
            yield VerifyBatch.ragged(
                torch.empty(T, V, **f),
                bonus,
                torch.empty(T, V, **f) if draft else None,
                torch.empty(T, **i64),
                torch.empty(B, **i64),
                K,
                **extra,
            )
            if draft and logits and not filtered:
                # the drafter's rows indexed in an [N, V] matrix (draft_rows), at their own T
                yield VerifyBatch.ragged(
                    torch.empty(T, V, **f),
                    bonus,
                    torch.empty(11, V, **f),
                    torch.empty(T, **i64),
                    torch.empty(B, **i64),
                    K,
                    **extra,
                    draft_rows=torch.empty(T, **i64),
                    draft_temperature=torch.empty(B, device=META),
                )
                # the drafter's probabilities (draft_probs=), indexed and as [T, V] rows
                for rows, n in ((torch.empty(T, **i64), 11), (None, T)):
                    yield VerifyBatch.ragged(
                        torch.empty(T, V, **f),
                        bonus,
                        torch.empty(n, V, device=META),
                        torch.empty(T, **i64),
                        torch.empty(B, **i64),
                        K,
                        **extra,
                        draft_rows=rows,
                        draft_is_probs=True,
                    )
        else:
            yield VerifyBatch.padded(
                torch.empty(B, K + 1, V, **f),
                bonus,
                torch.empty(B, K, V, **f) if draft else None,
                torch.empty(B, K, **i64),
                **extra,
            )


def with_counters(plain):
    """Each batch as given (the plans' uncounted variant), and the first of each layout and draft
    kind also with a sampler's acceptance counters (``VerifyBatch.counters``: the finishing
    kernels add to them; the counting code reads no other flag, so one variant each compiles it)."""
    counted = set()
    for batch in plain:
        yield batch
        kind = (batch.layout.ragged, batch.draft is None, batch.target_kind)
        if kind not in counted:
            counted.add(kind)
            counters = torch.empty(2 + batch.layout.max_drafts, dtype=torch.int64, device=META)
            yield dataclasses.replace(batch, counters=counters)


def arg_type(value, path, consts):
    """Signature type of one argument at ``path`` (tuples nest; None entries become constexprs).
    A NamedTuple argument (spec_samplers.kernels.abi) keeps its class, ``Rows("*fp32", "i32",
    ...)``: the kernels read its fields by name, which compiles only when the signature carries
    the names, so a field a kernel reads and the plan does not pack fails to compile here."""
    if isinstance(value, tuple):
        types = [arg_type(v, path + (k,), consts) for k, v in enumerate(value)]
        return type(value)(*types) if hasattr(value, "_fields") else tuple(types)
    if value is None:
        consts[path] = None
        return "constexpr"
    if isinstance(value, torch.Tensor):
        return "*" + TYPES[value.dtype]
    if isinstance(value, float):
        return "fp32"
    if isinstance(value, int):
        return "i64" if abs(value) >= 2**31 else "i32"
    raise TypeError(f"{path}: {type(value)}")


def signature(kernel, args):
    fn = getattr(kernel, "fn", kernel)
    names = kernel.arg_names
    constexpr_index = set(kernel.constexprs)
    sig, consts = {}, {}
    for i, name in enumerate(names):
        if i in constexpr_index:
            sig[name] = "constexpr"
            consts[(i,)] = args[name]
        else:
            try:
                sig[name] = arg_type(args[name], (i,), consts)
            except TypeError as e:
                raise TypeError(f"{fn.__name__}.{name}: {e}") from None
    return sig, consts


def main():
    seen = set()
    variants = []  # (kernel, signature, constexprs, options), each distinct one once
    for batch in with_counters(batches()):
        split = plan_vocab_split(batch.layout.vocab_size, batch.layout.batch_size, 8, 1024)
        launches = plan_verify(batch, REJECTION, split)[0] + plan_verify(batch, BLOCK, split)[0]
        if batch.draft is None and batch.is_greedy is None:  # typical ignores drafts, seeds, greedy masks
            launches += plan_typical(batch, 0.09, 0.3, split)[0]
        for launch in launches:
            sig, consts = signature(launch.kernel, launch.args)
            key = (
                launch.name,
                tuple(sorted(sig.items())),
                tuple(sorted((k[0], repr(v)) for k, v in consts.items())),
                tuple(sorted(launch.options.items())),
            )
            if key in seen:
                continue
            seen.add(key)
            variants.append((launch.kernel, sig, consts, launch.options))
    for launch in bonus_row_launches():
        sig, consts = signature(launch.kernel, launch.args)
        seen.add((launch.name, tuple(sorted(sig.items()))))
        variants.append((launch.kernel, sig, consts, None))
    for launch in multipath_launches():
        sig, consts = signature(launch.kernel, launch.args)
        seen.add((launch.name, tuple(sorted(sig.items()))))
        variants.append((launch.kernel, sig, consts, launch.options))
    compile_all(variants)
    print(f"compiled all kernel variants for sm_90: {len(seen)} variants")


#: set in the helper processes of compile_all: "i/n", this process compiles variants i, i + n, ...
SHARD = "SPEC_SAMPLERS_COMPILE_SHARD"


def compile_all(variants: list) -> None:
    """Compile every (kernel, signature, constexprs, options) in ``variants`` for TARGET, split
    across the usable cores (``COMPILE_JOBS`` overrides their number): n - 1 copies of the running
    script, started with the same arguments and SHARD="i/n", each take every n-th variant from
    the i-th and this process the rest. The scripts list their variants deterministically (the
    same code on the same inputs), so the shards are disjoint and together cover the list; a
    failing helper's traceback reaches stderr and fails the check. Each variant costs about 3 s
    of CPU (Triton's frontend and MLIR passes, LLVM, ptxas), a few hundred of them in all."""
    if os.environ.get("COMPILE_COVER") == "1":
        variants = cover(variants)
    shard = os.environ.get(SHARD)
    if shard is None:
        jobs = int(os.environ.get("COMPILE_JOBS") or len(os.sched_getaffinity(0)))
        jobs = max(1, min(jobs, len(variants)))
        env = dict(os.environ)
        helpers = []
        try:
            for i in range(1, jobs):
                env[SHARD] = f"{i}/{jobs}"
                helpers.append(subprocess.Popen([sys.executable, *sys.argv], env=env, stdout=subprocess.DEVNULL))
            _compile(variants[0::jobs])
        except BaseException:
            for p in helpers:
                p.kill()
            raise
        failed = [p.args for p in helpers if p.wait() != 0]
        if failed:
            raise SystemExit(f"compile helpers failed (their tracebacks are above): {len(failed)} of {jobs - 1}")
    else:
        i, n = map(int, shard.split("/"))
        _compile(variants[i::n])


def cover(variants: list) -> list:
    """The variants, in order, that each bring a (kernel, argument type), (kernel, constexpr
    value) or (kernel, option value) not brought by an earlier one: every type, constexpr value
    and option of every kernel compiled at least once (a third of the full list), where the full
    list compiles every combination. A second Triton version differs from the first in what its
    frontend and passes accept, which each value reaches on its own; the combinations (register
    pressure, spills) are checked on the first. Deterministic, so the shards agree."""
    seen: set = set()
    kept = []
    for kernel, sig, consts, options in variants:
        name = getattr(kernel, "__name__", None) or kernel.fn.__name__
        brings = {(name, "arg", p, str(t)) for p, t in sig.items()}
        brings |= {(name, "constexpr", str(p), repr(v)) for p, v in consts.items()}
        brings |= {(name, "option", o, repr(v)) for o, v in (options or {}).items()}
        if not brings <= seen:
            seen |= brings
            kept.append((kernel, sig, consts, options))
    print(f"COMPILE_COVER=1: a cover of {len(kept)} of the {len(variants)} variants", flush=True)
    return kept


def _compile(variants: list) -> None:
    for kernel, sig, consts, options in variants:
        triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts), target=TARGET, options=options or None)


def multipath_launches():
    """The GBV kernels (spec_samplers.kernels.multipath_kernels) as their launcher plans them:
    fp32 / bf16 / fp16 rows, probabilities or logits (read through the softmax rule), padded
    (int64 ids, one parents row for the batch) or ragged (int32 ids and spans, no offsets),
    greedy mask or not, counters or not, the request filters (logits rows read through the cuts,
    which the pick writes: with a greedy mask and without)."""
    from spec_samplers.kernels.multipath_launch import plan_multipath
    from spec_samplers.layout import TreeCall

    B, K, L, V = 4, 3, 4, 5000
    N = K * L
    # (dtype, logits, ragged, greedy mask, counters, filters): each input kind in one variant at least
    variants = [(torch.float32, False, False, False, True, False), (torch.bfloat16, True, False, True, True, False)]
    variants += [(torch.float16, False, True, True, False, False), (torch.bfloat16, True, True, False, True, True)]
    variants += [(torch.float32, True, False, True, False, True)]
    for dtype, logits, ragged, greedy, counts, filters in variants:
        ids = dict(dtype=torch.int32 if ragged else torch.int64, device=META)
        T = B * N
        rows = torch.empty(T + B if ragged else B * (N + 1), V, dtype=dtype, device=META)
        call = TreeCall(
            rows, rows, torch.empty(T, **ids) if ragged else torch.empty(B, N, **ids),
            torch.empty(T if ragged else N, **ids), torch.empty(B, **ids) if ragged else None, B, N, L,
            "independent", torch.empty(B, dtype=torch.bool, device=META) if greedy else None,
            torch.empty(B, device=META) if logits else None, torch.empty(B, dtype=torch.int64, device=META),
            None if ragged else torch.empty(B, dtype=torch.int64, device=META),
            torch.empty(2 + L, dtype=torch.int64, device=META) if counts else None,
        )  # fmt: skip
        if filters:
            f32 = torch.empty(B, device=META)
            top_k = torch.empty(B, dtype=torch.int64, device=META)
            call = dataclasses.replace(call, filters=dict(top_k=top_k, top_p=f32, min_p=f32))
        pick, verify, keys, _ = plan_multipath(call)
        verify.args["order_ptr"] = torch.empty(keys.shape, dtype=torch.int64, device=META)
        yield pick
        yield verify


def bonus_row_launches():
    """The kernels around the seams' bonus-row verification (spec_samplers.bonus_rows): the
    bonus-row inputs with and without the seam's checks, the V1 step's inputs and the tail, with
    int32 / int64 indices, with and without a drafter cache (draft rows), int64 in place or int32
    tokens, with and without counts."""
    from spec_samplers.kernels.backend import LaunchConfig
    from spec_samplers.kernels.bonus_row_kernels import chunk_outputs_triton, plan_bonus_row_inputs, step_inputs_triton

    R, L = 4, 20
    for dtype, cache, checked in itertools.product((torch.int32, torch.int64), (True, False), (True, False)):
        i = dict(dtype=dtype, device=META)
        rows = (torch.empty(L, **i), torch.empty(L, **i)) if cache else (None, None)
        args = (torch.empty(R + 1, **i), torch.empty(R, **i), torch.empty(8, device=META))
        args += (torch.empty(8, dtype=torch.int64, device=META), torch.empty(L, dtype=torch.int64, device=META))
        yield from plan_bonus_row_inputs(*args, torch.empty(L, **i), *rows, L, 5, 5, checked=checked)[0]
    recorded: list = []
    config = LaunchConfig(launches=recorded)
    for dtype, draft_rows in itertools.product((torch.int32, torch.int64), (True, False)):
        step_inputs_triton(
            torch.empty(R, dtype=dtype, device=META),
            torch.empty(L, dtype=dtype, device=META),
            L + R,
            5,
            draft_rows,
            config,
        )
    ok = torch.empty(R, dtype=torch.bool, device=META)
    for dtype, counts in itertools.product((torch.int32, torch.int64), (True, False)):
        chunk_outputs_triton(torch.empty(R, 7, dtype=torch.int64, device=META), ok, 6, config, dtype, counts)
    yield from recorded


if __name__ == "__main__":
    main()
