"""Terminal tables and the JSON file of ``spec-samplers bench``.

JSON schema (``--json PATH``; ``"schema": "spec-samplers-bench/1"``)::

    {
      "schema": "spec-samplers-bench/1",
      "machine": {"date": ISO-8601 UTC, "platform": str, "python": str, "torch": str,
                  "spec_samplers": str, "cpu": str, "cpu_count": int,
                  "device": "cpu" | "cuda:N", "device_name": str, "cuda": str | null,
                  "load_average": [1, 5, 15 min] | null},
      "config": {"k": int, "rows": int (rows per context), "seed": int, "quick": bool,
                 "batch_sizes": [int], "timing_vocab": int, "dtypes": [str], "min_time_s": float,
                 "from_file": str | null, "threads": int (torch CPU threads)},
      "samplers": [{"name": str, "options": {str: value}, "label": str,
                    "lossless": bool | null, "swept": [str], "law": "token" | "block"}],
      "settings": [{"name": str, "kind": "softmax" | "sparse" | "point" | "file",
                    "vocab_size": int, "contexts": int, "sigma": float, "temperature": float,
                    "top_k": int, "source": str}],
      "acceptance": [{                       # one per (sampler variant, setting)
          "sampler": label, "name": str, "options": {...}, "setting": {as above}, "k": int,
          "rows": int (contexts * rows per context),
          "per_position": [k floats]          # fraction of rows accepting position i
          "acceptance": float, "acceptance_stderr": float,   # accepted / proposed drafts
          "emitted": float, "emitted_stderr": float,         # tokens emitted per step
          "tv_draft_target": float,           # mean TV(p, q): the setting's divergence
          "tv_output": {"estimate": float, "noise_floor": float, "noise_sd": float,
                        "excess": float, "excess_z": float | null,
                        "exact": float | null},  # first emitted token vs target (see quality):
                                              # the estimate, its exact mean and sd on exact draws,
                                              # estimate - mean and that in sds; exact where the
                                              # law is computable (typical acceptance)
          "theory": null | {"alpha": float, "per_position": [k floats],
                            "acceptance": float, "emitted": float,    # lossless samplers only
                            "method": str, "stderr": {"acceptance": float, "emitted": float}},
                                              # (method, stderr: block verification's theory only)
          "z": null | {"acceptance": float, "emitted": float}         # (measured - theory) / stderr
      }],
      "timing": [{                           # one per (timed sampler, dtype, batch size)
          "sampler": label, "name": str, "options": {...},
          "batch_size": int, "k": int, "vocab_size": int, "dtype": str, "device": str,
          "time_s": float (median), "time_min_s": float, "repeats": int,
          "timer": "cuda_events" | "perf_counter",
          "bytes": int, "floor_bytes": int, "gbps": float, "acceptance": float
      }],
      "summary": [{                          # one per sampler variant: sampler_summary() (the printed summary)
        "sampler": str, "lossless_declared": bool | None, "lossless_measured": bool, "verdict": str,
        "settings": int, "settings_off_target": int, "emitted": float, "theory_emitted": float | None,
        "max_abs_z": float | None, "worst_tv_excess": float, "ms_per_call": float | None,
        "ms_per_call_at": {"batch_size": int, "dtype": str} | None, "off_examples": [{...}]
      }]
    }

Field meanings: ``quality`` (acceptance, theory, TV) and ``timing`` (bytes, GB/s) docstrings.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import textwrap
from collections.abc import Sequence
from typing import Any

import torch

from spec_samplers._version import __version__

SCHEMA = "spec-samplers-bench/1"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "spec_samplers": __version__,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "device": str(device),
        "device_name": _cpu_name(),
        "cuda": torch.version.cuda,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,  # other work on the machine
    }
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
    return info


def write_json(path: str, document: dict[str, Any]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        json.dump(document, f, indent=1, allow_nan=True)
        f.write("\n")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


#: the terminal report fits this many columns; everything else is in the JSON
WIDTH = 100

ACCEPTANCE_HEADERS = ("setting", "TV(p,q)", "accept", "theory", "z", "pos 1", "emitted", "theory", "TV out", "floor")


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _tv_out(tv: dict[str, Any]) -> tuple[str, str]:
    """(TV out, floor) cells: the exact TV where known, else the estimate and its noise floor
    ± the floor's standard deviation (an estimate within about 2 sd of the floor is noise)."""
    if tv.get("exact") is not None:
        return _f(tv["exact"]), "exact"
    sd = _f(tv["noise_sd"])
    # "0.078±.016": the leading zero of the sd dropped, so the table keeps to WIDTH columns
    return _f(tv["estimate"]), f"{_f(tv['noise_floor'])}±{sd.removeprefix('0')}"


