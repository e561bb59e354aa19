"""The parser, made of each noun's subcommands, and ``main``: an exit code, never a traceback."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sqlite3
import sys
from collections.abc import Sequence

from ..core.errors import InterlockError, JournalConfigError, JournalCorrupt, JournalUnavailable
from ..core.extras import DISTRIBUTION
from . import circuit, doctor, effects, journal, leases, operators, reconcile, report, reviews
from ._args import Parser, journal_options
from ._shared import (
    EPILOG,
    EXIT_FAILED,
    EXIT_JOURNAL,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    Handler,
    journal_url,
    warn,
)

#: the nouns, in the order ``interlock --help`` lists them
NOUNS = (journal, effects, leases, report, circuit, reviews, operators, reconcile, doctor)


def version() -> str:
    """The installed distribution's version (``unknown`` when run from a tree never installed)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="interlock",
        description="Inspect and verify an interlock journal, manage leases, decide reviews "
        "and run the reconciler on Temporal.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version()}", help="print the version"
    )
    journal_options(parser, top=True)
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)
    for noun in NOUNS:
        noun.register(groups)
    return parser


def _exit_code(code: object) -> int:
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return its exit code (never raises for an expected failure)."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as stop:  # --help, or a usage error argparse already reported
        return _exit_code(stop.code)
    handler: Handler = args.handler
    try:
        return handler(args)
    except CliError as err:
        warn(err.message)
        return err.code
    except (JournalConfigError, JournalCorrupt, JournalUnavailable) as err:
        warn(str(err) or type(err).__name__)
        return EXIT_JOURNAL
    except sqlite3.Error as err:
        warn(f"journal {journal_url(args)} cannot be read: {err}")
        return EXIT_JOURNAL
    except BrokenPipeError:
        # the reader went away (`interlock effects list | head`): not an error of ours
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except InterlockError as err:
        warn(str(err) or type(err).__name__)
        return EXIT_FAILED
    except Exception as err:
        if os.environ.get("INTERLOCK_DEBUG"):
            raise
        warn(f"unexpected error: {type(err).__name__}: {err} (set INTERLOCK_DEBUG=1 for details)")
        return EXIT_FAILED
