"""The throughput figure's text is computed from its own numbers: ratios of medians, the
per-round ratios beside them, and the CPU reading; the policy figure's targets say met or
missed, and whether SHACKLE's decide() was measured beside ours."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from benchmarks import plots
from benchmarks.crash_recovery import CrashRecovery, Run, Settings
from benchmarks.crash_report import section as crash_section
from benchmarks.crash_report import targets as crash_targets
from benchmarks.gate_cost import GateCost, Profile, Series, StatementCount
from benchmarks.load import EVENT_LOOP, POSTGRES, SQLITE, UNGATED, Load, thread_cpu_seconds
from benchmarks.load_report import section as load_section
from benchmarks.load_report import targets as load_targets
from benchmarks.load_worker import name_os_threads
from benchmarks.machine import Filesystem, Machine
from benchmarks.policy_cost import PolicyCost
from benchmarks.report import (
    Report,
    Target,
    _decide_targets,
    _floor_target_lines,
    _policy_section,
    _throughput_section,
    markdown,
)
from benchmarks.stats import Dist
from benchmarks.throughput import JOURNAL_ONLY, NO_DELAY, PG, PLUGIN_ONLY, Throughput
from benchmarks.wal_pages import WalPages


def test_the_throughput_section_shows_each_rounds_ratio_beside_the_medians() -> None:
    t = Throughput(
        n=640,
        rounds=3,
        per_s={
            "ungated": [400.0, 300.0, 420.0],
            PLUGIN_ONLY: [390.0, 310.0, 400.0],
            "gated, SQLite": [320.0, 250.0, 280.0],
        },
        cpu_ms={"ungated": (1.5, 3.0), PLUGIN_ONLY: (1.6, 3.0), "gated, SQLite": (2.5, 3.3)},
    )
    text = "\n".join(_throughput_section(t, "python -m benchmarks"))
    # medians 400 and 280: the headline is the ratio of the medians
    assert "| gated, SQLite | 320, 250, 280 | 280/s | 1.43 | 2.50 ms | 3.30 ms |" in text
    assert "round by round (each configuration once per round): 1.25, 1.20, 1.50." in text
    assert "adds 1.00 ms in the worker and +0.30 ms in the server" in text
    # 1.30 ms on 4.50: the CPU's ratio beside the throughputs' (400 / 280)
    assert "1.30 ms in all: by CPU alone a ratio of 1.29 (the throughputs measured give 1.43)" in (
        text
    )


def test_the_postgresql_configuration_gets_its_cpu_reading_and_its_own_target() -> None:
    t = Throughput(
        n=640,
        rounds=1,
        per_s={"ungated": [400.0], "gated, SQLite": [320.0], PG: [250.0]},
        cpu_ms={"ungated": (1.5, 3.0), "gated, SQLite": (2.5, 3.2), PG: (3.0, 3.5)},
    )
    text = "\n".join(_throughput_section(t, "python -m benchmarks"))
    # 1.5 + 0.5 on 4.5: 1.44 by CPU; 400 / 250 = 1.60 measured; 1.35 allows 0.35 x 4.5
    assert (
        "With PostgreSQL the gate adds 1.50 ms in the worker and +0.50 ms in the Temporal "
        "server per activity" in text
    )
    assert "by that CPU alone a ratio of 1.44 (measured 1.60); 1.35 is an addition of 1.58 ms" in (
        text
    )
    without = Throughput(
        n=640,
        rounds=1,
        per_s={k: v for k, v in t.per_s.items() if k != PG},
        cpu_ms={k: v for k, v in t.cpu_ms.items() if k != PG},
    )
    assert "With PostgreSQL" not in "\n".join(_throughput_section(without, "python -m benchmarks"))


def test_the_configurations_in_between_split_the_gates_cost() -> None:
    t = Throughput(
        n=640,
        rounds=1,
        per_s={
            "ungated": [400.0],
            PLUGIN_ONLY: [380.0],
            JOURNAL_ONLY: [350.0],
            "gated, SQLite": [320.0],
        },
        cpu_ms={
            "ungated": (1.5, 3.0),
            PLUGIN_ONLY: (1.6, 3.0),
            JOURNAL_ONLY: (2.0, 3.1),
            "gated, SQLite": (2.5, 3.2),
        },
    )
    text = "\n".join(_throughput_section(t, "python -m benchmarks"))
    assert (
        "the interceptor without a gate +0.10 ms in the worker, +0.00 ms in the server "
        "(ratio 1.00 → 1.05); the journal's writes +0.40 ms in the worker, +0.10 ms in the "
        "server (ratio 1.05 → 1.14); the gate's own work +0.50 ms in the worker, +0.10 ms in "
        "the server (ratio 1.14 → 1.25)"
    ) in text
    # without the configurations in between, no split is claimed
    t2 = Throughput(
        n=640,
        rounds=1,
        per_s={"ungated": [400.0], "gated, SQLite": [320.0]},
        cpu_ms={"ungated": (1.5, 3.0), "gated, SQLite": (2.5, 3.2)},
    )
    assert "split it" not in "\n".join(_throughput_section(t2, "python -m benchmarks"))


def test_the_commit_delays_share_is_read_from_its_own_configuration() -> None:
    per_s = {"ungated": [400.0], "gated, SQLite": [320.0]}
    cpu = {"ungated": (1.5, 3.0), "gated, SQLite": (2.5, 3.2)}
    t = Throughput(
        n=640,
        rounds=1,
        per_s={**per_s, NO_DELAY: [300.0]},
        cpu_ms={**cpu, NO_DELAY: (2.7, 3.2)},
    )
    text = "\n".join(_throughput_section(t, "python -m benchmarks"))
    assert (
        f"`{NO_DELAY}` turns it off: from it to `gated, SQLite` the ratio goes 1.33 → 1.25, "
        "worker CPU 2.70 → 2.50 ms per activity."
    ) in text
    # a run without that configuration claims nothing about it
    t2 = Throughput(n=640, rounds=1, per_s=per_s, cpu_ms=cpu)
    assert "turns it off" not in "\n".join(_throughput_section(t2, "python -m benchmarks"))


def _crash_run(setup: str, total: float, retry_start: float, **kw: Any) -> Run:
    """A crash run whose points (seconds after the kill) are spaced as the server's are."""
    return Run(
        index=1,
        scenario="crash_before_ack",
        tier=2,
        ok=True,
        final="COMMITTED",
        via="recovery-query",
        crash_to_completion_s=total,
        elapsed_s=total + 1,
        heartbeat_s=2.0,
        initial_interval_s=0.5,
        setup=setup,  # type: ignore[arg-type]
        last_attempt_started_s=retry_start,
        activity_completed_s=retry_start + 0.02,
        workflow_task_scheduled_s=retry_start + 0.02,
        workflow_task_queue="normal",
        workflow_task_started_s=retry_start + 0.03,
        workflow_completed_s=total - 0.01,
        **kw,
    )


