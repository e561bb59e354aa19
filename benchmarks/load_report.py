"""Figure 7 (load on two worker processes) in the summary, the Targets table and
``docs/benchmarks.md`` (``report.py`` only calls these)."""

from __future__ import annotations

from .load import EVENT_LOOP, POSTGRES, RATIO_MIN, SQLITE, THREADS, UNGATED, Load
from .stats import Dist

#: (figure, target, measured, met)
Row = tuple[str, str, str, bool]


def _ms(value: float) -> str:
    return f"{value:.2f} ms"


def _p(d: Dist | None) -> str:
    return "—" if d is None else f"{_ms(d.p50)} / {_ms(d.p99)}"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _groups(load: Load) -> list[str]:
    """The thread groups the run saw, in ``THREADS``'s order, the event loop first."""
    seen = {g for parts in load.cpu_threads_ms.values() for g in parts}
    named = [EVENT_LOOP, *dict.fromkeys(g for _, g in THREADS), "other"]
    return [g for g in named if g in seen]


def targets(load: Load) -> list[Row]:
    out: list[Row] = []
    for name in (SQLITE, POSTGRES):
        if name not in load.per_s:
            continue
        own = load.dist(load.own_ms, name)
        wait = load.dist(load.loop_wait_ms, name)
        split = (
            ""
            if own is None or wait is None
            else f"; gate p50/p99: own {_ms(own.p50)}/{_ms(own.p99)}, "
            f"waiting for the loop {_ms(wait.p50)}/{_ms(wait.p99)}"
        )
        out.append(
            (
                f"Load: {load.n:,} workflows, one effect each, {load.processes} worker processes, "
                f"gated ({name.removeprefix('gated, ')}) ÷ ungated throughput",
                f"≥ {RATIO_MIN:g}",
                f"{load.ratio(name):.2f} ({load.median(name):,.0f} / "
                f"{load.median(UNGATED):,.0f} workflows/s; round by round, median "
                f"{_median(load.round_ratios(name)):.2f}){split}",
                load.ratio(name) >= RATIO_MIN,
            )
        )
    return out


def summary(load: Load) -> list[str]:
    lines = [
        f"7. load, {load.n:,} workflows on {load.processes} worker processes: "
        + "; ".join(
            f"{name} {load.median(name):,.0f}/s (x{load.ratio(name):.2f})" for name in load.per_s
        )
    ]
    for name in load.gate_ms:
        lines.append(
            f"   {name}: gate p50/p99 {_p(load.dist(load.gate_ms, name))}, own "
            f"{_p(load.dist(load.own_ms, name))}, waiting for the loop "
            f"{_p(load.dist(load.loop_wait_ms, name))}"
        )
    return lines


