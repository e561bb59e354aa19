"""``interlock``: the operator's view of a journal.

    interlock [--journal URL] [--signing-key KEY] journal verify [--head SEQ:HASH] [--json]
    interlock journal head [--json]
    interlock effects list [--state KIND | --in-doubt] [--older-than AGE] [--limit N] [--json]
    interlock effects show EFFECT_ID [--json]
    interlock leases issue PRINCIPAL [--activity A]... [--max-amount-cents N] [--resource R]...
                                     [--ttl 1h|30m|90s]
    interlock leases revoke LEASE_ID
    interlock leases list [--json]

Exit codes: 0 ok; 1 a check failed or there was nothing to do; 2 usage error or not found;
3 the journal cannot be opened. Errors are one line on stderr, never a traceback (set
``INTERLOCK_DEBUG=1`` to see one for an unexpected error).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NoReturn

from ._render import lease_state, render_effects, render_entries, render_leases, render_receipt
from ._render import render_verify as _render_verify
from .core.errors import InterlockError, JournalConfigError, JournalCorrupt, JournalUnavailable
from .core.journal import Journal, open_journal
from .core.models import ANNOTATIONS, JournalHead, Kind
from .core.receipts import receipt

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_JOURNAL = 3

DEFAULT_JOURNAL = "sqlite:///interlock.db"
#: the shortest effect id prefix ``effects show`` accepts
MIN_PREFIX = 8

_EPILOG = """\
exit codes: 0 ok; 1 a check failed or nothing to do; 2 usage error or not found;
3 the journal cannot be opened.
The journal defaults to $INTERLOCK_JOURNAL, else sqlite:///interlock.db. The signing key comes
from --signing-key, else $INTERLOCK_SIGNING_KEY, else the key file beside the SQLite database
(<database>.key).
"""


class CliError(Exception):
    """A failure the command reports as one line on stderr, with its exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# -- argument types -------------------------------------------------------------------------

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_STATES = [k.value for k in Kind if k not in ANNOTATIONS]


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30m``, ``1h``, ``2d``, combinations (``1h30m``) or plain seconds; positive."""
    value = text.strip().lower()
    if value.isdigit():
        duration = timedelta(seconds=int(value))
    else:
        match = _DURATION.fullmatch(value)
        if not value or match is None:
            raise argparse.ArgumentTypeError(
                f"invalid duration {text!r}: use e.g. 90s, 30m, 1h, 2d or 1h30m"
            )
        days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
        duration = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if duration <= timedelta(0):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be positive")
    return duration


def _head(text: str) -> JournalHead:
    try:
        return JournalHead.parse(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid head {text!r}: use SEQ:HASH as printed by `interlock journal head`"
        ) from None


def _state(text: str) -> Kind:
    value = text.strip().upper().replace("-", "_")
    if value not in _STATES:
        raise argparse.ArgumentTypeError(
            f"invalid state {text!r}: choose from {', '.join(_STATES)}"
        )
    return Kind(value)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: must not be negative")
    return value


def _positive(text: str) -> int:
    value = _count(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: must be at least 1")
    return value


# -- opening the journal ----------------------------------------------------------------------


def journal_url(args: argparse.Namespace) -> str:
    """``--journal``, else ``$INTERLOCK_JOURNAL``, else ``sqlite:///interlock.db``."""
    given: str | None = getattr(args, "journal", None)
    return given or os.environ.get("INTERLOCK_JOURNAL") or DEFAULT_JOURNAL


def _open(args: argparse.Namespace, *, create: bool, check_tail: bool = True) -> Journal:
    url = journal_url(args)
    try:
        return open_journal(
            url, signing_key=args.signing_key or None, create=create, check_tail=check_tail
        )
    except (OSError, sqlite3.Error) as err:
        raise CliError(EXIT_JOURNAL, f"journal {url} cannot be opened: {err}") from None


def open_for(args: argparse.Namespace, *, create: bool = False) -> Journal:
    """Open the journal the arguments name. Unless ``create``, a SQLite journal must already
    exist, with its key: reading commands never create a database or a new signing key."""
    return _open(args, create=create)


def open_for_verify(args: argparse.Namespace) -> Journal:
    """Open the journal even when its last entry is unusable: verify reports what is wrong."""
    return _open(args, create=False, check_tail=False)


# -- output ---------------------------------------------------------------------------------


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(f"interlock: {text}\n")


def _json(value: Any) -> None:
    _out(json.dumps(value, indent=2, sort_keys=False, ensure_ascii=False))


# -- journal ---------------------------------------------------------------------------------


