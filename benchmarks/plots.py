"""The benchmark report's plots: SVGs drawn from the same run's results, shown beside the tables
of ``docs/benchmarks.md`` (``python -m benchmarks`` writes them next to the markdown).

The problem: the tables give every figure, but a shape (the gate against its floor as the journal
grows, throughput as activities in flight rise, verify as processes are added) is read faster
from a line than from a row of numbers. The mechanism: one function per plot, each fed from its
figure's result object alone (no plot for a figure the run did not measure), drawn with
matplotlib's object API (no pyplot state) on the non-interactive Agg backend, saved as SVG with a
fixed ``svg.hashsalt``, text kept as text and no date, so a rerun with the same figures writes
the same bytes and a new run's diff is its numbers. The cost: matplotlib (a dev dependency,
about 0.6 s to import), well under a second and some 15 to 30 kB per plot.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .gate_cost import GateCost
from .report import GATE_FLOOR_RATIO_MAX, Report
from .throughput import CONCURRENCY, PG, SWEEP_CONFIGS, Throughput
from .verify_cost import TARGET_PER_S, VerifyCost

#: each plot's file, by the figure (``--only``'s name) it is drawn from
FILES = {
    "gate": "gate-latency.svg",
    "throughput": "throughput-in-flight.svg",
    "verify": "verify-jobs.svg",
}
#: fixed, so that the SVG's element ids do not change from run to run
HASH_SALT = "interlock-temporal-benchmarks"
#: the configurations' colours, the same in every plot
COLOURS = {
    "ungated": "#4c72b0",
    "gated, SQLite": "#dd8452",
    PG: "#55a868",
    "floor": "#8c8c8c",
    "target": "#c44e52",
}


@contextmanager
def _figure(path: Path, title: str) -> Iterator[Axes]:
    """An axes to draw on; on leaving, the figure saved as ``path`` (SVG, reproducible)."""
    with matplotlib.rc_context({"svg.hashsalt": HASH_SALT, "svg.fonttype": "none", "font.size": 9}):
        figure = Figure(figsize=(6.4, 3.6), layout="constrained")
        axes = figure.subplots()
        axes.set_title(title)
        axes.grid(True, axis="y", linewidth=0.5, alpha=0.5)
        yield axes
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="svg", metadata={"Date": None})


def gate_latency(g: GateCost, path: Path) -> Path:
    """Figure 1: the gate's p50 and p99 per new effect by journal size, against the two-commit
    floor (2 x the bare SQLite commit's p50, the same rounds) and the target's multiple of it."""
    sizes = [f"{s.size_at_start:,}" for s in g.series]
    floor2 = 2 * g.floor_sqlite_us.p50 / 1000
    with _figure(path, "Gate cost per new effect by journal size (SQLite)") as ax:
        x = range(len(sizes))
        ax.plot(x, [s.net_us.p50 / 1000 for s in g.series], "o-", label="gate p50")
        ax.plot(x, [s.net_us.p99 / 1000 for s in g.series], "s--", label="gate p99")
        ax.axhline(floor2, color=COLOURS["floor"], label="two-commit floor (2 x bare commit p50)")
        ax.axhline(
            GATE_FLOOR_RATIO_MAX * floor2,
            color=COLOURS["target"],
            linestyle=":",
            label=f"target: p50 ≤ {GATE_FLOOR_RATIO_MAX:g} x the floor",
        )
        ax.set_xticks(list(x), sizes)
        ax.set_xlim(-0.5, len(sizes) - 0.5)
        ax.set_xlabel("journal size at start (effects)")
        ax.set_ylabel("ms per new effect")
        # room above the highest line for the legend, so it never covers a point
        top = max([*(s.net_us.p99 / 1000 for s in g.series), GATE_FLOOR_RATIO_MAX * floor2])
        ax.set_ylim(0, top * 1.6)
        ax.legend(loc="upper center", fontsize=8, ncols=2)
    return path


def throughput_in_flight(t: Throughput, path: Path) -> Path | None:
    """Figure 6: activities per second by activities in flight, ungated and gated on both
    journals: the medians (lines) and each level's runs from slowest to fastest (bars); the
    ``CONCURRENCY`` point is the rounds' (the target's). None: the run had no sweep."""
    curves = {name: t.in_flight(name) for name in SWEEP_CONFIGS}
    curves = {name: runs for name, runs in curves.items() if runs}
    if not curves:
        return None
    with _figure(path, "Throughput by activities in flight (one worker, real server)") as ax:
        for name, runs in curves.items():
            levels = list(runs)
            medians = [_median(v) for v in runs.values()]
            spread = [
                [m - min(v) for m, v in zip(medians, runs.values(), strict=True)],
                [max(v) - m for m, v in zip(medians, runs.values(), strict=True)],
            ]
            ax.errorbar(
                levels,
                medians,
                yerr=spread,
                fmt="o-",
                capsize=3,
                color=COLOURS.get(name),
                label=name,
            )
        ax.set_xscale("log", base=2)
        levels = sorted({level for runs in curves.values() for level in runs})
        ax.set_xticks(
            levels,
            [
                f"{level}\n(the target's)" if level == CONCURRENCY else str(level)
                for level in levels
            ],
        )
        ax.minorticks_off()
        ax.set_xlabel("activities in flight (max_concurrent_activities)")
        ax.set_ylabel("activities per second")
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower right", fontsize=8)
    return path


def verify_jobs(v: VerifyCost, path: Path) -> Path:
    """Figure 5: ``journal verify``'s entries per second by ``--jobs``, each signature scheme a
    bar (the median run, labelled with the processes it used) with its best run marked, against
    the target."""
    schemes = list(dict.fromkeys(run.scheme for run in v.runs))
    jobs = sorted({run.jobs for run in v.runs})
    width = 0.8 / len(schemes)
    top = max(TARGET_PER_S, *(run.best_per_s for run in v.runs))
    with _figure(path, "journal verify: entries per second by --jobs") as ax:
        for i, scheme in enumerate(schemes):
            runs = {run.jobs: run for run in v.runs if run.scheme == scheme}
            shift = (i - (len(schemes) - 1) / 2) * width
            at = [k + shift for k, j in enumerate(jobs) if j in runs]
            mine = [runs[j] for j in jobs if j in runs]
            bars = ax.bar(at, [run.median_per_s for run in mine], width, label=f"{scheme}, median")
            ax.bar_label(
                bars,
                labels=[
                    f"{run.median_per_s / 1000:,.0f}k/s\n{run.used} process"
                    + ("es" if run.used > 1 else "")
                    for run in mine
                ],
                fontsize=7,
                padding=2,
            )
            ax.plot(
                at,
                [run.best_per_s for run in mine],
                "_",
                markersize=14,
                markeredgecolor="black",
                label="best run" if i == len(schemes) - 1 else None,
            )
        ax.axhline(
            TARGET_PER_S,
            color=COLOURS["target"],
            linestyle=":",
            label=f"target: ≥ {TARGET_PER_S:,}/s (HMAC, every core)",
        )
        ax.set_xticks(range(len(jobs)), [str(j) for j in jobs])
        ax.set_xlabel("--jobs (the processes each run used under its bar)")
        ax.set_ylabel("entries per second")
        ax.set_ylim(0, top * 1.45)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        ax.legend(loc="upper left", fontsize=8, ncols=2)
    return path


def write(report: Report, directory: Path) -> dict[str, Path]:
    """The plots of the figures ``report`` holds, into ``directory``: figure → file written."""
    out: dict[str, Path] = {}
    if report.gate is not None:
        out["gate"] = gate_latency(report.gate, directory / FILES["gate"])
    if report.throughput is not None:
        drawn = throughput_in_flight(report.throughput, directory / FILES["throughput"])
        if drawn is not None:
            out["throughput"] = drawn
    if report.verify is not None:
        out["verify"] = verify_jobs(report.verify, directory / FILES["verify"])
    return out


def _median(values: list[float]) -> float:
    """The upper median, as ``Throughput.median`` takes it."""
    return sorted(values)[len(values) // 2]
