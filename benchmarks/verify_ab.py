"""A/B of ``journal verify``: the verifying module of a git revision against the working tree's,
on the same journal file, in one process, in alternating rounds (the order flips each round).

    python -m benchmarks.verify_ab JOURNAL.db --base HEAD~1 --rounds 4
    python -m benchmarks.verify_ab ED.db --base HEAD~1 --public-key ed25519-public:...

The journal is a SQLite file such as figure 5 builds (``.bench/verify/hmac.db`` after
``python -m benchmarks --only verify``); its HMAC key is figure 5's unless ``--public-key``
names an Ed25519 key. Each run opens the journal afresh and times ``Journal.verify()``: wall
time and this process's CPU time. Only ``verifying.py`` is taken from the base revision.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from types import ModuleType

from interlock_temporal.core.journal import interface, open_journal
from interlock_temporal.core.journal import verifying as current

from . import ROOT
from .verify_cost import HMAC_KEY

MODULE = "interlock_temporal/core/journal/verifying.py"


def base_module(revision: str, directory: Path) -> ModuleType:
    """``verifying.py`` as it was at ``revision``, loaded beside the package's own modules."""
    source = subprocess.run(
        ["git", "show", f"{revision}:{MODULE}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = directory / "verifying_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(
        "interlock_temporal.core.journal.verifying_base", path
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("journal", type=Path)
    parser.add_argument("--base", default="HEAD", help="the git revision to compare against")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--public-key", help="an Ed25519 public key (else figure 5's HMAC key)")
    args = parser.parse_args()
    keys = {"public_keys": [args.public_key]} if args.public_key else {"signing_key": HMAC_KEY}
    with tempfile.TemporaryDirectory() as directory:
        versions = {args.base: base_module(args.base, Path(directory)), "working tree": current}
        wall: dict[str, list[float]] = {name: [] for name in versions}
        cpu: dict[str, list[float]] = {name: [] for name in versions}
        entries = 0
        names = vars(interface)
        original = names["verify_stored"]
        try:
            for round_ in range(args.rounds):
                order = list(versions.items())
                for name, module in order if round_ % 2 == 0 else order[::-1]:
                    names["verify_stored"] = module.verify_stored
                    url = f"sqlite:///{args.journal}"
                    journal = open_journal(url, create=False, check_tail=False, **keys)
                    started, used = time.perf_counter(), time.process_time()
                    report = journal.verify()
                    wall[name].append(time.perf_counter() - started)
                    cpu[name].append(time.process_time() - used)
                    journal.close()
                    if not report.ok:
                        raise SystemExit(f"{name}: the journal does not verify: {report}")
                    entries = report.entries
        finally:
            names["verify_stored"] = original
    for name in versions:
        runs = ", ".join(f"{s:.2f}" for s in wall[name])
        median = statistics.median(wall[name])
        print(
            f"{name}: {runs} s; median {entries / median:,.0f} entries/s; "
            f"CPU {statistics.median(cpu[name]):.2f} s"
        )
    base, new = (statistics.median(wall[name]) for name in versions)
    print(f"working tree / {args.base}, entries per second (medians): {base / new:.3f}")


if __name__ == "__main__":
    main()