def section(load: Load, command: str) -> list[str]:
    lines = [
        f"## 7. Load: {load.n:,} workflows, one effect each, on {load.processes} worker processes",
        "",
        f"Command: `{command}` (alone: `python -m benchmarks --only load --out FILE`). One real "
        "Temporal dev server, one throwaway PostgreSQL cluster; each configuration has its own "
        f"task queue and {load.processes} worker processes of its own "
        "(`python -m benchmarks.load_worker`, up to 100 activities at once each), all polling "
        "from the start. Ungated: no plugin. Gated: `InterlockPlugin`, the activity under "
        "`@gated` with an in-memory target, a lease checked on every effect; SQLite: one "
        "journal file both processes share; PostgreSQL: one database. Each workflow runs one "
        "activity. Configurations run in rounds, shuffled each round, on the same server "
        f"(round 0 warms up and is not counted; {load.rounds} counted). Throughput: workflows "
        "÷ the wall time from the first start to the last result (the client keeps up to 64 "
        "start calls in flight).",
        "",
        "| configuration | workflows/s, median | ÷ ungated | rounds (workflows/s) |",
        "|---|---|---|---|",
    ]
    for name, values in load.per_s.items():
        lines.append(
            f"| {name} | {load.median(name):,.0f} | {load.ratio(name):.2f} | "
            + ", ".join(f"{v:,.0f}" for v in values)
            + " |"
        )
    lines.append("")
    for name in (SQLITE, POSTGRES):
        if name in load.per_s:
            ratios = load.round_ratios(name)
            lines.append(
                f"{name} ÷ ungated, round by round (each configuration once per round): "
                + ", ".join(f"{r:.2f}" for r in ratios)
                + f"; median {_median(ratios):.2f} (the figure above is the ratio of the "
                "medians).",
            )
    lines += [
        "",
        "The gate's time per effect, counted rounds (ms, p50 / p99). *Recorded*: `gate_ms` in "
        "the effect's COMMITTED entry (the claim to the dispatch transaction durable and the "
        "gate's coroutine running again, plus the commit's preparation). *Waiting for the "
        "loop*: from the journal's writer thread ending the dispatch transaction's batch to "
        "the gate's coroutine running again (`Journal.observe_appends` in the worker process). "
        "*Own*: recorded minus that wait. Within own: *queued*, the dispatch append waiting "
        "for its batch to begin (the batch before it on the writer, and `commit_delay`), and "
        "*queued → written*. *Commit append waiting for the loop*: the same wait for the "
        "COMMITTED transaction, outside `gate_ms`.",
        "",
        "| configuration | recorded | waiting for the loop | own | queued | queued → written "
        "| commit append waiting for the loop | appends per batch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in load.gate_ms:
        lines.append(
            f"| {name} | {_p(load.dist(load.gate_ms, name))} | "
            f"{_p(load.dist(load.loop_wait_ms, name))} | {_p(load.dist(load.own_ms, name))} | "
            f"{_p(load.dist(load.queue_ms, name))} | {_p(load.dist(load.write_ms, name))} | "
            f"{_p(load.dist(load.commit_wait_ms, name))} | {load.batch.get(name, 0.0):.1f} |"
        )
    for name, values in load.begin_ms.items():
        d = Dist.of(values)
        lines += [
            "",
            f"{name}: the write lock both processes share. `BEGIN IMMEDIATE` of the "
            f"{d.n:,} write transactions of the counted rounds (it runs on the worker's event "
            f"loop, and waits there while the other process holds the lock): p50 {_ms(d.p50)}, "
            f"p90 {_ms(d.p90)}, p99 {_ms(d.p99)}, max {_ms(d.max)}.",
        ]
    lines += [
        "",
        "CPU per workflow in the counted rounds (ms; `/proc`): the worker processes, the "
        "Temporal dev server, PostgreSQL, and the benchmark's client.",
        "",
        "| configuration | workers | Temporal server | PostgreSQL | client |",
        "|---|---|---|---|---|",
    ]
    for name, parts in load.cpu_ms.items():
        lines.append(
            f"| {name} | {parts.get('workers', 0.0):.2f} | {parts.get('temporal', 0.0):.2f} | "
            f"{parts.get('postgres', 0.0):.2f} | {parts.get('client', 0.0):.2f} |"
        )
    lines += ["", *_reading(load), *_by_thread(load)]
    return lines


def _by_thread(load: Load) -> list[str]:
    """The worker processes' CPU per workflow split by thread, and what the gate adds to each
    (a thread's name at the OS level, read from ``/proc``; ``load_worker`` names its Python
    threads there)."""
    groups = _groups(load)
    if not groups or UNGATED not in load.cpu_threads_ms:
        return []
    lines = [
        "",
        "The worker processes' CPU per workflow by thread (ms; `/proc/<pid>/task`): the "
        "thread that runs the event loop (the activities, the gate, the journal's statements, "
        "the SDK's Python side), the journal's writer thread (each batch's COMMIT and its "
        "flush to disk), the journal's WAL checkpointer, the SDK's workflow-task threads "
        "(the workflows' code, `act_as` signing its header), and the SDK's core (Rust: gRPC "
        "to the server, polling).",
        "",
        "| configuration | " + " | ".join(groups) + " |",
        "|---|" + "---|" * len(groups),
    ]
    for name, by_group in load.cpu_threads_ms.items():
        cells = " | ".join(f"{by_group.get(g, 0.0):.2f}" for g in groups)
        lines.append(f"| {name} | {cells} |")
    base = load.cpu_threads_ms[UNGATED]
    for name in (SQLITE, POSTGRES):
        gated = load.cpu_threads_ms.get(name)
        if gated is None:
            continue
        added = ", ".join(f"{g} {gated.get(g, 0.0) - base.get(g, 0.0):+.2f} ms" for g in groups)
        lines += ["", f"{name}, added per workflow: {added}."]
    return lines


def _reading(load: Load) -> list[str]:
    """What the figure says, from this run's own numbers: where the CPU of a workflow goes, and
    the throughput ratio the CPU alone predicts beside the one measured."""
    if UNGATED not in load.cpu_ms:
        return []
    base = load.cpu_ms[UNGATED]
    total = sum(base.values())
    out = [
        f"Reading: ungated, a workflow costs {total:.2f} ms of CPU in all, "
        f"{base.get('temporal', 0.0):.2f} ms of it in the Temporal server."
    ]
    for name in (SQLITE, POSTGRES):
        parts = load.cpu_ms.get(name)
        if parts is None:
            continue
        gated = sum(parts.values())
        out.append(
            f"{name}: {gated - total:+.2f} ms in all (workers "
            f"{parts.get('workers', 0.0) - base.get('workers', 0.0):+.2f} ms, Temporal server "
            f"{parts.get('temporal', 0.0) - base.get('temporal', 0.0):+.2f} ms, PostgreSQL "
            f"{parts.get('postgres', 0.0) - base.get('postgres', 0.0):+.2f} ms): "
            f"by CPU alone a ratio of {total / gated:.2f} (measured {load.ratio(name):.2f})."
        )
    return [" ".join(out)]
