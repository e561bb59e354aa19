"""The measurements behind ``docs/scaling.md``: figure 7's load, ungated and gated with the
journal in one PostgreSQL, on 1, 2 and 4 worker processes; statements, transactions and rows
per effect; CPU per workflow by part.

    python -m benchmarks.scaling [WORKFLOWS [ROUNDS [PROCESSES,...]]]   # default 500 1 1,2,4
"""

from __future__ import annotations

import sys

from .load import POSTGRES, UNGATED, Load, run


def _line(load: Load) -> list[str]:
    out = []
    for name in (UNGATED, POSTGRES):
        cpu = load.cpu_ms[name]
        out.append(
            f"| {load.processes} | {name} | {load.median(name):,.0f} | {load.ratio(name):.2f} | "
            f"{cpu['workers']:.2f} | {cpu['temporal']:.2f} | {cpu['postgres']:.2f} | "
            f"{cpu['client']:.2f} |"
        )
    return out


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 500
    rounds = int(argv[1]) if len(argv) > 1 else 1
    counts = [int(p) for p in argv[2].split(",")] if len(argv) > 2 else [1, 2, 4]
    rows = []
    last = None
    for processes in counts:
        last = run(n, rounds, processes, [UNGATED, POSTGRES])
        rows += _line(last)
        print("\n".join(rows[-2:]), flush=True)
    print(
        "\n| worker processes | configuration | workflows/s | ÷ ungated | CPU ms per workflow: "
        "workers | Temporal server | PostgreSQL | client |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if last is not None:
        print("\nper effect (last run):", {k: round(v, 2) for k, v in last.pg_per_effect.items()})
        for text, calls in sorted(last.pg_statements.items(), key=lambda kv: -kv[1]):
            print(f"  {calls:6.2f}  {text}")


if __name__ == "__main__":
    main(sys.argv[1:])
