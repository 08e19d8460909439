"""One profile: the three stages joined per launch, the modeled times, a table and JSON."""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import asdict
from typing import Any

from spec_samplers.bench.cost import model
from spec_samplers.bench.cost.counting import scale
from spec_samplers.bench.cost.totals import summarize
from spec_samplers.bench.cost.worker import run_stage
from spec_samplers.bench.cost.workloads import Shape

#: the small shapes the interpreter counts at: a batch of 2 and two vocabularies of a few race
#: groups (RACE_GROUP = 1024), so fixed per-request reads and per-V reads separate
SMALL_BATCH = 2
SMALL_VOCAB = (3072, 5120)
#: how many lines a SASS load may sit after its tl.load (inline-PTX lines of a predicated vector load)
LINE_DRIFT = 6


def _match(full: list[dict[str, Any]], counted: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """The counted launch of each full-shape launch: the same kernel, same occurrence."""
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in counted:
        by_name[c["name"]].append(c)
    seen: Counter[str] = Counter()
    out = []
    for launch in full:
        n = seen[launch["name"]]
        seen[launch["name"]] += 1
        found = by_name.get(launch["name"], [])
        out.append(found[n] if n < len(found) else None)
    return out


def _loop_cycles(variant: dict[str, Any], sites: list[dict[str, Any]], programs: int, num_warps: int) -> dict[str, Any]:
    """Warp issue cycles of a launch at full shape, and instructions per vocabulary element.

    Straight-line code: once per warp of every program. A vocabulary loop's iterations (over all
    warps) = lanes of its load line / (32 * elements one thread loads from that line per
    iteration); loops sharing a line share its lanes. Per element: every modeled instruction over
    the lanes of the launch's busiest load line."""
    lanes = {(os.path.basename(s["file"]), s["line"]): s for s in sites if s["kind"] == "load"}

    def site_of(file: str, line: int) -> tuple[str, int]:
        """The interpreter's load line for a SASS load line: Triton's vector loads are inline PTX
        whose lines advance the line table, so a SASS load sits a few lines after its tl.load."""
        name = os.path.basename(file)
        for back in range(LINE_DRIFT + 1):
            if (name, line - back) in lanes:
                return name, line - back
        return name, line

    loops = variant.get("loops", [])
    owners: Counter[tuple[str, int]] = Counter()
    keyed = []
    for lp in loops:
        per_line: Counter[tuple[str, int]] = Counter()
        for ld in lp["loads"]:
            per_line[site_of(ld["file"], ld["line"])] += ld["width"]
        line = max(per_line, key=lambda key: lanes[key]["lanes"] if key in lanes else -1) if per_line else None
        keyed.append((lp, line, per_line))
        if line in lanes:
            owners[line] += 1
    cycles = 0.0
    classes: Counter[str] = Counter()
    straight = variant.get("straight")
    if straight:
        warps = programs * num_warps
        cycles += warps * straight["issue_cycles"]
        for k, v in straight["classes"].items():
            classes[k] += v * warps * 32
    for lp, line, per_line in keyed:
        if line not in lanes:
            continue
        site = lanes[line]
        per_thread = per_line[line] / site["itemsize"]  # elements a thread loads per iteration
        share = site["lanes"] / owners[line]
        iterations = share / (32 * per_thread)
        cycles += iterations * lp["issue_cycles"]
        for k, v in lp["classes"].items():
            classes[k] += v * iterations * 32
    elements = max([s["lanes"] for s in lanes.values()] or [0])
    per_element = {k: v / elements for k, v in classes.items()} if elements else {}
    return {"warp_cycles": cycles, "vocab_elements": elements, "per_element": per_element}


def latency_inputs(variant: dict[str, Any], sites: list[dict[str, Any]], tail: bool) -> dict[str, Any]:
    """What :func:`model.launch_time` needs beyond bytes and cycles, from the compiled variant:
    CTAs resident per SM (occupancy), the bytes a warp keeps in flight (one iteration's loads of
    its widest vocabulary loop: 32 lanes of each load's width), the stack of a kernel that spills;
    for a tail (it runs after its launch's other programs, alone): its dependent L2 round trips,
    the arrival atomic plus one per source line that loads (an upper bound: loads of one line
    wait for the line before)."""
    inflight = max((32 * sum(ld["width"] for ld in lp["loads"]) for lp in variant.get("loops", [])), default=0)
    loads = {(s["file"], s["line"]) for s in sites if s["kind"] == "load"}
    return {
        "ctas_per_sm": variant.get("ctas_per_sm"),
        "inflight_per_warp": float(inflight) or None,
        "local_bytes_per_thread": variant.get("stack_bytes", 0) if variant.get("spill_instructions") else 0,
        "dependent_rounds": 1 + len(loads) if tail else 0,
        "standalone": not tail,
    }


def profile(
    workload: str,
    shape: Shape,
    sass: bool = True,
    counts: dict[Any, Any] | None = None,
    host: dict[str, Any] | None = None,
    tree: str | None = None,
) -> dict[str, Any]:
    """Launches, bytes, instructions and modeled times of one call of ``workload`` at ``shape``.

    ``counts`` caches the interpreter's small-shape counts across calls that differ only in B and
    V (a sweep counts once per workload). ``host``: the call's measured host row
    (benchmarks/host_overhead.py), for the eager time (:func:`.totals.summarize`). ``tree``: trace
    the package of that checkout instead of this one (:func:`.worker.run_stage`); the time model
    is this one's."""
    if workload == "flashinfer-chain":
        from spec_samplers.bench.cost import flashinfer_peer

        return flashinfer_peer.profile_chain(shape)
    base = {"workload": workload, "shape": asdict(shape)}
    full = run_stage("compiled", {**base, "num_sms": model.H100.sms, "sass": sass}, tree)
    key = (workload, shape.at(SMALL_BATCH, SMALL_VOCAB[0]))
    counted = counts.get(key) if counts is not None else None
    if counted is None:
        counted = run_stage("interpreted", {**base, "small_batch": SMALL_BATCH, "small_vocab": list(SMALL_VOCAB)}, tree)
        if counts is not None:
            counts[key] = counted
    runs = counted["runs"]
    pairs = list(zip(_match(full["launches"], runs[0]), _match(full["launches"], runs[1])))
    launches = []
    for launch, (a, b) in zip(full["launches"], pairs):
        row: dict[str, Any] = {k: launch[k] for k in ("name", "module", "grid", "programs", "num_warps", "tail")}
        if a is None or b is None:
            row["error"] = "not launched at the small shape: bytes not counted"
            launches.append(row)
            continue
        traffic = scale((a, b), (*SMALL_VOCAB, shape.vocab_size), (SMALL_BATCH, shape.batch_size), launch["tensors"])
        variant = full["variants"].get(launch["variant"], {})
        sites = traffic.pop("sites")
        loops = _loop_cycles(variant, sites, launch["programs"], launch["num_warps"])
        row.update(traffic)
        row["bytes"] = traffic["bytes_loaded"] + traffic["bytes_stored"]
        row["sass"] = {k: v for k, v in variant.items() if k != "loops"}
        row["loops"] = variant.get("loops", [])
        row["straight_classes"] = variant.get("straight", {}).get("classes", {})
        row.update(loops)
        row["latency_inputs"] = latency_inputs(variant, sites, bool(launch["tail"]))
        row["modeled"] = {
            name: model.launch_range(
                hw, row["bytes"], loops["warp_cycles"], launch["programs"], launch["num_warps"], **row["latency_inputs"]
            )
            for name, hw in model.HARDWARE.items()
        }
        launches.append(row)
    return summarize(workload, shape, launches, full["eager"], host)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f}"