def cmd_journal_verify(args: argparse.Namespace) -> int:
    with open_for_verify(args) as journal:
        report = journal.verify(args.head)
        if args.json:
            _json(report.model_dump(mode="json"))
        else:
            _out(_render_verify(report, journal=journal.url))
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_journal_head(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        head = journal.head()
        if head is None:
            _err(f"journal {journal.url} is empty: it has no head yet")
            return EXIT_FAILED
        if args.json:
            _json(head.model_dump(mode="json"))
        else:
            _out(str(head))
    return EXIT_OK


# -- effects ---------------------------------------------------------------------------------


def _dispatches(journal: Journal, effect_id: str) -> int:
    return sum(1 for e in journal.read(effect_id) if e.kind is Kind.DISPATCHED)


def cmd_effects_list(args: argparse.Namespace) -> int:
    older_than = None if args.older_than is None else args.older_than.total_seconds()
    limit: int | None = args.limit
    with open_for(args) as journal:
        rows = journal.effects(
            status=args.state,
            in_doubt=args.in_doubt,
            older_than=older_than,
            limit=None if limit is None else limit + 1,
        )
        more = limit is not None and len(rows) > limit
        rows = rows[:limit] if limit is not None else rows
        counts = {row.effect_id: _dispatches(journal, row.effect_id) for row in rows}
    if args.json:
        _json(
            [{**row.model_dump(mode="json"), "dispatches": counts[row.effect_id]} for row in rows]
        )
    elif rows:
        _out(render_effects(rows, counts))
    else:
        _err("no effects match")
    if more:
        _err(f"showing the newest {limit}; raise --limit to see more")
    return EXIT_OK


def resolve_effect(journal: Journal, text: str) -> str:
    """The effect id ``text`` names: a full id, or a unique prefix of at least 8 characters."""
    wanted = text.strip()
    if not wanted:
        raise CliError(EXIT_USAGE, "an effect id is required")
    if journal.row(wanted) is not None:
        return wanted
    if journal.row(wanted.lower()) is not None:
        return wanted.lower()
    if len(wanted) < MIN_PREFIX:
        raise CliError(
            EXIT_USAGE,
            f"no effect {wanted} (a prefix needs at least {MIN_PREFIX} characters)",
        )
    prefixes = {wanted, wanted.lower()}
    matches = sorted(
        row.effect_id
        for row in journal.effects()
        if any(row.effect_id.startswith(p) for p in prefixes)
    )
    if not matches:
        raise CliError(EXIT_USAGE, f"no effect {wanted} in {journal.url}")
    if len(matches) > 1:
        shown = ", ".join(m[:20] for m in matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise CliError(
            EXIT_USAGE,
            f"effect prefix {wanted} is ambiguous: {len(matches)} effects match ({shown})",
        )
    return matches[0]


def cmd_effects_show(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        effect_id = resolve_effect(journal, args.effect_id)
        entries = journal.read(effect_id)
        try:
            found = receipt(effect_id, journal=journal)
        except KeyError:
            raise CliError(EXIT_USAGE, f"effect {effect_id} has no journal entries") from None
    if args.json:
        _out(found.model_dump_json(indent=2))
    else:
        _out(render_receipt(found))
        _out("")
        _out(render_entries(entries))
    return EXIT_OK


# -- leases ----------------------------------------------------------------------------------


def cmd_leases_issue(args: argparse.Namespace) -> int:
    with open_for(args, create=True) as journal:
        try:
            lease_id = journal.leases.issue(
                args.principal,
                activities=args.activity,
                max_amount_cents=args.max_amount_cents,
                resources=args.resource,
                ttl=args.ttl,
            )
        except ValueError as err:
            raise CliError(EXIT_USAGE, f"cannot issue the lease: {err}") from None
    _out(lease_id)
    return EXIT_OK


def cmd_leases_revoke(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        lease = journal.leases.get(args.lease_id)
        if lease is None:
            raise CliError(EXIT_USAGE, f"no lease {args.lease_id} in {journal.url}")
        state = lease_state(lease, time.time())
        if state != "live":
            _err(f"lease {args.lease_id} was not live ({state}): nothing revoked")
            return EXIT_FAILED
        if not journal.leases.revoke(args.lease_id):
            _err(f"lease {args.lease_id} was revoked meanwhile: nothing revoked")
            return EXIT_FAILED
    _out(f"revoked {args.lease_id}")
    return EXIT_OK


def cmd_leases_list(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        leases = journal.leases.list()
    now = time.time()
    if args.json:
        _json(
            [
                {**lease.model_dump(mode="json"), "state": lease_state(lease, now)}
                for lease in leases
            ]
        )
    elif leases:
        _out(render_leases(leases, now))
    else:
        _err("no leases")
    return EXIT_OK


# -- the parser ------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors print the usage and one line, and exit 2 (argparse's own convention)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"interlock: error: {message}\n")


def _journal_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
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


Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="interlock",
        description="Inspect and verify an interlock journal, and manage leases.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _journal_options(parser, top=True)
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)

    def command(sub: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        cmd: argparse.ArgumentParser = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _journal_options(cmd, top=False)
        cmd.set_defaults(handler=handler)
        return cmd

    def json_flag(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--json", action="store_true", help="print JSON for machines")

    # journal
    journal = groups.add_parser("journal", help="verify the journal, print its head")
    _journal_options(journal, top=False)
    journal_sub = journal.add_subparsers(dest="command", metavar="COMMAND", required=True)
    verify = command(
        journal_sub,
        "verify",
        cmd_journal_verify,
        "check every entry's hash, signature and place in its chain; exit 1 if any fails",
    )
    verify.add_argument(
        "--head",
        type=_head,
        metavar="SEQ:HASH",
        help="a head recorded earlier (`interlock journal head`): also detects a cut tail",
    )
    json_flag(verify)
    head = command(
        journal_sub,
        "head",
        cmd_journal_head,
        "print the last entry as SEQ:HASH, to record elsewhere",
    )
    json_flag(head)

    # effects
    effects = groups.add_parser("effects", help="list effects, show one effect's receipt")
    _journal_options(effects, top=False)
    effects_sub = effects.add_subparsers(dest="command", metavar="COMMAND", required=True)
    listing = command(effects_sub, "list", cmd_effects_list, "list effects, newest first")
    which = listing.add_mutually_exclusive_group()
    which.add_argument(
        "--state",
        type=_state,
        metavar="KIND",
        help=f"only effects in this state ({', '.join(_STATES)})",
    )
    which.add_argument(
        "--in-doubt",
        action="store_true",
        help="only effects dispatched and never confirmed",
    )
    listing.add_argument(
        "--older-than",
        type=parse_duration,
        metavar="AGE",
        help="only effects not updated for this long (e.g. 5m)",
    )
    listing.add_argument("--limit", type=_positive, metavar="N", help="at most N effects")
    json_flag(listing)
    show = command(
        effects_sub,
        "show",
        cmd_effects_show,
        "show an effect's receipt and its journal entries",
    )
    show.add_argument(
        "effect_id",
        metavar="EFFECT_ID",
        help=f"the effect id, or a unique prefix of at least {MIN_PREFIX} characters",
    )
    json_flag(show)

    # leases
    leases = groups.add_parser("leases", help="issue, revoke and list leases")
    _journal_options(leases, top=False)
    leases_sub = leases.add_subparsers(dest="command", metavar="COMMAND", required=True)
    issue = command(
        leases_sub, "issue", cmd_leases_issue, "issue a lease to a principal; print its id"
    )
    issue.add_argument("principal", metavar="PRINCIPAL", help="who may act under the lease")
    issue.add_argument(
        "--activity",
        action="append",
        metavar="A",
        help="an activity (or glob) the lease allows; repeat for more (default: any)",
    )
    issue.add_argument(
        "--max-amount-cents",
        type=_count,
        metavar="N",
        help="the largest amount one effect may carry",
    )
    issue.add_argument(
        "--resource",
        action="append",
        metavar="R",
        help="a resource (or glob) the lease allows; repeat for more (default: any)",
    )
    issue.add_argument(
        "--ttl",
        type=parse_duration,
        metavar="AGE",
        help="how long the lease lives: 90s, 30m, 1h, 2d (default: until revoked)",
    )
    revoke = command(
        leases_sub,
        "revoke",
        cmd_leases_revoke,
        "revoke a live lease now; exit 1 if it was not live",
    )
    revoke.add_argument("lease_id", metavar="LEASE_ID")
    lease_list = command(leases_sub, "list", cmd_leases_list, "list leases and their state")
    json_flag(lease_list)
    return parser


# -- main ------------------------------------------------------------------------------------


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
        _err(err.message)
        return err.code
    except (JournalConfigError, JournalCorrupt, JournalUnavailable) as err:
        _err(str(err) or type(err).__name__)
        return EXIT_JOURNAL
    except sqlite3.Error as err:
        _err(f"journal {journal_url(args)} cannot be read: {err}")
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
        _err(str(err) or type(err).__name__)
        return EXIT_FAILED
    except Exception as err:
        if os.environ.get("INTERLOCK_DEBUG"):
            raise
        _err(f"unexpected error: {type(err).__name__}: {err} (set INTERLOCK_DEBUG=1 for details)")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