def _crash(standby_total: float) -> CrashRecovery:
    fs = Filesystem(path="/x", fstype="ext4", device="/dev/x", mount_point="/")
    return CrashRecovery(
        directory="/x",
        filesystem=fs,
        runs=[_crash_run("fresh", 3.04, 2.98), _crash_run("fresh", 3.06, 2.99)],
        settings=Settings(heartbeat_s=2.0, initial_interval_s=0.5, sticky_timeout_s=1.0),
        seconds=10.0,
        standby=[_crash_run("standby", standby_total, standby_total - 0.05)],
    )


def test_the_standby_crash_target_is_judged_against_the_heartbeat_timeout() -> None:
    rows = {
        figure: (target, measured, met)
        for figure, target, measured, met in crash_targets(_crash(3.03))
    }
    target, measured, met = rows[
        "SIGKILL mid-send → workflow result, p50, standby worker already polling"
    ]
    assert target == "≤ heartbeat_timeout + 1 s = 3 s"
    assert measured.startswith("3.03 s = heartbeat_timeout + 1.03 s")
    assert "fresh worker beside it: 3.04 s" in measured
    assert not met
    assert dict((f, m) for f, _, _, m in crash_targets(_crash(2.95)))[
        "SIGKILL mid-send → workflow result, p50, standby worker already polling"
    ]


def test_the_crash_section_splits_the_time_into_stages_that_add_up() -> None:
    text = "\n".join(crash_section(_crash(3.03), "python -m benchmarks"))
    # the retry starts 2.98 s after the kill: 0.98 s after the 2 s heartbeat timeout
    assert (
        "| the server's retry: the completing attempt starts (history), minus the above "
        "| 0.98 s | 0.98 s |" in text
    )
    assert "| **SIGKILL → result (the figure)** | **3.04 s** | **3.03 s** |" in text
    assert "is missed by 0.03 s" in text
    assert "(3 on the normal queue, 0 on a sticky queue)" in text


