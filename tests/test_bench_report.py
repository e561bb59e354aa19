"""The throughput figure's text is computed from its own numbers: ratios of medians, the
per-round ratios beside them, and the CPU reading; the policy figure's targets say met or
missed, and whether SHACKLE's decide() was measured beside ours."""

from __future__ import annotations

from benchmarks.policy_cost import PolicyCost
from benchmarks.report import _decide_targets, _policy_section, _throughput_section
from benchmarks.stats import Dist
from benchmarks.throughput import JOURNAL_ONLY, NO_DELAY, PLUGIN_ONLY, Throughput


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
