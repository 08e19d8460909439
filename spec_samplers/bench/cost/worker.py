"""The stages that need one Triton mode each, run as ``python -m spec_samplers.bench.cost.worker
STAGE CONFIG_JSON`` (the mode is fixed when triton is first imported, so each runs in its own
process); prints one JSON document.

* ``compiled`` (TRITON_INTERPRET unset): the full-shape trace on CPU tensors, values
  uninitialised (launches, eager ops: :func:`.trace.tracing`, our launches planned for an H100's
  multiprocessors and recorded, the peers' caught and not run) and every
  distinct launched variant compiled for sm_90 and read (:mod:`.sass`);
* ``interpreted`` (TRITON_INTERPRET=1): the call run at a small batch and two small vocabulary
  sizes with the interpreter's traffic counted (:mod:`.counting`), tails apart (:mod:`.tails`).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _shape(config: dict[str, Any]) -> Any:
    from spec_samplers.bench.cost.workloads import Shape

    return Shape(**config["shape"])


def _prepare(workload: str) -> None:
    from spec_samplers.bench.cost.workloads import VLLM_WORKLOADS, prepare_vllm

    if workload in VLLM_WORKLOADS:
        prepare_vllm()


def compiled(config: dict[str, Any]) -> dict[str, Any]:
    import torch

    from spec_samplers.bench.cost import sass, tails, trace
    from spec_samplers.bench.cost.workloads import PEER_WORKLOADS, build, shapes_only

    _prepare(config["workload"])
    shape = _shape(config)
    # CPU tensors, not meta: the path a GPU takes (the samplers' acceptance counters skip meta
    # tensors); planned for a GPU, nothing of ours launched, vocabulary-sized eager ops run once
    with shapes_only():
        call = build(config["workload"], shape, torch.device("cpu"))
    ops = trace.EagerOps(shape.vocab_size)
    peers = config["workload"] in PEER_WORKLOADS
    # the steady state of an engine step: what the first call alone allocates and caches
    # (the arrival counters of kernels.backend) is not traced
    with trace.tracing(config["num_sms"], peers=peers):
        call()
    with trace.tracing(config["num_sms"], ops=ops, peers=peers) as traced, ops:
        call()
    launches = [part for launch in traced for part in tails.measured(launch)]
    variants: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for launch in launches:
        key = sass.variant_key(launch)
        if key not in variants and config.get("sass", True):
            # a kernel with a tail: its every-program code is read, the tail from its own row
            variants[key] = sass.compile_variant(launch, tails.arrival() if launch.name in tails.TAILS else None)
        rows.append(
            {
                "name": launch.name,
                "module": launch.module,
                "grid": list(launch.grid),
                "programs": launch.programs,
                "num_warps": launch.num_warps,
                "tail": launch.tail,
                "after_op": launch.after_op,
                "tensors": {path: list(t.shape) for path, t in launch.tensors()},
                "variant": key,
            }
        )
    return {"launches": rows, "eager": [vars(o) for o in ops.records], "variants": variants}


def interpreted(config: dict[str, Any]) -> dict[str, Any]:
    from spec_samplers.bench.cost import counting, tails
    from spec_samplers.bench.cost.workloads import build

    _prepare(config["workload"])
    from spec_samplers.bench.cost import standins

    standins.install()
    shape = _shape(config)
    runs = []
    for vocab in config["small_vocab"]:
        call = build(config["workload"], shape.at(config["small_batch"], vocab), __import__("torch").device("cpu"))
        with counting.counting(tails.counted()) as counts:
            call()
        runs.append([c.as_dict() for c in counts])
    return {"runs": runs}


def run_stage(stage: str, config: dict[str, Any], tree: str | None = None) -> dict[str, Any]:
    """Run ``stage`` in a fresh interpreter with the Triton mode it needs; returns its JSON.
    ``tree``: a checkout of another commit whose package (this worker included) is traced
    instead (benchmarks/cost_calibration.py models the code a GPU measured)."""
    import subprocess

    env = dict(os.environ)
    if tree is not None:
        # (``-m`` puts the working directory first on sys.path: run in the tree, or this
        # checkout's package is the one imported)
        env["PYTHONPATH"] = tree
    env.pop("TRITON_INTERPRET", None)
    if stage == "interpreted":
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "spec_samplers.bench.cost.worker", stage, json.dumps(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cost-model stage {stage!r} failed for {config}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    stage, config = argv[0], json.loads(argv[1])
    result = {"compiled": compiled, "interpreted": interpreted}[stage](config)
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