def acceptance_table(entries: Sequence[dict[str, Any]]) -> str:
    """One block per sampler (its label on a line of its own), one row per setting."""
    blocks = []
    for label, group in _by_sampler(entries).items():
        rows = []
        for e in group:
            theory, z = e["theory"], e["z"]
            rows.append(
                [
                    e["setting"]["name"],
                    _f(e["tv_draft_target"]),
                    _f(e["acceptance"]),
                    _f(theory and theory["acceptance"]),
                    "-" if z is None else f"{z['acceptance']:+.1f}",
                    _f(e["per_position"][0] if e["per_position"] else None, 2),
                    _f(e["emitted"], 2),
                    _f(theory and theory["emitted"], 2),
                    *_tv_out(e["tv_output"]),
                ]
            )
        table = _table(ACCEPTANCE_HEADERS, rows, [False] + [True] * 9)
        blocks.append(label + "\n" + "\n".join("  " + line for line in table.splitlines()))
    return "\n\n".join(blocks)


def _by_sampler(entries: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        groups.setdefault(e["sampler"], []).append(e)
    return groups


def _options_cell(options: dict[str, Any], swept: Sequence[str]) -> str:
    return (
        " ".join(
            f"{k.removeprefix('posterior_')}={v:g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in options.items()
            if k in swept
        )
        or "-"
    )


SWEEP_HEADERS = ("sampler", "options", "settings", "accept", "emitted", "TV out", "TV excess")


def sweep_table(entries: Sequence[dict[str, Any]], swept: Sequence[str] = ()) -> str:
    """Means over settings, one row per sampler variant (its swept options in one column).
    TV out: the exact TV where every setting has it (then TV excess is the same number), else
    the estimate; TV excess: TV out minus the estimate's noise floor."""
    rows = []
    for group in _by_sampler(entries).values():
        n = len(group)
        mean = lambda f, group=group, n=n: sum(f(e) for e in group) / n  # noqa: E731
        exact = all(e["tv_output"].get("exact") is not None for e in group)
        tv = mean(lambda e: e["tv_output"]["exact"]) if exact else mean(lambda e: e["tv_output"]["estimate"])
        excess = tv if exact else mean(lambda e: e["tv_output"]["excess"])
        rows.append(
            [
                group[0]["name"],
                _options_cell(group[0]["options"], swept),
                str(n),
                _f(mean(lambda e: e["acceptance"])),
                _f(mean(lambda e: e["emitted"]), 2),
                _f(tv) + ("" if exact else "~"),
                _f(excess),
            ]
        )
    return _table(SWEEP_HEADERS, rows, [False, False] + [True] * 5)


TIMING_HEADERS = ("sampler", "device", "dtype", "B", "k", "V", "ms/call", "MB", "GB/s", "floor MB")


def timing_table(entries: Sequence[dict[str, Any]]) -> str:
    """Sampler names only: timing runs once per sampler, its options are in the JSON."""
    rows = [
        [
            e["name"],
            e["device"],
            e["dtype"],
            str(e["batch_size"]),
            str(e["k"]),
            str(e["vocab_size"]),
            f"{e['time_s'] * 1e3:.3f}",
            f"{e['bytes'] / 1e6:.1f}",
            f"{e['gbps']:.2f}",
            f"{e['floor_bytes'] / 1e6:.1f}",
        ]
        for e in entries
    ]
    return _table(TIMING_HEADERS, rows, [False] * 3 + [True] * 7)


BLOCK_HEADERS = ("setting", "TV(p,q)", "token-wise", "theory", "block", "theory", "gain", "gain %", "theory gain %")
#: registry names compared by block_vs_token_table
TOKEN_WISE, BLOCK = "rejection_sampler", "block_verification"


def block_vs_token_table(entries: Sequence[dict[str, Any]]) -> str | None:
    """Mean accepted drafts per step (emitted - 1) of token-wise rejection and block verification
    on every setting both ran (default options only), with their theories and the gain; None when
    the run lacks one of them."""

    def by_setting(name: str) -> dict[str, dict[str, Any]]:
        return {e["setting"]["name"]: e for e in entries if e["name"] == name and not e["options"]}

    token, block = by_setting(TOKEN_WISE), by_setting(BLOCK)
    rows = []
    for setting, t in token.items():
        b = block.get(setting)
        if b is None:
            continue
        t_len, b_len = t["emitted"] - 1.0, b["emitted"] - 1.0
        theory = lambda e: None if e["theory"] is None else e["theory"]["emitted"] - 1.0  # noqa: E731
        t_th, b_th = theory(t), theory(b)
        th_gain = "-" if t_th is None or b_th is None or t_th <= 0 else f"{100.0 * (b_th - t_th) / t_th:+.1f}"
        rows.append(
            [
                setting,
                _f(t["tv_draft_target"]),
                _f(t_len),
                _f(t_th),
                _f(b_len),
                _f(b_th),
                f"{b_len - t_len:+.3f}",
                "-" if t_len <= 0 else f"{100.0 * (b_len - t_len) / t_len:+.1f}",
                th_gain,
            ]
        )
    if not rows:
        return None
    return _table(BLOCK_HEADERS, rows, [False] + [True] * 8)


#: an output whose TV from the target lies this many noise sds above the floor (or an exact TV
#: above EXACT_TV_LOSSY) differs from the target: the run's own evidence that a sampler is lossy
#: there (quality.Z_BOUND: what the tests allow a lossless sampler)
LOSSY_Z = 4.5
EXACT_TV_LOSSY = 1e-3


def _off_target(tv: dict[str, Any]) -> bool:
    """Whether the run shows this output's first token off the target distribution."""
    if tv.get("exact") is not None:
        return bool(tv["exact"] > EXACT_TV_LOSSY)
    z = tv.get("excess_z")
    return z is not None and z > LOSSY_Z


def _summary_shape(timing: Sequence[dict[str, Any]]) -> tuple[int, str] | None:
    """(B, dtype) the summary quotes times at: the timed batch size nearest 16, the first dtype."""
    if not timing:
        return None
    sizes = sorted({t["batch_size"] for t in timing})
    return min(sizes, key=lambda b: (abs(b - 16), b)), timing[0]["dtype"]


def sampler_summary(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-sampler verdicts (``--json``'s ``summary``; :func:`summary` prints them): lossless
    as declared and as measured (settings whose output is off the target), tokens per step against
    the theory, the worst |z|, the worst TV out minus its floor, and ms per call at the summary's
    shape. ``off_examples``: the worst off settings, for the notes."""
    shape = _summary_shape(document["timing"])
    declared = {s["label"]: s["lossless"] for s in document["samplers"]}
    out = []
    for label, group in _by_sampler(document["acceptance"]).items():
        off = [e for e in group if _off_target(e["tv_output"])]
        theories = [e["theory"]["emitted"] for e in group if e["theory"]]
        zs = [abs(e["z"]["emitted"]) for e in group if e["z"]]
        excess = [
            e["tv_output"]["exact"] if e["tv_output"].get("exact") is not None else e["tv_output"]["excess"]
            for e in group
        ]
        lossless = declared.get(label)
        times = [
            t["time_s"] * 1e3
            for t in document["timing"]
            if t["sampler"] == label and shape is not None and (t["batch_size"], t["dtype"]) == shape
        ]
        worst = sorted(off, key=lambda e: -(e["tv_output"].get("exact") or e["tv_output"]["estimate"]))[:3]
        out.append(
            {
                "sampler": label,
                "lossless_declared": lossless,
                "settings": len(group),
                "settings_off_target": len(off),
                "lossless_measured": not off,
                "verdict": ("yes" if lossless else "NO" if lossless is False else "?")
                + (f", {len(off)}/{len(group)} off" if off or lossless is False else ""),
                "emitted": sum(e["emitted"] for e in group) / len(group),
                "theory_emitted": sum(theories) / len(theories) if len(theories) == len(group) else None,
                "max_abs_z": max(zs) if zs else None,
                "worst_tv_excess": max(excess),
                "ms_per_call": times[0] if times else None,
                "ms_per_call_at": None if shape is None else {"batch_size": shape[0], "dtype": shape[1]},
                "off_examples": [
                    {
                        "setting": e["setting"]["name"],
                        "acceptance": e["acceptance"],
                        "tv_output": e["tv_output"].get("exact") or e["tv_output"]["estimate"],
                    }
                    for e in worst
                ],
            }
        )
    return out


def summary(document: dict[str, Any]) -> str:
    """One line per sampler variant (:func:`sampler_summary`): lossless or lossy (declared, and as
    this run measured it), tokens per step against the lossless theory, the output's distance from
    the target against its noise floor, and the time per call at one named shape."""
    shape = _summary_shape(document["timing"])
    config = document["config"]
    where = ""
    if shape is not None:
        t0 = document["timing"][0]
        where = f"; ms/call: median time per call at B = {shape[0]}, V = {t0['vocab_size']}, {shape[1]}, {t0['device']}"
    rows = []
    notes = []
    for s in sampler_summary(document):
        zs = s["max_abs_z"]
        rows.append(
            [
                s["sampler"],
                s["verdict"],
                _f(s["emitted"], 2),
                _f(s["theory_emitted"], 2),
                "-" if zs is None else f"{zs:.1f}",
                f"{s['worst_tv_excess']:+.3f}",
                _f(s["ms_per_call"], 2),
            ]
        )
        if s["off_examples"]:
            cells = ", ".join(
                f"{e['setting']} (accept {e['acceptance']:.3f}, TV out {e['tv_output']:.2f})" for e in s["off_examples"]
            )
            note = (
                f"{s['sampler']}: its output is off the target on {s['settings_off_target']} settings, e.g. {cells}: "
                "acceptance there is not a win, the tokens follow another distribution."
            )
            notes.append(textwrap.fill(note, WIDTH, initial_indent="  ", subsequent_indent="    "))
    headers = ["sampler", "lossless?", "emitted", "theory", "max |z|", "TV excess", "ms/call"]
    table = _table(headers, rows, [False, False] + [True] * 5)
    legend = (
        f"Summary (k = {config['k']}). emitted: tokens per step, theory: the lossless theory's, means over "
        f"the {len(document['settings'])} settings; max |z|: their worst gap in standard errors. "
        f"lossless?: declared, and 'n/m off' where the run's TV out exceeds its noise floor by > {LOSSY_Z:g} sd "
        f"(exact TV > {EXACT_TV_LOSSY:g}); TV excess: the worst TV out minus its floor{where}."
    )
    return "\n".join(["", textwrap.fill(legend, WIDTH), table, *notes])


def render(document: dict[str, Any]) -> str:
    """The terminal report: acceptance (or the sweep summary), then timing."""
    machine, config = document["machine"], document["config"]
    parts = [
        f"spec-samplers bench: {machine['device']} ({machine['device_name']}), torch {machine['torch']}",
        f"threads={config['threads']}, k={config['k']}, {config['rows']} rows per context",
    ]
    swept = [e for e in document["acceptance"] if _is_swept(document, e)]
    plain = [e for e in document["acceptance"] if not _is_swept(document, e)]
    if plain:
        parts += [
            "",
            "Acceptance. accept: accepted/proposed drafts, all positions; pos 1: acceptance at",
            "position 1; theory and z (in standard errors) for lossless samplers. TV out: first",
            "emitted token vs target, exact where computable (floor 'exact'), else an estimate;",
            "floor: the estimate's exact mean ± sd on exact samples (a lossless sampler's TV out",
            "lies within ~2 sd of it; excess_z in --json). Per-position rates: --json.",
            "",
            acceptance_table(plain),
        ]
    block_table = block_vs_token_table(plain)
    if block_table is not None:
        parts += [
            "",
            "Block verification vs token-wise rejection: mean accepted drafts per step, same",
            "drafts and seeds; theory: token-wise closed form, block E[rho_1 + ... + rho_k] by",
            "Monte Carlo (closed form for point-mass drafts).",
            "",
            block_table,
        ]
    if swept:
        names = sorted({k for s in document["samplers"] if s["swept"] for k in s["swept"]})
        parts += [
            "",
            "Sweep: means over settings (per-setting rows in --json); TV out exact, or ~ an",
            "estimate; TV excess: TV out minus the estimate's noise floor (exact: TV out itself).",
            sweep_table(swept, names),
        ]
    if document["timing"]:
        parts += [
            "",
            "Time per call (MB: inputs + output; floor MB: 2*B*V*itemsize, docs/design.md section 6)",
            timing_table(document["timing"]),
        ]
    if document["acceptance"]:
        parts.append(summary(document))
    return "\n".join(parts)


def _is_swept(document: dict[str, Any], entry: dict[str, Any]) -> bool:
    for s in document["samplers"]:
        if s["label"] == entry["sampler"]:
            return bool(s["swept"])
    return False