def _policy(with_shackle: bool) -> PolicyCost:
    def dist(p50: float) -> Dist:
        return Dist(n=100, p50=p50, p90=p50, p95=p50, p99=p50 * 2, max=p50 * 3, min=p50, mean=p50)

    return PolicyCost(
        decide_us=dist(1.5),
        timer_overhead_us=0.04,
        check_ms=dist(0.5),
        floor_ms=dist(0.3),
        samples_decide=100,
        samples_check=100,
        block=25,
        shackle_config_us=dist(0.8),
        shackle_us=dist(0.5) if with_shackle else None,
        long_session_us=dist(3.5),
        long_session_window=14,
    )


def test_decides_targets_say_met_or_missed_and_whether_shackles_was_measured_beside() -> None:
    with_them = {t.figure: t for t in _decide_targets(_policy(with_shackle=True))}
    assert [t.met for t in with_them.values()] == [True, True, False]
    shackle_row = next(t for f, t in with_them.items() if "SHACKLE" in f)
    assert shackle_row.target == "≤ 0.9 µs"
    assert shackle_row.measured == (
        "0.80 µs (p99 1.60 µs); SHACKLE's, interleaved: 0.50 µs, ours ÷ SHACKLE's 1.60"
    )
    long_row = next(t for f, t in with_them.items() if "10,000 deliveries" in f)
    assert (long_row.target, long_row.met) == ("≤ 3 µs", False)
    text = "\n".join(_policy_section(_policy(with_shackle=True), "python -m benchmarks"))
    assert "| SHACKLE's `decide()`, its benchmark's inputs | 100 | 0.50 µs |" in text
    assert "ours ÷ SHACKLE's = 1.60 at p50" in text
    assert "window holds 14 calls of its activity" in text

    alone = _decide_targets(_policy(with_shackle=False))
    assert alone[0].measured == (
        "0.80 µs (p99 1.60 µs); ours alone: SHACKLE's decide.py was not given (recorded: 0.93 µs)"
    )
    text = "\n".join(_policy_section(_policy(with_shackle=False), "python -m benchmarks"))
    assert (
        "SHACKLE's `decide()` took 0.93 µs p50" in text and "SHACKLE's `decide()`, its" not in text
    )


def _load() -> Load:
    return Load(
        n=1000,
        rounds=3,
        processes=2,
        per_s={
            UNGATED: [40.0, 36.0, 30.0],
            SQLITE: [35.0, 34.0, 20.0],
            POSTGRES: [30.0, 30.0, 29.0],
        },
        gate_ms={SQLITE: [5.0, 6.0, 40.0], POSTGRES: [10.0, 12.0, 70.0]},
        loop_wait_ms={SQLITE: [0.5, 1.0, 3.0], POSTGRES: [0.5, 2.0, 4.0]},
        own_ms={SQLITE: [4.5, 5.0, 37.0], POSTGRES: [9.5, 10.0, 66.0]},
        cpu_ms={
            UNGATED: {"workers": 7.0, "temporal": 24.0, "postgres": 0.0, "client": 1.0},
            SQLITE: {"workers": 9.0, "temporal": 24.0, "postgres": 0.0, "client": 1.0},
            POSTGRES: {"workers": 11.0, "temporal": 24.5, "postgres": 1.5, "client": 1.0},
        },
        cpu_threads_ms={
            UNGATED: {"event loop": 3.0, "SDK core (Rust)": 2.5, "workflow tasks": 1.5},
            SQLITE: {
                "event loop": 4.5,
                "journal writer": 0.5,
                "WAL checkpointer": 0.25,
                "SDK core (Rust)": 2.5,
                "workflow tasks": 1.25,
            },
        },
    )


def test_the_load_targets_take_the_ratio_of_median_throughputs_and_split_the_gate() -> None:
    sqlite, postgres = load_targets(_load())
    # medians 36 (ungated), 34 and 30: 0.94 meets 0.9, 0.83 misses it
    assert sqlite[3] and not postgres[3]
    assert sqlite[2].startswith("0.94 (34 / 36 workflows/s;")
    assert "own 5.00 ms/37.00 ms, waiting for the loop 1.00 ms/3.00 ms" in sqlite[2]
    assert postgres[2].startswith("0.83 (30 / 36 workflows/s")
    # round by round: 35/40, 34/36, 20/30 -> 0.875, 0.944, 0.667: median 0.875 (not 0.94)
    assert "round by round, median 0.88" in sqlite[2]


