"""``interlock report``: what happened over a period, from the journal alone."""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

from ..core.report import build_report
from ._args import Groups, examples, journal_options, json_flag, parse_duration
from ._render import render_report
from ._shared import EXIT_OK, emit, emit_json, open_for


def cmd_report(args: argparse.Namespace) -> int:
    since = time.time() - args.since.total_seconds()
    with open_for(args) as journal:
        found = build_report(journal, since)
    if args.json:
        emit_json(found.model_dump(mode="json"))
    else:
        emit(render_report(found))
    return EXIT_OK


def register(groups: Groups) -> None:
    report_cmd = groups.add_parser(
        "report",
        help="what happened lately: effects by final state, what waits for a person, denials "
        "by reason, the gate's latency",
        description="What happened over a period, from the journal alone.",
        epilog=examples("interlock report", "interlock report --since 7d --json"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    journal_options(report_cmd, top=False)
    report_cmd.set_defaults(handler=cmd_report)
    report_cmd.add_argument(
        "--since",
        type=parse_duration,
        default=timedelta(hours=24),
        metavar="AGE",
        help="how far back, with a unit: 90s, 30m, 24h, 7d (default 24h)",
    )
    json_flag(report_cmd)
