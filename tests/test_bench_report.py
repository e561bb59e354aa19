"""The throughput figure's text is computed from its own numbers: ratios of medians, the
per-round ratios beside them, and the CPU reading."""

from __future__ import annotations

from benchmarks.report import _throughput_section
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
