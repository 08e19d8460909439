"""Regenerate the cost-model results: ours vs vLLM V1 vs Model Runner V2 vs FlashInfer, modeled.

    python benchmarks/cost_model.py            # writes benchmarks/results/<date>-cost-model.{md,json}

V = 128256, bf16 logits, k = 4, B in {1, 8, 64, 256}; every time is **modeled** (docs/cost-model.md)
from the kernels that exist when it runs (the launches are discovered from the call, not listed).
Needs the vllm extra (vLLM 0.33 and the flashinfer-python wheel it installs) and nvcc for the
FlashInfer peer; a peer that cannot be profiled is reported as such, not dropped silently.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from spec_samplers.bench.cost import model, report
from spec_samplers.bench.cost.workloads import Shape

WORKLOADS = ("ours", "ours-probs", "vllm-v1", "vllm-mrv2", "flashinfer-chain", "ours-v1-seam", "ours-v2-seam")
#: ours through its probabilities entry (the bare-kernel comparison with the probabilities peers)
ENTRIES = {"ours-probs": ("ours", "probs")}
BATCHES = (1, 8, 64, 256)


#: the benchmarks/host_overhead.py row measuring each workload's host time (entry, impl)
HOST_ROWS = {
    "ours": "RejectionSampler.forward_ragged_from_logits",
    "ours-probs": "RejectionSampler.forward_ragged",
    "ours-v1-seam": ("v1_seam", "ours"),
    "ours-v2-seam": ("mrv2_seam", "ours"),
    "vllm-v1": ("v1_seam", "vllm"),
    "vllm-mrv2": ("mrv2_seam", "vllm"),
}


def host_rows(paths: str | list[str] | None) -> tuple[dict[tuple[str, int], dict], str | None]:
    """{(workload, B): host row} from host_overhead.py JSONs (default: the newest committed
    benchmarks/results/*-host-overhead*.json by its measured date), and their names with their
    commits. With several files a row of a later one replaces the same row of an earlier one (a
    re-measurement of some rows, say the seams', taken apart from a load spike)."""
    if paths:
        files = [Path(p) for p in ([paths] if isinstance(paths, str) else paths)]
    else:  # the newest run of every row (not a re-measurement of some rows)
        docs = {f: json.loads(f.read_text()) for f in Path(__file__).parent.glob("results/*-host-overhead*.json")}
        entries = {key if isinstance(key, str) else key[0] for key in HOST_ROWS.values()}
        full = [f for f, doc in docs.items() if entries <= {r["entry"] for r in doc["rows"]}]
        files = sorted(full, key=lambda f: docs[f]["meta"]["date"])[-1:]
    out: dict[tuple[str, int], dict] = {}
    names = []
    for f in files:
        doc = json.loads(f.read_text())
        name = f"{f.name} (commit {doc['meta']['commit']})"
        names.append(name)
        by = {(r["entry"], r["impl"], r["B"]): r for r in doc["rows"]}
        for workload, key in HOST_ROWS.items():
            entry, impl = key if isinstance(key, tuple) else (key, "ours")
            for (e, i, b), row in by.items():
                if (e, i) == (entry, impl):
                    out[(workload, b)] = {**row, "source": name}
    return out, " + ".join(names) if names else None


def commit() -> str:
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parents[1]).stdout

    return git("rev-parse", "--short", "HEAD").strip() + (
        "-dirty" if git("status", "--porcelain", "spec_samplers").strip() else ""
    )


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("spec-samplers", "torch", "triton", "vllm", "flashinfer-python"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def trimmed(result: dict) -> dict:
    """The JSON keeps per launch what the tables show: each loop's classes and the widths of its
    loads, not the loads one by one (size)."""
    for launch in result["launches"]:
        launch["loops"] = [
            {
                "classes": loop["classes"],
                "issue_cycles": loop["issue_cycles"],
                "loads": [{"width": ld["width"]} for ld in loop["loads"]],
            }
            for loop in launch.get("loops", [])
        ]
    return result


def speedups(results: list[dict]) -> str:
    lines = [
        "| B | vs vLLM V1 | vs vLLM MRv2 | vs FlashInfer chain (+ softmax) | ours / byte floor (H100) "
        "| ours / design-traffic floor (H100) |",
        "|---|---|---|---|---|---|",
    ]
    by = {(r["workload"], r["shape"]["batch_size"]): r for r in results if "modeled" in r}
    for b in BATCHES:
        ours = by.get(("ours", b))
        if ours is None:
            continue
        t = ours["modeled"]["H100"]["graph_s"]
        cells = []
        for peer in ("vllm-v1", "vllm-mrv2", "flashinfer-chain"):
            other = by.get((peer, b))
            cells.append(f"{other['modeled']['H100']['graph_s'] / t:.2f}x" if other else "n/a")
        m = ours["modeled"]["H100"]
        traffic = f"{m['graph_over_traffic_floor']:.2f}x" if "graph_over_traffic_floor" in m else "n/a"
        lines.append(f"| {b} | " + " | ".join(cells) + f" | {m['graph_over_floor']:.1f}x | {traffic} |")
    return "\n".join(lines)


def _range(m: dict, key: str = "graph") -> tuple[float, float, float]:
    """(central, low, high) seconds of a modeled total."""
    return m[f"{key}_s"], m.get(f"{key}_low_s", m[f"{key}_s"]), m.get(f"{key}_high_s", m[f"{key}_s"])


def _cell(t: tuple[float, float, float]) -> str:
    return f"{t[0] * 1e6:.1f} us ({t[1] * 1e6:.1f}-{t[2] * 1e6:.1f})"


def _ratio(peer: tuple[float, float, float], ours: tuple[float, float, float]) -> str:
    """peer / ours, central (low: peer's low over our high; high: peer's high over our low)."""
    return f"{peer[0] / ours[0]:.2f}x ({peer[1] / ours[2]:.2f}-{peer[2] / ours[1]:.2f})"


#: like for like (issue 29): (title, ours, peer) per row of the headline
HEADLINE = (
    ("vLLM Model Runner V2: our seam in the runner vs vLLM's own path", "ours-v2-seam", "vllm-mrv2"),
    ("vLLM V1: our seam in the runner vs vLLM's own path", "ours-v1-seam", "vllm-v1"),
    ("FlashInfer: its softmax op + chain_speculative_sampling vs our logits entry", "ours", "flashinfer-chain"),
)
#: launches that are glue, not the verification kernel (FlashInfer's softmax before its chain op)
GLUE_LAUNCHES = ("OnlineSoftmaxMapKernel", "OnlineSoftmaxReduceKernel", "OnlineSoftmaxFusedKernel")


def headline(results: list[dict], gpu: str = "H100") -> str:
    """Like for like, CUDA graphs, with the model's low-high range: what a user of each engine gets."""
    by = {(r["workload"], r["shape"]["batch_size"]): r for r in results if "modeled" in r}
    lines = ["| comparison | B | ours | peer | peer / ours |", "|---|---|---|---|---|"]
    for title, ours, peer in HEADLINE:
        for b in BATCHES:
            if (ours, b) in by and (peer, b) in by:
                o, p = _range(by[(ours, b)]["modeled"][gpu]), _range(by[(peer, b)]["modeled"][gpu])
                lines.append(f"| {title} | {b} | {_cell(o)} | {_cell(p)} | {_ratio(p, o)} |")
    return "\n".join(lines)


def bare_kernels(results: list[dict], gpu: str = "H100") -> str:
    """Bare kernels against bare kernels: each call's kernel launches only (no eager glue, no
    launch latency; FlashInfer's chain op without its softmax), central (low-high), entry for
    entry: our logits entry against vLLM MRv2's kernels (logits too), our probabilities entry
    against vLLM V1's and FlashInfer's (probabilities)."""

    def kernels(r: dict) -> tuple[float, float, float]:
        ms = [x["modeled"][gpu] for x in r["launches"] if "modeled" in x and x["name"] not in GLUE_LAUNCHES]
        low, high = (sum(m.get(k, m["kernel_s"]) for m in ms) for k in ("kernel_low_s", "kernel_high_s"))
        return sum(m["kernel_s"] for m in ms), low, high

    by = {(r["workload"], r["shape"]["batch_size"]): r for r in results if "modeled" in r}
    pairs = (("ours", "vllm-mrv2"), ("ours-probs", "vllm-v1"), ("ours-probs", "flashinfer-chain"))
    lines = ["| B | " + " | ".join(f"{o} vs {p}" for o, p in pairs) + " |", "|---|" + "---|" * len(pairs)]
    for b in BATCHES:
        cells = []
        for ours, peer in pairs:
            if (ours, b) not in by or (peer, b) not in by:
                cells.append("n/a")
                continue
            o, p = kernels(by[(ours, b)]), kernels(by[(peer, b)])
            cells.append(f"{o[0] * 1e6:.1f} vs {p[0] * 1e6:.1f} us: {_ratio(p, o)}")
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def traffic_check(results: list[dict]) -> str:
    """Our counted vocabulary bytes against docs/design.md's traffic formula (model.design_traffic)."""
    lines = [
        "| B | counted vocabulary bytes loaded (MB) | design formula (MB) | counted / formula |",
        "|---|---|---|---|",
    ]
    for r in results:
        if r["workload"] == "ours" and r.get("design_vocab_bytes"):
            counted, formula = r["counted_vocab_bytes_loaded"], r["design_vocab_bytes"]
            lines.append(
                f"| {r['shape']['batch_size']} | {counted / 1e6:.1f} | {formula / 1e6:.1f} | {counted / formula:.3f} |"
            )
    return "\n".join(lines)


def render(doc: dict) -> str:
    results, failures = doc["results"], doc["failures"]
    md = [
        f"# Cost model, {doc['date']}: ours vs vLLM vs FlashInfer (all times MODELED, not measured)",
        "",
        "Regenerate: `python benchmarks/cost_model.py`. Model and constants: docs/cost-model.md. The model's error",
        "on the calls a GPU measured: docs/performance.md (benchmarks/results/*-cost-calibration.json).",
        f"Modeled from commit {doc.get('commit', 'not recorded')}; host times from {doc.get('host_overhead')}.",
        "V = 128256, bf16 logits, k = 4, temperature 0.7, probabilistic drafts, every request rejecting its",
        "first draft (the worst case). Versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()) + ".",
        "",
        "## Like for like (H100, CUDA graphs, modeled: central (low-high))",
        "",
        "What a user of each engine gets: our seam inside each vLLM runner against vLLM's own path, and",
        "FlashInfer's best public path (its softmax op, then chain_speculative_sampling) against our",
        "logits entry. The range is the model's: its assumed latency constants at the ends of theirs.",
        "",
        headline(results),
        "",
        "## Bare kernels against bare kernels (H100, kernel time only: no eager glue, no launch latency)",
        "",
        bare_kernels(results),
        "",
        "## Modeled time per call (H100 with CUDA graphs), peer / our bare logits entry",
        "",
        speedups(results),
        "",
        "## Per call",
        "",
        report.table(results),
        "",
        "## Our traffic against the design's formula (counted by the interpreter, scaled)",
        "",
        traffic_check(results),
        "",
    ]
    for r in results:
        if r["shape"]["batch_size"] == 64:
            md += [f"## Launches of {r['workload']} at B = 64 (modeled)", "", report.launch_table(r), ""]
            e = r["eager_ops"]
            md += [
                f"Eager ops outside kernels: {e['count']} moving data, {e['vocab_sized']} vocabulary-sized: "
                f"{e['by_op']}",
                "",
            ]
    if failures:
        md += ["## Not profiled", ""] + [
            f"- {f['workload']} B={f['batch_size']}: {f['error'][-300:]}" for f in failures
        ]
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results", help="folder for <date>-cost-model.{md,json}")
    p.add_argument("--batch", type=int, action="append", help="batch sizes (default 1 8 64 256)")
    p.add_argument("--workload", action="append", choices=WORKLOADS, help="workloads (default all)")
    p.add_argument("--render", metavar="JSON", help="only rewrite the .md next to an existing .json")
    p.add_argument("--host-overhead", metavar="JSON", help="host_overhead.py results (default: newest committed)")
    args = p.parse_args(argv)
    if args.render:
        path = Path(args.render)
        path.with_suffix(".md").write_text(render(json.loads(path.read_text())))
        return 0
    counts: dict = {}
    host, host_source = host_rows(args.host_overhead)
    results, failures = [], []
    for workload in args.workload or WORKLOADS:
        for b in args.batch or BATCHES:
            name, entry = ENTRIES.get(workload, (workload, "logits"))
            shape = Shape(b, 4, 128256, "bfloat16", entry=entry)
            try:
                result = trimmed(report.profile(name, shape, counts=counts, host=host.get((workload, b))))
                result["workload"] = workload
                results.append(result)
            except Exception as exc:  # a peer that cannot be profiled is reported, not dropped
                failures.append({"workload": workload, "batch_size": b, "error": str(exc)[-2000:]})
            print(f"{workload} B={b} done", file=sys.stderr)
    date = datetime.date.today().isoformat()
    out = Path(args.out)
    doc = {
        "date": date,
        "commit": commit(),
        "host_overhead": host_source,
        "versions": versions(),
        "constants": model.constants(),
        "results": results,
        "failures": failures,
    }
    (out / f"{date}-cost-model.json").write_text(json.dumps(doc, separators=(",", ":")))
    (out / f"{date}-cost-model.md").write_text(render(doc))
    print(f"wrote {out / f'{date}-cost-model.md'} and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
