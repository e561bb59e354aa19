"""What the control plane's check adds to ``journal verify``: a journal of ``--effects`` effects
under one budgeted lease (figure 1's calls, ``synchronous=OFF``), then ``Journal.verify()``
(entries, then the rows the gate reads to allow something, derived again) against
``verify_stored`` alone (the entries only), alternating, best of ``--rounds``.

    python -m benchmarks.control_verify --effects 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from interlock_temporal.core.journal.verifying import verify_stored

from . import gate_cost


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.control_verify")
    p.add_argument("--effects", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        journal = gate_cost.open_bench_journal(Path(tmp) / "j.db", durable=False)
        asyncio.run(gate_cost.fill(journal, 0, args.effects))
        best: dict[str, float] = {}
        entries = 0
        for _ in range(args.rounds):
            for name in ("entries only", "with the control plane"):
                began = time.perf_counter()
                if name == "entries only":
                    report = verify_stored(
                        journal.iter_raw_batches(),
                        journal.keyring,
                        None,
                        journal.row_values(),
                        journal.anchor_entries(),
                    )
                else:
                    report = journal.verify()
                elapsed = time.perf_counter() - began
                assert report.ok, report
                entries = report.entries
                best[name] = min(best.get(name, elapsed), elapsed)
        journal.close()
    for name, seconds in best.items():
        print(f"{name:24s} {seconds:7.3f} s  {entries / seconds:10,.0f} entries/s")
    ratio = best["entries only"] / best["with the control plane"]
    print(f"with ÷ without (speed): {ratio:.2f}")


if __name__ == "__main__":
    main()