def test_the_load_section_pairs_rounds_and_splits_the_workers_cpu_by_thread() -> None:
    text = "\n".join(load_section(_load(), "python -m benchmarks --only load"))
    assert "gated, SQLite ÷ ungated, round by round (each configuration once per round): " in text
    assert "0.88, 0.94, 0.67; median 0.88" in text
    # the event loop first, then THREADS' order; a group no configuration saw is left out
    assert (
        "| configuration | event loop | journal writer | WAL checkpointer | workflow tasks | "
        "SDK core (Rust) |" in text
    )
    assert "| gated, SQLite | 4.50 | 0.50 | 0.25 | 1.25 | 2.50 |" in text
    assert "| ungated | 3.00 | 0.00 | 0.00 | 1.50 | 2.50 |" in text
    assert (
        "gated, SQLite, added per workflow: event loop +1.50 ms, journal writer +0.50 ms, "
        "WAL checkpointer +0.25 ms, workflow tasks -0.25 ms, SDK core (Rust) +0.00 ms." in text
    )
    assert "gated, PostgreSQL, added per workflow" not in text  # not split in this run


def test_worker_threads_are_grouped_by_their_os_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threading.Thread, "run", threading.Thread.run)  # restored after
    name_os_threads()
    stop = threading.Event()
    spin = threading.Thread(target=lambda: stop.wait(5), name="interlock-journal_0")
    spin.start()
    try:
        time.sleep(0.1)
        groups = thread_cpu_seconds(os.getpid())
    finally:
        stop.set()
        spin.join()
    assert EVENT_LOOP in groups and "journal writer" in groups
    assert all(v >= 0 for v in groups.values())


def test_the_load_section_reads_the_cpu_ratio_beside_the_measured_one() -> None:
    text = "\n".join(load_section(_load(), "python -m benchmarks --only load"))
    assert "| gated, SQLite | 34 | 0.94 | 35, 34, 20 |" in text
    assert "| gated, SQLite | 6.00 ms / 40.00 ms | 1.00 ms / 3.00 ms | 5.00 ms / 37.00 ms |" in text
    # 32 ms ungated; PostgreSQL adds 4 + 0.5 + 1.5 = 6 ms: 32 / 38 = 0.84
    assert "a workflow costs 32.00 ms of CPU in all, 24.00 ms of it in the Temporal server" in text
    assert (
        "gated, PostgreSQL: +6.00 ms in all (workers +4.00 ms, Temporal server +0.50 ms, "
        "PostgreSQL +1.50 ms): by CPU alone a ratio of 0.84 (measured 0.83)" in text
    )


def test_the_floor_target_says_what_meeting_it_would_take_only_when_missed() -> None:
    # floor 300 us: 2x is 600; the durable part 700 alone is 2.33x the floor
    (line,) = _floor_target_lines(1_000.0, 700.0, 300.0)
    assert "What ≤ 2x the floor would take: **600 µs** per effect" in line
    assert "The durable part alone is 700 µs, 2.33x the floor's 300 µs" in line
    assert "the CPU part under 300 µs." in line
    assert _floor_target_lines(590.0, 200.0, 300.0) == []


