"""The ``--plot`` PNG: acceptance and emitted tokens vs divergence per sampler, time vs batch
size, and (when a sweep ran) acceptance vs the output's TV from the target."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any


def require_pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError(
            "--plot needs matplotlib: pip install matplotlib (or pip install -e '.[bench]' in a checkout)"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _short(option: str) -> str:
    return option[len("posterior_") :] if option.startswith("posterior_") else option


def _group(entries: Sequence[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        groups.setdefault(e[key], []).append(e)
    return groups


def _plain_ticks(ax) -> None:
    """Log axes tick as plain numbers (1, 2, 5, 10, 0.5), not 2x10^0."""
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(fmt)
        axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))


def _label_point_mass(ax, group: Sequence[dict[str, Any]], y_key) -> None:
    """Name the point-mass setting next to its points (its drafts are one-hot: p(x) = 1)."""
    for e in group:
        if e["setting"].get("kind") == "point":
            ax.annotate(
                "point-mass drafts",
                (e["tv_draft_target"], y_key(e)),
                fontsize=6,
                xytext=(-4, 4),
                textcoords="offset points",
                ha="right",
            )


def _tv_out(e: dict[str, Any]) -> float:
    """TV(output, target): exact where computable, else the estimate's excess over its floor."""
    tv = e["tv_output"]
    return tv["exact"] if tv.get("exact") is not None else tv["excess"]


MARKERS = "osD^v<>" * 9


