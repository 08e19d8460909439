"""Throughput of the counter RNG (Philox4x32-10, ``spec_samplers.rng``), the cost the recovery pass
pays once per vocabulary element: ``pytest benchmarks/test_rng.py --benchmark-only``.

Implementations, on N = 64 rows x V = 32000 vocabulary elements (quick mode: 4 x 2048):

* ``words_eager``: ``rng.random_words`` as separate int64 tensor ops (N * V / 2 Philox calls,
  4 words each: the words of the race);
* ``two_level``: ``rng.recovery_race``, the two-level race the PyTorch sampler path runs (fp64
  group sums, one Philox evaluation of ~V/512 + 128 blocks per row, one group re-read; eager ops,
  no compilation);
* ``race_triton`` (CUDA only): a kernel that generates the exponentials of every element and
  folds them into one number per row, i.e. what the single-level race of 0.2 cost per element
  (the kernels no longer pay it: their vocabulary pass draws no random number).

extra_info: words/s (2 words per element), elements/s, ns per element, and ``bf16_floor_gbps``:
the bandwidth at which the sampler's recovery pass (q and p rows at bf16: 4 bytes per element)
would deliver elements as fast as the generator makes them; the pass stays memory-bound while
this exceeds the device's bandwidth (3.35 TB/s on H100 SXM, 4.8 TB/s on H200).
"""

from __future__ import annotations

import pytest
import torch

from spec_samplers import rng
from spec_samplers.bench import timing
from spec_samplers.bench.suite import bench_device, quick_mode

IMPLS = ["words_eager", "two_level", "race_triton"]


def _race_triton(weights: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor, positions: torch.Tensor):
    import triton
    import triton.language as tl

    from spec_samplers.kernels.rng import exponential_from_words, random_words

    @triton.jit
    def kernel(seed_ptr, offset_ptr, pos_ptr, out_ptr, V, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        seed = tl.load(seed_ptr + r)
        offset = tl.load(offset_ptr + r)
        pos = tl.load(pos_ptr + r).to(tl.int64)
        acc = tl.zeros([BLOCK], tl.float32)
        for s in range(0, V, BLOCK):
            w0, w1, w2, w3 = random_words(seed, offset, (pos << 32) + s // 2 + tl.arange(0, BLOCK // 2), 1)
            e = tl.interleave(exponential_from_words(w0, w1, True), exponential_from_words(w2, w3, True))
            acc = tl.maximum(acc, tl.where(s + tl.arange(0, BLOCK) < V, 1.0 / e, 0.0))
        tl.store(out_ptr + r, tl.max(acc, axis=0))

    out = torch.empty(weights.shape[0], dtype=torch.float32, device=weights.device)
    return lambda: kernel[(weights.shape[0],)](seeds, offsets, positions, out, weights.shape[1], BLOCK=1024)


@pytest.mark.parametrize("impl", IMPLS)
def test_rng_throughput(benchmark, impl):
    device = bench_device()
    N, V = (4, 2048) if quick_mode() else (64, 32000)
    g = torch.Generator().manual_seed(0)
    weights = torch.softmax(torch.randn(N, V, generator=g), -1).to(device)
    seeds = torch.randint(0, rng.SEED_HIGH, (N,), generator=g).to(device)
    offsets = torch.zeros(N, dtype=torch.int64, device=device)
    positions = torch.zeros(N, dtype=torch.int64, device=device)
    if impl == "words_eager":
        counter = (positions[:, None] << 32) + torch.arange((V + 1) // 2, device=device)[None, :]
        call = lambda: rng.random_words(seeds[:, None], offsets[:, None], counter, rng.STREAM_RECOVER)  # noqa: E731
    elif impl == "two_level":
        call = lambda: rng.recovery_race(weights, seeds, offsets, positions)  # noqa: E731
    else:
        if device.type != "cuda":
            pytest.skip("Triton kernels are timed on a CUDA GPU only")
        call = _race_triton(weights, seeds, offsets, positions)
    call()  # compiles the Triton kernel once, outside the timing

    def body():
        result = call()
        timing.synchronize(device)
        return result

    benchmark.group = f"rng N={N} V={V}"
    benchmark(body)
    stats = getattr(benchmark, "stats", None)
    info: dict[str, object] = {
        "device": str(device),
        "elements": N * V,
        "words": 2 * N * V,
    }
    if stats is not None:  # None under --benchmark-disable
        t = stats.stats.median
        info.update(
            elements_per_s=N * V / t,
            words_per_s=2 * N * V / t,
            ns_per_element=t / (N * V) * 1e9,
            bf16_floor_gbps=4 * N * V / t / 1e9,
        )
    benchmark.extra_info.update(info)