def table(results: list[dict[str, Any]]) -> str:
    """One line per (workload, shape): counts and modeled microseconds (H100 and H200)."""
    head = (
        "| workload | B | k | V | launches | eager ops (vocab) | MB moved | H100 eager us | H100 graph us "
        "| H200 eager us | H200 graph us | H100 floor us | graph/floor H100 | graph/traffic floor H100 |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        s, m, e = r["shape"], r["modeled"], r["eager_ops"]
        mb = (r["kernel_bytes"] + e["bytes"]) / 1e6
        traffic = m["H100"].get("graph_over_traffic_floor")
        lines.append(
            f"| {r['workload']} | {s['batch_size']} | {s['k']} | {s['vocab_size']} "
            f"| {sum(not launch.get('tail') for launch in r['launches'])} "
            f"| {e['count']} ({e['vocab_sized']}) | {mb:.1f} "
            f"| {_us(m['H100']['eager_s'])} | {_us(m['H100']['graph_s'])} "
            f"| {_us(m['H200']['eager_s'])} | {_us(m['H200']['graph_s'])} | {_us(m['H100']['floor_s'])} "
            f"| {m['H100']['graph_over_floor']:.2f} | {'-' if traffic is None else f'{traffic:.2f}'} |"
        )
    return "\n".join(lines)


def _per(per_element: dict[str, float], key: str, digits: int) -> str:
    return f"{per_element.get(key, 0.0):.{digits}f}" if per_element else "-"


def _resource(sass: dict[str, Any], key: str) -> str:
    value = sass.get(key, "?")
    return f"{value:.2f}" if key == "occupancy" and value != "?" else str(value)


def launch_table(result: dict[str, Any]) -> str:
    """Per launch of one profile: grid, bytes, SASS resources, loop instructions per element."""
    head = (
        "| kernel | grid | warps | MB | regs | spills | smem B | occ | instr/elem | int mul | fp32 | fp64 | mufu "
        "| loads | H100 us (mem / issue / dependent latency -> kernel) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in result["launches"]:
        if "modeled" not in r:
            lines.append(f"| {r['name']} | {r['grid']} | {r['num_warps']} | {r.get('error', '')} |")
            continue
        # (a launch modeled from its source without SASS, FlashInfer's softmax: bytes only)
        sass, pe, t = r.get("sass", {}), r.get("per_element", {}), r["modeled"]["H100"]
        if r.get("vocab_elements", 0) < result["shape"]["vocab_size"]:
            pe = {}  # a per-request kernel: no vocabulary axis to count per element
        widths = Counter(f"{ld['width'] * 8}bit" for lp in r.get("loops", []) for ld in lp["loads"])
        for key, n in r.get("straight_classes", {}).items():
            if key.startswith("ldg_"):
                widths[key[4:]] += n
        loads = ", ".join(f"{k}x{v}" for k, v in sorted(widths.items()))
        name = f"{r['name']} (tail of the launch above)" if r.get("tail") else r["name"]
        lines.append(
            f"| {name} | {tuple(r['grid'])} | {r['num_warps']} | {r['bytes'] / 1e6:.2f} "
            f"| {_resource(sass, 'registers')} | {_resource(sass, 'spill_instructions')} "
            f"| {sass.get('shared_bytes', '?')} | {_resource(sass, 'occupancy')} "
            f"| {_per(pe, 'total', 1)} | {_per(pe, 'int_mul', 2)} | {_per(pe, 'fp32', 1)} "
            f"| {_per(pe, 'fp64', 2)} | {_per(pe, 'mufu', 2)} | {loads or '-'} "
            f"| {t['memory_s'] * 1e6:.1f} / {t['issue_s'] * 1e6:.1f} / {t.get('latency_s', 0.0) * 1e6:.1f} "
            f"-> {t['kernel_s'] * 1e6:.1f} |"
        )
    return "\n".join(lines)
