"""Measure the gate's cost per effect and the crash-to-completion time; print a summary and
write ``docs/benchmarks.md``, with its plots beside it (``docs/benchmarks/*.svg``: ``plots.py``).

    python -m benchmarks            # the full run (make bench), about 23 minutes on 2 cores in all
    python -m benchmarks --quick    # a smoke run, about 2.5 minutes

(Figure 7, load, adds about 7 minutes to the full run and about 1 to the quick one on these
2-core machines: ``--only load`` runs it alone.)

Exits 1 if a crash run ends with the wrong outcome (or cannot run), or if the prefilled
journal does not verify; missed performance targets are reported, and fail the run only with
``--strict``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from . import (
    BENCH_DIR,
    ROOT,
    crash_recovery,
    gate_cost,
    load,
    plots,
    policy_cost,
    throughput,
    verify_cost,
)
from .machine import code_version, machine
from .report import Report, markdown, summary

FULL_SIZES = [0, 10_000, 100_000]
QUICK_SIZES = [0, 10_000]
#: figure 6's counted rounds: with 7, two runs of the same code on this shared machine read
#: 1.14 and 1.19 for a target of 1.15, so the figure could not tell met from missed
THROUGHPUT_ROUNDS = 15
#: figure 6's in-flight sweep (8, 16, 32 in flight, after its rounds, as many activities per
#: run): its counted rounds (the quick run's: 1)
SWEEP_ROUNDS = 5
#: figure 7: the issue's 1,000 workflows; the quick run's fewer, in one counted round
LOAD_WORKFLOWS = 1_000
LOAD_ROUNDS = 5
LOAD_QUICK_WORKFLOWS = 150


def _command(argv: list[str]) -> str:
    return " ".join(["python -m benchmarks", *(shlex.quote(a) for a in argv)])


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


#: the side-by-side measurements of single changes, kept by hand (each names its command): a
#: full run rewrites every figure above them, and keeps them
CHANGES = ROOT / "docs" / "benchmarks-changes.md"


def _changes() -> str:
    return "\n" + CHANGES.read_text(encoding="utf-8") if CHANGES.exists() else ""


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="few samples, sizes 0 and 10,000 only")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the markdown to write (default docs/benchmarks.md; not written with --only "
        "unless given); its plots go to the directory of its name without .md",
    )
    p.add_argument(
        "--only",
        choices=("gate", "crash", "policy", "verify", "throughput", "load"),
        help="run one figure only",
    )
    p.add_argument("--samples", type=int, help="samples per series for figure 1")
    p.add_argument(
        "--block",
        type=int,
        default=25,
        help="consecutive operations per subject in each interleaved round (figure 4)",
    )
    p.add_argument(
        "--gate-block",
        type=int,
        default=gate_cost.GATE_BLOCK,
        help="consecutive operations per subject in each interleaved round (figure 1)",
    )
    p.add_argument("--crash-runs", type=int, help="crash runs for figure 2")
    p.add_argument(
        "--throughput-rounds",
        type=int,
        help=f"counted rounds for figure 6 (default {THROUGHPUT_ROUNDS}; 2 with --quick)",
    )
    p.add_argument(
        "--sweep-rounds",
        type=int,
        help=f"counted rounds of figure 6's in-flight sweep (default {SWEEP_ROUNDS}; 1 with "
        "--quick; 0: no sweep)",
    )
    p.add_argument("--sizes", help="journal sizes for figure 1, comma-separated (must include 0)")
    p.add_argument("--json", type=Path, help="also write every figure as JSON here")
    p.add_argument(
        "--shackle-spec",
        type=Path,
        default=None,
        help="the directory holding SHACKLE's decide.py (its repository's v2/spec; default: "
        f"${policy_cost.SHACKLE_SPEC_ENV}): figure 4 then times it interleaved with ours",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if a current target is missed (a later one never)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep figure 1's journals in .bench/gate (about 1 GB after a full run)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    sizes = (
        [int(s.replace("_", "")) for s in args.sizes.split(",")]
        if args.sizes
        else (QUICK_SIZES if args.quick else FULL_SIZES)
    )
    if 0 not in sizes:
        raise SystemExit("--sizes must include 0 (the ratio is taken against the empty journal)")
    samples = args.samples or (400 if args.quick else 5_000)
    crash_runs = args.crash_runs or (4 if args.quick else 24)
    out: Path | None = args.out
    if out is None and args.only is None:
        out = ROOT / "docs" / "benchmarks.md"

    started = datetime.now(UTC)
    began = time.monotonic()
    host = machine()
    code = code_version(ROOT)
    print(
        f"interlock-temporal benchmarks: {host.cpu_model}, {host.cores} cores, "
        f"Python {host.python}, SQLite {host.sqlite}",
        flush=True,
    )
    gate = None
    crash = None
    if args.only in (None, "gate"):
        gate = gate_cost.run(
            sorted(set(sizes)),
            samples,
            block=args.gate_block,
            profile_n=200 if args.quick else 1_000,
            checkpoint_n=500 if args.quick else 1_500,
            cpu_n=500 if args.quick else 3_000,
        )
        if not args.keep:
            shutil.rmtree(BENCH_DIR / "gate", ignore_errors=True)
    # the pure micro-benchmarks first: the server figures leave runtime threads behind
    policy = None
    if args.only in (None, "policy"):
        policy = policy_cost.run(
            20_000 if args.quick else 200_000,
            500 if args.quick else 5_000,
            block=args.block,
            shackle_spec=policy_cost.shackle_spec_dir(args.shackle_spec),
        )
    if args.only in (None, "crash"):
        crash = crash_recovery.run(crash_runs, sensitivity=not args.quick)
    verify = None
    if args.only in (None, "verify"):
        verify = verify_cost.run(
            100_000 if args.quick else 1_000_000, 10_000 if args.quick else 50_000
        )
        if not args.keep:
            shutil.rmtree(BENCH_DIR / "verify", ignore_errors=True)
    flow = None
    if args.only in (None, "throughput"):
        rounds = args.throughput_rounds or (2 if args.quick else THROUGHPUT_ROUNDS)
        sweep_rounds = (
            args.sweep_rounds
            if args.sweep_rounds is not None
            else (1 if args.quick else SWEEP_ROUNDS)
        )
        flow = throughput.run(320 if args.quick else 640, rounds, sweep_rounds=sweep_rounds)
    loaded = None
    if args.only in (None, "load"):
        loaded = load.run(
            LOAD_QUICK_WORKFLOWS if args.quick else LOAD_WORKFLOWS,
            1 if args.quick else LOAD_ROUNDS,
        )
        if not args.keep:
            shutil.rmtree(BENCH_DIR / "load", ignore_errors=True)
    report = Report(
        started=started,
        seconds=time.monotonic() - began,
        quick=args.quick,
        command=_command(argv),
        machine=host,
        code=code,
        gate=gate,
        crash=crash,
        policy=policy,
        verify=verify,
        throughput=flow,
        load=loaded,
    )
    print(summary(report))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        # the plots beside the markdown, in a directory named as it is (docs/benchmarks/)
        drawn = plots.write(
            report, out.with_suffix("") if out.suffix else out.with_name(f"{out.name}-plots")
        )
        for path in drawn.values():
            print(f"wrote {path}")
        relative = {k: path.relative_to(out.parent).as_posix() for k, path in drawn.items()}
        out.write_text(markdown(report, relative) + _changes())
        print(f"wrote {out}")
    if args.json is not None:
        doc = {
            "started": started.isoformat(),
            "seconds": report.seconds,
            "quick": args.quick,
            "command": report.command,
            "machine": host.as_dict(),
            "code": code,
            "gate": None if gate is None else dataclasses.asdict(gate),
            "crash": None if crash is None else dataclasses.asdict(crash),
            "policy": None if policy is None else dataclasses.asdict(policy),
            "verify": None if verify is None else dataclasses.asdict(verify),
            "throughput": None if flow is None else dataclasses.asdict(flow),
            "load": None if loaded is None else dataclasses.asdict(loaded),
            "targets": [dataclasses.asdict(t) for t in report.targets()],
            "later_targets": [dataclasses.asdict(t) for t in report.later_targets()],
        }
        args.json.write_text(json.dumps(doc, indent=1, default=_jsonable))
        print(f"wrote {args.json}")
    if not report.correct:
        return 1
    if args.strict and not all(t.met for t in report.targets()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