@pytest.mark.parametrize(
    ("figure", "said", "plot"),
    [
        ("gate", "gate cost per new effect", "gate-latency.svg"),
        ("verify", "5. verify HMAC-SHA256", "verify-jobs.svg"),
    ],
)
def test_a_figure_whose_journal_must_verify_runs_end_to_end(
    figure: str, said: str, plot: str, tmp_path: Path
) -> None:
    """``python -m benchmarks --quick --only gate`` (figure 1: a prefilled journal of 10,000
    effects, verified, then the interleaved series) and ``--only verify`` (figure 5: a journal
    built of one real effect's entries, verified) run to their report. Both check that their
    journal verifies, and both stopped there once the leases were signed (issue 33): the
    prefill's count missed the lease's own chain, and figure 5's entries named a lease its
    journal did not hold. ``make bench`` is not in CI; this keeps it runnable. Each writes its
    plot beside the markdown (``bench/``), an SVG the markdown shows."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bench.md"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", figure, "--out", str(out)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert said in done.stdout and out.exists()
    assert f"](bench/{plot})" in out.read_text()
    assert len(_svg_texts(tmp_path / "bench" / plot)) > 5  # a title, ticks, a legend
    assert [p.name for p in (tmp_path / "bench").iterdir()] == [plot]  # only its figure's


def _dist(p50: float, p99: float | None = None) -> Dist:
    p99 = p50 * 1.5 if p99 is None else p99
    return Dist(n=100, p50=p50, p90=p50, p95=p50, p99=p99, max=p99, min=p50, mean=p50)


def _series(size: int, p50_us: float, durable: bool = True) -> Series:
    return Series(
        label=f"{size:,} effects",
        size_at_start=size,
        size_at_end=size + 100,
        durable=durable,
        net_us=_dist(p50_us),
        total_us=_dist(p50_us),
        target_us=_dist(0.4),
    )


def _gate() -> GateCost:
    """Figure 1, made up: p50 0.9 ms at size 0 on a 0.25 ms commit floor (1.8x the two-commit
    floor), 0.18 ms with ``synchronous=OFF``, 13 WAL pages per new effect."""
    fs = Filesystem(path="/x", fstype="ext4", device="/dev/x", mount_point="/")
    return GateCost(
        directory=".bench/gate",
        filesystem=fs,
        samples=100,
        block=25,
        warmup=50,
        seed=1,
        prefilled=[],
        series=[_series(0, 900.0), _series(10_000, 850.0)],
        nosync=_series(0, 180.0, durable=False),
        floor_sqlite_us=_dist(250.0),
        floor_fsync_us=_dist(150.0),
        statements=StatementCount(
            effects=10, commits=2, begins=2, rollbacks=0, statements=14, inserts=6
        ),
        checkpoint=None,
        profile=Profile(
            effects=10,
            wall_us_per_effect=1_500.0,
            by_own_time=[],
            gate_functions=[],
            by_area=[],
            canonical_json_fn="rfc8785.dumps",
            canonical_json_us=50.0,
            canonical_json_calls=8,
            canonical_pass_gate_us=900.0,
        ),
        seconds=10.0,
        pages=WalPages(
            effects=200, per_effect=13.0, by_table={"entries": 5.0, "effects": 4.0, "x": 4.0}
        ),
    )


def _report(**figures: Any) -> Report:
    machine = Machine(
        cpu_model="AMD EPYC",
        cores=2,
        memory_gib=None,
        kernel="Linux",
        hostname="h",
        python="3.11",
        sqlite="3.40",
        temporalio="1.35",
        temporal_cli="1.9",
    )
    return Report(
        started=datetime(2026, 1, 1, tzinfo=UTC),
        seconds=1.0,
        quick=True,
        command="python -m benchmarks",
        machine=machine,
        code="test",
        gate=figures.pop("gate", None),
        crash=None,
        **figures,
    )


def test_the_targets_are_issue_39s_and_the_ones_they_replaced_are_listed_apart_as_later() -> None:
    # 64 in flight: ungated 400/s; SQLite 350/s (1.14), PostgreSQL 300/s (1.33)
    flow = Throughput(
        n=640,
        rounds=1,
        per_s={"ungated": [400.0], "gated, SQLite": [350.0], PG: [300.0]},
    )
    report = _report(gate=_gate(), throughput=flow)
    current = {t.figure: t for t in report.targets()}
    later = {t.figure: t for t in report.later_targets()}

    def row(rows: dict[str, Target], starts: str) -> tuple[str, bool]:
        (t,) = [t for f, t in rows.items() if f.startswith(starts)]
        return t.target, t.met

    assert row(current, "WAL pages per new effect") == ("≤ 6", False)
    pages = next(t for f, t in current.items() if f.startswith("WAL pages"))
    assert pages.measured == "13.0 (entries 5.0, effects 4.0, x 4.0)"
    assert row(current, "Gate p50 ÷ the two-commit floor") == ("≤ 2.0", True)  # 1.80
    assert row(current, "Gate CPU part") == ("≤ 0.200 ms", True)  # 0.180 ms
    assert row(current, "Throughput with 64 in flight, ungated ÷ gated (SQLite)") == (
        "≤ 1.12",
        False,
    )
    assert row(current, "Throughput with 64 in flight, ungated ÷ gated (PostgreSQL)") == (
        "≤ 1.35",
        True,
    )
    assert not any(f.startswith("Gate cost p50") for f in current)
    # the replaced ones, judged on the same figures
    assert row(later, "Gate cost p50") == ("≤ 1 ms", True)
    assert row(later, "Gate p50 ÷ the two-commit floor") == ("≤ 1.5", False)
    assert row(later, "Gate CPU part") == ("≤ 0.120 ms", False)
    assert row(later, "Throughput with 64 in flight, ungated ÷ gated (SQLite)") == ("≤ 1.08", False)
    assert row(later, "Throughput with 64 in flight, ungated ÷ gated (PostgreSQL)") == (
        "≤ 1.25",
        False,
    )
    assert len(later) == 5
    # in the document: the current table, then the later one under its own heading
    text = markdown(report)
    current_part, later_part = text.split("### Later", 1)
    assert "| WAL pages per new effect" in current_part.split("## 1.")[0]
    assert "≤ 1.08" not in current_part and "| ≤ 1.12 |" in current_part
    assert "| ≤ 1.08 | 1.14 (400/s vs 350/s) | **missed** |" in later_part.split("## 1.")[0]
    assert "| `entries` | 5.00 |" in text and "| **all** | **13.00** |" in text
    # a run without those figures has no later targets, and no heading for them
    assert _report().later_targets() == [] and "### Later" not in markdown(_report())


def _swept() -> Throughput:
    levels = {8: [150.0, 170.0, 160.0], 16: [250.0], 32: [300.0]}
    return Throughput(
        n=640,
        rounds=1,
        per_s={"ungated": [400.0], "gated, SQLite": [350.0], PG: [300.0]},
        sweep_rounds=3,
        sweep_per_s={
            "ungated": {k: [v[0] * 2 for _ in v] for k, v in levels.items()},
            "gated, SQLite": levels,
            PG: {k: [v[0] / 2] for k, v in levels.items()},
        },
    )


def test_the_in_flight_sweep_ends_at_the_rounds_point_and_is_tabled_and_plotted(
    tmp_path: Path,
) -> None:
    t = _swept()
    assert t.in_flight("gated, SQLite") == {
        8: [150.0, 170.0, 160.0],
        16: [250.0],
        32: [300.0],
        64: [350.0],
    }
    assert t.in_flight(JOURNAL_ONLY) == {}
    text = "\n".join(_throughput_section(t, "python -m benchmarks", "bench/plot.svg"))
    assert (
        "| activities in flight | ungated | gated, SQLite | ungated ÷ SQLite | gated, PostgreSQL "
        "| ungated ÷ PostgreSQL |" in text
    )
    # the upper median of 150, 170, 160 is 160; ungated 300 there
    assert "| 8 | 300/s | 160/s | 1.88 | 75/s | 4.00 |" in text
    assert "| 64 | 400/s | 350/s | 1.14 | 300/s | 1.33 |" in text
    assert "3 rounds of the same 640-activity fan-out" in text
    image = (
        "\n\n![Activities per second by activities in flight, ungated and gated (SQLite, "
        "PostgreSQL)](bench/plot.svg)"
    )
    assert "| 64 | 400/s | 350/s | 1.14 | 300/s | 1.33 |" + image in text  # beside its table
    path = plots.throughput_in_flight(t, tmp_path / "flight.svg")
    assert path is not None and _svg_texts(path) >= {"8", "16", "32", "gated, PostgreSQL"}
    # the same figures draw the same bytes (a fixed hash salt, no date)
    again = plots.throughput_in_flight(t, tmp_path / "again.svg")
    assert again is not None and again.read_bytes() == path.read_bytes()
    # no sweep, no plot and no table
    flat = Throughput(n=640, rounds=1, per_s=t.per_s)
    assert plots.throughput_in_flight(flat, tmp_path / "none.svg") is None
    assert "activities in flight |" not in "\n".join(_throughput_section(flat, "x"))


def test_only_the_figures_a_run_measured_are_plotted(tmp_path: Path) -> None:
    drawn = plots.write(_report(gate=_gate(), throughput=_swept()), tmp_path)
    assert set(drawn) == {"gate", "throughput"}
    assert {"gate p50", "gate p99", "10,000"} <= _svg_texts(drawn["gate"])
    assert plots.write(_report(), tmp_path / "none") == {}


def _svg_texts(path: Path) -> set[str]:
    """The texts of an SVG file, which must parse as XML and be an SVG."""
    root = ElementTree.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return {
        line.strip()
        for e in root.iter("{http://www.w3.org/2000/svg}text")
        for line in "".join(e.itertext()).splitlines()
    }
