"""Compile every reachable variant of the sampling kernels for sm_90 without a GPU (as
tests/kernel_compile_check.py does for the verification kernels).

The launchers of spec_samplers.kernels.sampling_launch run on meta tensors with
``config=LaunchConfig(launches=[...])``: they record their launches instead of running them (their
torch glue runs on meta tensors too),
for every input kind a caller can reach (probabilities or logits, each filter combination, the
renorm / mask / softmax outputs, fp32 and bf16); each distinct (kernel, argument types,
constexpr values) is compiled once.

Run as a script with TRITON_INTERPRET unset (tests/test_sampling_kernels.py does that)."""

import itertools
import os

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from kernel_compile_check import compile_all, signature  # noqa: E402

from spec_samplers.kernels import sampling_launch as sl  # noqa: E402
from spec_samplers.kernels.backend import LaunchConfig, plan_vocab_split  # noqa: E402

META = torch.device("meta")


def record_launches() -> list:
    recorded: list = []
    config = LaunchConfig(launches=recorded)  # record, do not launch
    B, V = 4, 5000
    split = plan_vocab_split(V, B, 8, 1024)
    i64 = dict(dtype=torch.int64, device=META)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.empty(B, V, dtype=dtype, device=META)
        rows, seeds = torch.empty(B, **i64), torch.empty(B, **i64)
        k, p = torch.empty(B, **i64), torch.empty(B, device=META)
        for logits, use_k, use_p, use_m, joint, long, indexed in itertools.product((False, True), repeat=7):
            if joint and not (use_k and use_p):
                continue
            sl.sample_triton(
                x=x,
                rows=rows if indexed else None,  # (None: output b samples row b)
                seeds=seeds,
                offsets=seeds,
                logits=logits,
                top_k=k if use_k else None,
                top_p=p if use_p else None,
                min_p=p if use_m else None,
                joint=joint,
                split=split,
                out_dtype=torch.int64 if long else torch.int32,  # the tokens' dtype
                config=config,
            )
        # the forms callers give: Python scalars, parameter tensors of other dtypes, int32 rows,
        # one seed for the batch (derived in the kernel) with a scalar or per-row offsets
        scalars = dict(top_k=5, top_p=0.9, min_p=0.1)
        tensors = dict(top_k=torch.empty(B, dtype=torch.float32, device=META), top_p=k, min_p=k)
        randomness = [
            dict(seeds=7, offsets=0, derive=True),
            dict(seeds=torch.empty(1, **i64), offsets=seeds, derive=True),
            dict(seeds=torch.empty(B, dtype=torch.int32, device=META), offsets=2**40),
        ]
        for params, rnd in itertools.product((scalars, tensors), randomness):
            indices = torch.empty(B, dtype=torch.int32, device=META)
            sl.sample_triton(x=x, rows=indices, **rnd, **params, split=split, out_dtype=torch.int32, config=config)
        for out_dtype in (torch.float32, dtype):
            sl.renorm_triton(probs=x, top_k=k, out_dtype=out_dtype, split=split, config=config)
            sl.renorm_triton(probs=x, top_p=p, out_dtype=out_dtype, split=split, config=config)
            sl.renorm_triton(probs=x, top_k=5, out_dtype=out_dtype, split=split, config=config)
            sl.renorm_triton(probs=x, top_p=0.5, out_dtype=out_dtype, split=split, config=config)
        sl.mask_logits_triton(logits=x, top_k=k, split=split, config=config)
        sl.mask_logits_triton(logits=x, top_k=3, split=split, config=config)
        sl.softmax_triton(logits=x, temperature=p, split=split, config=config)
        sl.softmax_triton(logits=x, temperature=0.7, split=split, config=config)
        sl.softmax_triton(logits=x, temperature=rows, split=split, config=config)
    sl.row_seeds_triton(torch.empty(1, **i64), torch.empty(1, **i64), B, config=config)
    # chain_speculative_sampling: the rows' randomness in every form, then its counters after the rejection kernel
    i32 = dict(dtype=torch.int32, device=META)
    for rnd in (
        dict(seeds=7, offsets=3, derive=True),
        dict(seeds=torch.empty(1, **i64), offsets=torch.empty(B, **i64), derive=True),
        dict(seeds=torch.empty(B, **i32), offsets=5, derive=False),
    ):
        sl.request_seeds_triton(**rnd, num_rows=B, device=META, config=config)
    from spec_samplers.layout import VerifyBatch

    k = 3
    for dtype, seeds, offsets, counter in itertools.product(
        (torch.float32, torch.bfloat16),
        (torch.empty(B, **i64), torch.empty(B, **i32)),
        (None, torch.empty(B, **i64)),
        (torch.empty(B, **i32), torch.empty(B, **i64)),
    ):
        target = torch.empty(B, k + 1, V, dtype=dtype, device=META)
        draft = torch.empty(B, k, V, dtype=dtype, device=META)
        ids, bonus = torch.empty(B, k, **i64), torch.empty(B, 1, **i64)
        batch = VerifyBatch.padded(target, bonus, draft, ids, seeds=seeds, offsets=offsets)
        out = torch.empty(B, k + 1, **i64)
        for add in ((False, False), (True, True)):
            sl.chain_counts_triton(batch, out, counter, counter, add, config=config)
    return recorded


def main():
    seen = set()
    variants = []
    for launch in record_launches():
        sig, consts = signature(launch.kernel, launch.args)
        key = (launch.name, tuple(sorted(sig.items())), tuple(sorted((k[0], repr(v)) for k, v in consts.items())))
        if key in seen:
            continue
        seen.add(key)
        variants.append((launch.kernel, sig, consts, None))
    compile_all(variants)  # in parallel, one process per usable core
    print(f"compiled all sampling kernel variants for sm_90: {len(seen)} variants")


if __name__ == "__main__":
    main()
