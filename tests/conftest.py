"""Shared fixtures and helpers. Tests run on CPU; samplers are exercised on whatever device is given.

Without CUDA, the Triton kernels run through the interpreter (TRITON_INTERPRET=1), which must be
set before anything imports triton, and the kernel modules are imported here, once, under that
setting (a test that later sets TRITON_INTERPRET=0 must not be the first to build them).

Helpers for the kernel tests (import them with ``from conftest import ...``): ``DEVICE``,
``KERNEL_BACKEND``, ``to_device``, ``case_on_device``, ``small_split`` and ``run_compile_check``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# The interpreter's math is numpy's. On a CPU with AVX-512, numpy dispatches fp32 exp2 / exp / log
# to AVX-512 kernels whose last bits differ from torch's about 3x as often as its AVX2 kernels'
# (exp2: 10.8% of fp32 inputs against 3.1%, numpy 2.3 and 2.4), and the kernel tests'
# token-for-token comparisons (a near tie flipped by an ulp: test_kernels_multipath's logits
# entries at seed 11) were written against the AVX2 kernels. numpy reads this once, when it is
# first imported (torch imports it): set only where nothing imported numpy yet, under the names of
# its dispatch targets (2.4 renamed them; an unknown name warns). GPUs never run numpy's math.
if "numpy" not in sys.modules:
    from importlib.metadata import version

    numpy_2_4 = tuple(int(part) for part in version("numpy").split(".")[:2]) >= (2, 4)
    os.environ.setdefault(
        "NPY_DISABLE_CPU_FEATURES",
        "X86_V4 AVX512_ICL AVX512_SPR" if numpy_2_4 else "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL",
    )

# the CPU path's kernels compile at their first call in tests (spec_samplers.cpu.kernels: by default
# a process without cached kernels runs the references while a thread compiles them, which would make
# a test's path depend on timing; tests/test_cpu_path.py tests that mode in its own processes)
os.environ.setdefault("SPEC_SAMPLERS_CPU_COMPILE", "foreground")

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import spec_samplers.kernels.tree_launch  # noqa: E402,F401
import spec_samplers.kernels.verify_launch  # noqa: E402,F401  (the launchers import their kernels when they run)
from spec_samplers.kernels.backend import VocabSplit, vocab_split  # noqa: E402

#: where the kernel tests put their tensors
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
#: the sampler backend that runs the kernels on DEVICE
KERNEL_BACKEND = "auto" if DEVICE.type == "cuda" else "triton"


def to_device(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.to(DEVICE) for t in tensors]


def case_on_device(case, *, use_draft: bool = True, greedy: bool = True, offsets: bool = True) -> list:
    """A kernel case's padded inputs on DEVICE, in the launchers' order: (target, draft, ids, bonus,
    seeds, offsets, is_greedy); draft, offsets and is_greedy None where switched off."""
    draft = case.draft if use_draft else None
    rest = (case.offsets if offsets else None, case.is_greedy if greedy else None)
    return to_device(case.target, draft, case.draft_ids, case.bonus, case.seeds, *rest)


def run_compile_check(script: str, tmp_path: Path) -> str:
    """Run ``tests/{script}`` in a fresh interpreter without TRITON_INTERPRET, so that Triton
    compiles for a real target (no GPU needed: Triton ships ptxas), with its own kernel cache.
    Returns its stdout; fails with the end of its stderr."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "tests"), env.get("PYTHONPATH", "")])
    script_path = str(Path(__file__).with_name(script))
    proc = subprocess.run([sys.executable, script_path], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def small_split(V: int, B: int, block_v: int = 64, num_blocks: int = 3) -> VocabSplit:
    """Small blocks so that every test crosses vocab-block and vector-step boundaries."""
    return vocab_split(V, B, DEVICE, block_v=block_v, num_blocks=num_blocks)


#: the engine tier runs in its own environment (vLLM's CPU build): tests/engine/run, not this run
collect_ignore = ["engine"]

#: test modules whose every test carries a marker (select with -m, deselect with -m "not ...")
_MODULE_MARKERS = {
    "vllm": ("test_vllm_",),
    "slow": ("test_lossless", "test_kernels_compile", "test_launch_variants"),
    # modules that run the Triton kernels (.ci/run runs their quick tier on the newest Triton too)
    "kernels": tuple(
        """test_kernels_ test_tree_kernels test_sampling_kernels test_block_verification test_bonus_rows
        test_draft_probs test_draft_rows test_fused_filters test_fuzz_ test_logits_api test_logits_processor
        test_logits_rule test_rng test_robustness test_sampling_params_verify test_softmax_stats
        test_two_level_race test_decoding_draws test_layers test_profile""".split()
    ),
}


#: the longest tests (minutes of CPU each: every kernel variant compiled for sm_90, split across
#: the cores by tests/kernel_compile_check.py's compile_all), marked `compile_check`: they run
#: first, then the `slow` ones; .ci/run runs them on the newest Triton too
_COMPILE_CHECKS = (
    "test_every_kernel_variant_compiles_for_sm90",
    "test_every_sampling_kernel_variant_compiles_for_sm90",
    "test_tree_kernels_compile_for_sm90",
)


def pytest_configure(config: pytest.Config) -> None:
    # `-n N` schedules with xdist's "load" unless told otherwise: work stealing instead, which
    # with the longest tests first (below) lets the workers finish together (under "load" each
    # worker first takes a contiguous chunk of the collection: one would take every long test).
    # An explicit --dist other than load is kept.
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "worksteal"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first_instances: set[tuple[str, str]] = set()
    for item in items:
        name = item.path.name
        for marker, prefixes in _MODULE_MARKERS.items():
            if name.startswith(prefixes):
                item.add_marker(marker)
        if item.name in _COMPILE_CHECKS:
            item.add_marker("compile_check")
        # the quick tier (README, "Development"): every test function once, at its first parameter
        # set (the parametrizations list their smallest shapes first), none of the slow ones, and
        # none that needs vLLM or torch's CUDA build: the quick tier runs in a light environment (CPU torch, no vLLM;
        # README, "Run the tests"), the full tier (what CI runs) has vLLM and runs them
        function = (name, getattr(item, "originalname", item.name))
        if function not in first_instances and item.get_closest_marker("slow") is None:
            first_instances.add(function)
            light = all(item.get_closest_marker(m) is None for m in ("not_quick", "vllm", "cuda_build"))
            if light:
                item.add_marker("quick")
    # longest first (a stable sort: the rest keep their order), so that no worker starts a long
    # test when the others are nearly done
    items.sort(key=lambda item: 0 if item.name in _COMPILE_CHECKS else 1 if item.get_closest_marker("slow") else 2)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
