"""Time per call of every verification implementation across B, k, V and dtype.

Implementations: each registered built-in sampler on its PyTorch path, and on its Triton kernel
path when the sampler has a ``backend`` option (``spec_samplers.kernels``); the baselines of
``spec_samplers.bench.baselines`` (vLLM V0's algorithm in PyTorch, vLLM V1's rejection sampler,
FlashInfer's chain_speculative_sampling). A baseline that cannot run on this machine is skipped
with the reason (they are CUDA-only), and the reasons go into the JSON (see conftest).

Timing: on CUDA the benchmarked body ends with torch.cuda.synchronize(), so pytest-benchmark's
host timer brackets finished device work; the CUDA-event median (``spec_samplers.bench.timing``)
is recorded too, as extra_info["cuda_event_time_s"]. extra_info also holds bytes, floor_bytes,
GB/s (bytes / median time), the call's acceptance, and the implementation's acceptance, theory
and output TV (with its noise floor) on a fixed quality workload.
"""

from __future__ import annotations

import os

import pytest
import torch

from spec_samplers.bench import baselines, quality, timing, workloads
from spec_samplers.bench.suite import DTYPES, bench_device, quick_mode
from spec_samplers.registry import get_sampler_class, sampler_options

SAMPLERS = ("rejection_sampler", "typical_acceptance_sampler")


def _sampler_impls() -> list[tuple[str, str, dict[str, object]]]:
    """(id, registry name, options): the torch path, plus the kernel path once it exists."""
    impls = []
    for name in SAMPLERS:
        if "backend" in sampler_options(get_sampler_class(name)):
            impls += [(f"{name}-torch", name, {"backend": "torch"}), (f"{name}-triton", name, {"backend": "triton"})]
        else:
            impls.append((f"{name}-torch", name, {}))
    return impls


IMPLEMENTATIONS = [(i, ("sampler", n, o)) for i, n, o in _sampler_impls()]
IMPLEMENTATIONS += [(name, ("baseline", name, {})) for name in baselines.BASELINES]


def _make_callable(kind: str, name: str, options: dict[str, object], device: torch.device):
    """A function of the standard inputs that returns the prepared zero-argument call."""
    if kind == "sampler":
        interpreted_smoke = quick_mode() and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        if options.get("backend") == "triton" and device.type != "cuda" and not interpreted_smoke:
            pytest.skip(
                "Triton kernels are timed on a CUDA GPU only (on the CPU they run under TRITON_INTERPRET=1, "
                "which the quick smoke run uses)"
            )
        sampler = get_sampler_class(name)(**options)
        return lambda *inputs: lambda: sampler(*inputs), type(sampler).lossless
    return baselines.BASELINES[name], True  # every baseline implements lossless rejection sampling


_QUALITY_CACHE: dict[str, dict[str, object]] = {}


def _quality(impl_id: str, prepare, lossless, device: torch.device, quick: bool) -> dict[str, object]:
    """Acceptance, theory and output TV on a fixed workload (once per implementation)."""
    if impl_id not in _QUALITY_CACHE:
        setting = workloads.softmax_setting(1.0, 1.0, 256 if quick else 1000, 2 if quick else 4)
        target, draft = workloads.make_pairs(setting, seed=0)
        measured = quality.measure(
            lambda *a: prepare(*a)(),
            target,
            draft,
            k=4,
            rows=64 if quick else 1024,
            seed=0,
            device=device,
            lossless=lossless,
        )
        _QUALITY_CACHE[impl_id] = {
            "setting": setting.name,
            "acceptance": measured["acceptance"],
            "emitted": measured["emitted"],
            "theory_acceptance": measured["theory"]["acceptance"] if measured["theory"] else None,
            "z_acceptance": measured["z"]["acceptance"] if measured["z"] else None,
            "tv_output": measured["tv_output"]["estimate"],
            "tv_noise_floor": measured["tv_output"]["noise_floor"],
            "tv_draft_target": measured["tv_draft_target"],
        }
    return _QUALITY_CACHE[impl_id]


@pytest.mark.parametrize("impl", [spec for _, spec in IMPLEMENTATIONS], ids=[i for i, _ in IMPLEMENTATIONS])
def test_verification(benchmark, impl, point):
    kind, name, options = impl
    B, k, V, dtype_name = point
    device = bench_device()
    quick = quick_mode()
    factory, lossless = _make_callable(kind, name, options, device)
    inputs = workloads.timing_inputs(B, k, V, DTYPES[dtype_name], device, seed=0)
    args = (
        inputs["target_with_bonus_probs"],
        inputs["bonus_token_ids"],
        inputs["draft_probs"],
        inputs["draft_token_ids"],
    )
    try:
        call = factory(*args)
        out = call()
    except baselines.BaselineUnavailable as exc:
        pytest.skip(f"{name} unavailable: {exc}")
    assert out.shape == (B, k + 1), f"{name}: output shape {tuple(out.shape)}, expected {(B, k + 1)}"
    assert bool((out[:, 0] >= 0).all()), f"{name}: no token in slot 0"

    def body():
        result = call()
        timing.synchronize(device)  # finished device work inside the host-timed body
        return result

    benchmark.group = f"B={B} k={k} V={V} {dtype_name}"
    benchmark(body)
    nbytes = timing.tensor_bytes(*args, out)
    info = {
        "device": str(device),
        "bytes": nbytes,
        "floor_bytes": 2 * B * V * args[0].element_size(),
        "acceptance_this_call": float((out[:, 1:] != -1).float().mean()),
    }
    stats = getattr(benchmark, "stats", None)
    if stats is not None:  # None under --benchmark-disable
        info["gbps"] = nbytes / stats.stats.median / 1e9
    if device.type == "cuda" and not quick:
        info["cuda_event_time_s"] = timing.time_call(call, device)["time_s"]
    info.update(_quality(f"{kind}:{name}:{options}", factory, lossless, device, quick))
    benchmark.extra_info.update(info)
    if lossless:
        z = info["z_acceptance"]
        assert abs(z) < quality.Z_BOUND, (
            f"{name}: acceptance {info['acceptance']:.4f} vs theory {info['theory_acceptance']:.4f} (z={z:.1f})"
        )