def _first_sampler(plain: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first sampler's entries (one label per setting is enough)."""
    return [e for e in plain if e["sampler"] == plain[0]["sampler"]] if plain else []


def _sampler_points(
    ax,
    plain: Sequence[dict[str, Any]],
    samplers: dict[str, dict[str, Any]],
    measured: Callable[[dict[str, Any]], float],
    expected: Callable[[dict[str, Any]], float],
) -> None:
    """Each sampler's measured points. A lossy sampler's are hollow red, marked LOSSY with the
    output's TV from the target at each point (above the lossless curve is not a win there); a
    sampler with a law of its own (block verification) gets its own expectation as dashes, since
    the token-wise curve is not what it is measured against."""
    for m, (label, group) in zip(MARKERS, _group(plain, "sampler").items()):
        info = samplers.get(label, {})
        xs = [e["tv_draft_target"] for e in group]
        ys = [measured(e) for e in group]
        if info.get("lossless") is False:
            worst = max(_tv_out(e) for e in group)
            name = f"{label} (LOSSY: output TV up to {worst:.2f})"
            ax.scatter(xs, ys, marker=m, facecolors="none", edgecolors="r", label=name)
            for x, y, e in zip(xs, ys, group):
                ax.annotate(f"TV out {_tv_out(e):.2f}", (x, y), fontsize=5, color="r", xytext=(3, -7),
                            textcoords="offset points")  # fmt: skip
            continue
        points = ax.scatter(xs, ys, marker=m, label=label, alpha=0.8)
        if info.get("law", "token") != "token" and all(e["theory"] for e in group):
            color = points.get_facecolor()[0]
            theory = [expected(e) for e in group]
            ax.scatter(xs, theory, marker="_", s=160, color=color, label=f"{label}: its own expectation")


def acceptance_panel(ax, plain: Sequence[dict[str, Any]], samplers: dict[str, dict[str, Any]]) -> None:
    """Acceptance at the first position against TV(draft, target), with the lossless line 1 - TV."""
    xs = [i / 100 for i in range(101)]
    ax.plot(xs, [1 - x for x in xs], "k--", lw=1, label="lossless theory 1 - TV")
    _sampler_points(ax, plain, samplers, lambda e: e["per_position"][0], lambda e: e["theory"]["per_position"][0])
    _label_point_mass(ax, _first_sampler(plain), lambda e: e["per_position"][0])
    ax.set(
        xlabel="TV(draft, target)",
        ylabel="acceptance at position 1 (first draft)",
        title="Acceptance at position 1 vs divergence",
        xlim=(0, 1),
        ylim=(0, 1.02),
    )
    ax.legend(fontsize=7)


def emitted_panel(ax, plain: Sequence[dict[str, Any]], k: int, samplers: dict[str, dict[str, Any]]) -> None:
    """Tokens emitted per step against TV(draft, target), with the lossless curve."""
    xs = [i / 100 for i in range(101)]
    ax.plot(
        xs, [sum((1 - x) ** i for i in range(k + 1)) for x in xs], "k--", lw=1, label=f"(1-a^{k + 1})/(1-a), a = 1 - TV"
    )
    _sampler_points(ax, plain, samplers, lambda e: e["emitted"], lambda e: e["theory"]["emitted"])
    _label_point_mass(ax, _first_sampler(plain), lambda e: e["emitted"])
    ax.set(
        xlabel="TV(draft, target)",
        ylabel="tokens emitted per step (all positions)",
        title=f"Emitted tokens (k={k})",
        xlim=(0, 1),
        ylim=(0, k + 1.1),
    )
    ax.legend(fontsize=7)


def _mean_point(group: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """(TV out, acceptance), each the mean over the group's settings."""
    n = len(group)
    return sum(_tv_out(e) for e in group) / n, sum(e["acceptance"] for e in group) / n


def sweep_panel(
    ax, swept: Sequence[dict[str, Any]], plain: Sequence[dict[str, Any]], samplers: Sequence[dict[str, Any]]
) -> None:
    """The speed/quality trade-off of a sweep: acceptance against TV(output, target), one line per
    value of the first swept option through the values of the others; lossless samplers as stars."""
    series: dict[str, list[tuple[float, float, str]]] = {}
    for label, group in _group(swept, "sampler").items():
        keys = next(s["swept"] for s in samplers if s["label"] == label)
        opts = group[0]["options"]
        head = f"{group[0]['name']} {_short(keys[0])}={opts[keys[0]]:g}" if keys else group[0]["name"]
        rest = ", ".join(f"{_short(key)}={opts[key]:g}" for key in keys[1:])
        series.setdefault(head, []).append((*_mean_point(group), rest))
    seen: set[tuple[float, float]] = set()
    for m, (head, points) in zip(MARKERS, series.items()):
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=m, label=head, alpha=0.8)
        for tv, acc, rest in points:
            spot = (round(tv, 3), round(acc, 3))
            if rest and spot not in seen:
                seen.add(spot)
                ax.annotate(rest, (tv, acc), fontsize=6, xytext=(3, 2), textcoords="offset points")
    lossless = {s["label"] for s in samplers if s["lossless"]}
    for label, group in _group(plain, "sampler").items():
        if label in lossless:
            tv, acc = _mean_point(group)
            ax.scatter([tv], [acc], marker="*", s=120, color="k", label=f"{label} (lossless)")
    ax.set(
        xlabel="TV(output, target): exact at position 1 where computable, else the estimate's\n"
        "excess over its noise floor (mean over settings)",
        ylabel="acceptance, all positions (mean over settings)",
        title="Speed/quality trade-off",
    )
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def timing_panel(ax, timing: Sequence[dict[str, Any]]) -> None:
    """Time per call against batch size, one line per sampler and dtype (log-log)."""
    for m, (_label, group) in zip(MARKERS, _group(timing, "sampler").items()):
        for dtype, rows in _group(group, "dtype").items():
            rows = sorted(rows, key=lambda e: e["batch_size"])
            ax.plot(
                [e["batch_size"] for e in rows],
                [e["time_s"] * 1e3 for e in rows],
                marker=m,
                label=f"{rows[0]['name']} {dtype}",
            )
    first = timing[0]
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="batch size B",
        ylabel="ms per call",
        title=f"Time per call ({first['device']}, k={first['k']}, V={first['vocab_size']})",
    )
    _plain_ticks(ax)
    ax.legend(fontsize=7)


def write_plot(path: str, document: dict[str, Any]) -> None:
    """The PNG of a ``spec-samplers bench`` document: one panel per part that ran."""
    plt = require_pyplot()
    swept_labels = {s["label"] for s in document["samplers"] if s["swept"]}
    plain = [e for e in document["acceptance"] if e["sampler"] not in swept_labels]
    swept = [e for e in document["acceptance"] if e["sampler"] in swept_labels]
    panels: list[Callable[[Any], None]] = []
    samplers = {s["label"]: s for s in document["samplers"]}
    if plain:
        panels.append(lambda ax: acceptance_panel(ax, plain, samplers))
        panels.append(lambda ax: emitted_panel(ax, plain, document["config"]["k"], samplers))
    if swept:
        panels.append(lambda ax: sweep_panel(ax, swept, plain, document["samplers"]))
    if document["timing"]:
        panels.append(lambda ax: timing_panel(ax, document["timing"]))
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5.2 * max(1, len(panels)), 4.4), squeeze=False)
    for draw, ax in zip(panels, axes[0]):
        draw(ax)
    machine = document["machine"]
    title = f"spec-samplers bench - {machine['device_name']} - torch {machine['torch']} - {machine['date'][:10]}"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
