"""Argument types and the parser's pieces: usage errors exit 2, with one line."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, NoReturn, TypeAlias

from ._shared import DEFAULT_ADDRESS, DEFAULT_NAMESPACE, EXIT_USAGE, SEE_TOP, Handler

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
#: what ``add_subparsers()`` returns, where each noun's ``register`` adds its parser (argparse
#: names no public type for it)
Groups: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # private: no public
#: what a duration's number may be followed by
UNITS = "s (seconds), m (minutes), h (hours) or d (days)"


def _duration(text: str) -> timedelta:
    """A number with a unit, or several (``1h30m``); zero allowed. A bare number is refused:
    ``1`` could mean a second or an hour, and a lease given a second by mistake is useless."""
    value = text.strip().lower()
    if value.isdigit():
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: give a unit, {UNITS}: e.g. {value}s, {value}m or {value}h"
        )
    match = _DURATION.fullmatch(value)
    if not value or match is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number and a unit, {UNITS}: e.g. 90s, 30m, "
            "1h, 2d or 1h30m"
        )
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30m``, ``1h``, ``2d`` or combinations (``1h30m``); positive. A number needs
    its unit: a bare ``1`` is refused, not taken as one second."""
    duration = _duration(text)
    if duration <= timedelta(0):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be positive")
    return duration


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: must not be negative")
    return value


def positive(text: str) -> int:
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: must be at least 1")
    return value


def parse_age(text: str) -> timedelta:
    """Like ``parse_duration``, and zero is allowed (``0s``: no minimum age)."""
    return _duration(text)


def operator_name(text: str) -> str:
    """Who decides (``--operator``): a name, not blank."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name the person (it is recorded in the journal)")
    return text


# -- the parser ------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """Usage errors print the usage and one line, and exit 2 (argparse's own convention)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"interlock: error: {message}\n")


def temporal_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # like the journal options: accepted on the group and on the subcommand
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        default=default,
        help=f"the Temporal frontend (default: $TEMPORAL_ADDRESS, else {DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "--namespace",
        metavar="NS",
        default=default,
        help=f"the Temporal namespace (default: $TEMPORAL_NAMESPACE, else {DEFAULT_NAMESPACE})",
    )
    codec_option(parser, top=top)


def codec_option(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``--codec module:attr``: the workers' PayloadCodec (an instance or a factory), to decode
    journal values and review payloads it encoded; without it they show as encrypted."""
    parser.add_argument(
        "--codec",
        metavar="MODULE:ATTR",
        default=None if top else argparse.SUPPRESS,
        help="the payload codec the workers' client uses (a PayloadCodec or a factory of one), "
        'to decode the values it encoded (without it they show as "encrypted")',
    )


def journal_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # on subcommands the options default to SUPPRESS, so `interlock journal verify --journal X`
    # and `interlock --journal X journal verify` both work and neither resets the other
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--journal",
        metavar="URL",
        default=default,
        help="the journal (default: $INTERLOCK_JOURNAL, else sqlite:///interlock.db)",
    )
    parser.add_argument(
        "--signing-key",
        metavar="KEY",
        default=default,
        help="the journal's signing key, hex or text (prefer $INTERLOCK_SIGNING_KEY: "
        "arguments are visible to other users in the process list)",
    )


def examples(*lines: str) -> str:
    """A subcommand's epilog: a few command lines to copy, and where the rest is said once."""
    shown = "\n".join(f"  {line}" for line in lines)
    return f"examples:\n{shown}\n\n{SEE_TOP}\n"


def command(
    sub: Any, name: str, handler: Handler, help_text: str, *, example: Sequence[str]
) -> argparse.ArgumentParser:
    """A subcommand that takes the journal options, runs ``handler`` and shows ``example``
    (one to three command lines)."""
    cmd: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=examples(*example),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    journal_options(cmd, top=False)
    cmd.set_defaults(handler=handler)
    return cmd


def json_flag(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--json", action="store_true", help="print JSON for machines")
